"""Mamba-2's state-space scan (SSD), the token mixer of models/mamba2.py (Granite 4.0-H).

Per head h with state S (head_dim x state), step dt_t > 0, decay exp(dt_t A_h) (A_h < 0), input x_t and
the group's B_t, C_t:
    S_t = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T,     y_t = S_t C_t + D_h x_t.

Two forms, one calling convention: (x (b, s, h, p), dt (b, s, h), A (h,), B, C (b, s, h, n) already
repeated to the heads, D (h,) or None, initial_state (b, h, p, n) or None) -> (y (b, s, h, p), final state
(b, h, p, n)), all in fp32:
- chunk: the whole sequence in chunks of `chunk` tokens (training forward, prompt prefill): within a chunk
  the quadratic (attention-like) form, across chunks the recurrence on the chunk-boundary states, as in
  the Mamba-2 paper's minimal SSD and transformers' torch path. Autograd differentiates it.
- step: one token (decode).

On CUDA with `mamba_ssm` installed the chunk form is its Triton kernel (`mamba_chunk_scan_combined`, the
same arguments with B / C per group); everywhere else (CPU, NPU) the torch code below.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """(..., T) -> (..., T, T): out[i, j] = a[j+1] + ... + a[i] for j <= i, -inf above the diagonal."""
    t = a.shape[-1]
    a = a[..., None].expand(*a.shape, t)
    below = torch.tril(torch.ones(t, t, dtype=torch.bool, device=a.device), diagonal=-1)
    s = torch.cumsum(a.masked_fill(~below, 0), dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool, device=a.device)), -torch.inf)


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk: int,
               D: Optional[torch.Tensor] = None, initial_state: Optional[torch.Tensor] = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    b, s, h, p = x.shape
    pad = (-s) % chunk
    skip = x * D[:, None] if D is not None else None
    xdt = x * dt[..., None]
    a = dt * A  # (b, s, h) log-decays
    if pad:
        xdt, a, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (xdt, a, B, C))
    c = (s + pad) // chunk
    xdt, B, C = (t.reshape(b, c, chunk, h, -1) for t in (xdt, B, C))
    a = a.reshape(b, c, chunk, h).permute(0, 3, 1, 2)  # (b, h, c, l)
    cum = torch.cumsum(a, dim=-1)
    # within each chunk: y_l = sum_{s <= l} (C_l . B_s) exp(a_{s+1} + ... + a_l) xdt_s
    decay = torch.exp(_segsum(a))  # (b, h, c, l, s)
    scores = torch.einsum("bclhn,bcshn->bhcls", C, B) * decay
    y = torch.einsum("bhcls,bcshp->bclhp", scores, xdt)
    # each chunk's own contribution to the state at its end
    to_end = torch.exp(cum[..., -1:] - cum)  # (b, h, c, l)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, to_end, xdt)
    first = initial_state[:, None] if initial_state is not None else torch.zeros_like(states[:, :1])
    states = torch.cat([first.to(states.dtype), states], dim=1)  # (b, c + 1, h, p, n)
    across = torch.exp(_segsum(F.pad(cum[..., -1], (1, 0))))  # (b, h, c + 1, c + 1)
    states = torch.einsum("bhzc,bchpn->bzhpn", across, states)
    start, final = states[:, :-1], states[:, -1]
    # the state at each chunk's start, carried to each of its positions
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", C, start, torch.exp(cum))
    y = y.reshape(b, c * chunk, h, p)[:, :s]
    return (y + skip if skip is not None else y), final


def step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
         D: Optional[torch.Tensor], state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: x (b, 1, h, p), dt (b, 1, h), B / C (b, 1, h, n), state (b, h, p, n)."""
    x0, dt0, B0, C0 = x[:, 0], dt[:, 0], B[:, 0], C[:, 0]
    state = state * torch.exp(dt0 * A)[..., None, None] + (x0 * dt0[..., None])[..., None] * B0[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", state, C0)
    if D is not None:
        y = y + x0 * D[:, None]
    return y[:, None], state


class SSDKernels(NamedTuple):
    chunk: Callable
    step: Callable
    source: str  # "mamba_ssm" or "torch"


def _mamba_ssm_chunk(fn: Callable) -> Callable:
    def chunk(x, dt, A, B, C, chunk, D=None, initial_state=None):
        return fn(x, dt, A, B, C, chunk, D=D, initial_states=initial_state, return_final_states=True)
    return chunk


@functools.lru_cache(maxsize=None)
def kernels(device_type: str) -> SSDKernels:
    """The kernels for tensors on `device_type` ("cpu", "cuda", "npu"), resolved once per device type."""
    if device_type == "cuda":
        try:
            from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
            return SSDKernels(_mamba_ssm_chunk(mamba_chunk_scan_combined), step, "mamba_ssm")
        except ImportError:
            pass
    return SSDKernels(chunk_scan, step, "torch")
