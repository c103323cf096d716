"""Gated DeltaNet: the linear-attention mixer of Qwen3-Next and Qwen3.5 (three of every four layers),
as a megatron module in the self-attention slot of a TransformerLayer, split over TP by heads.

Per token x (hidden) the mixer projects q, k (key_heads x key_head_dim), v and the output gate z
(value_heads x value_head_dim), and two scalars per value head, b and a. q, k, v go through a causal
depthwise conv1d (kernel conv_kernel, no bias) and SiLU; q and k are L2-normalised; beta = sigmoid(b)
and the decay g = -exp(A_log) * softplus(a + dt_bias). Each value head keeps a (key_head_dim x
value_head_dim) state S, decayed and corrected once per token by the delta rule
    S <- exp(g) S + k beta (v - exp(g) S^T k)^T,   out = S^T q / sqrt(key_head_dim),
computed chunk-wise (platform/delta_rule.py). A value head reads key head h // (value_heads /
key_heads). The output is RMSNorm(out) * weight * SiLU(z) per value head, then out_proj.

Tensor parallelism: rank r holds key heads r*G/TP .. (r+1)*G/TP - 1 and their value heads (TP divides
the key heads), so nothing is communicated inside the mixer. `in_proj` is column-parallel and grouped
by key head (models/delta_layout.py: per key head [q | k | v | z | b | a] of it and its value heads), so
a TP shard is whole key heads; the conv1d's channels (per key head [q | k | v]), A_log and dt_bias are
split the same way; `out_proj` is row-parallel. The gated norm's weight (value_head_dim) is whole on
every rank and normalises different heads on each: its gradient is summed over TP (an identity forward
whose backward all-reduces), so every rank holds the full gradient, as for any replicated weight.

Padding: the training forward passes megatron's (B, 1, S, S) mask. Padded tokens' projections are
zeroed (as HF zeroes their hidden states; the projections have no bias), so with left padding the
real tokens see a zero conv history and a zero state: the same as the unpadded sequence. Right
padding comes after the real tokens and cannot reach them.

Incremental use (generation): `forward(..., delta_state=DeltaState)` starts from the state's conv
history (the last conv_kernel - 1 pre-conv q/k/v inputs) and recurrent state and leaves the new ones in
it; one-token steps use the recurrent kernel, longer ones the chunked one.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch
import torch.nn.functional as F

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes  # noqa: E402
from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec, build_module  # noqa: E402

from mindspeed_rl.models.delta_layout import DeltaNetShape  # noqa: E402,F401 (re-exported)
from mindspeed_rl.platform.delta_rule import kernels  # noqa: E402


@dataclasses.dataclass
class DeltaState:
    """One layer's generation state for a batch: conv (B, local q|k|v channels, conv_kernel - 1), the
    pre-conv inputs of the last tokens, and recurrent (B, local value heads, key_head_dim,
    value_head_dim) in fp32. None before the first call."""
    conv: Optional[torch.Tensor] = None
    recurrent: Optional[torch.Tensor] = None

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (finished sequences leave the batch)."""
        self.conv = None if self.conv is None else self.conv[rows]
        self.recurrent = None if self.recurrent is None else self.recurrent[rows]


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                state: Optional[DeltaState]) -> torch.Tensor:
    """Causal depthwise conv (+ bias) on x (B, channels, S), weight (channels, 1, kernel); with a state, from its
    conv history (the last kernel - 1 inputs), which it updates. LFM2's short convolution (models/short_conv.py)."""
    seq, history = x.shape[-1], weight.shape[-1] - 1
    if state is None:
        return F.conv1d(x, weight, bias, padding=history, groups=x.shape[1])[..., :seq]
    if state.conv is None:
        state.conv = x.new_zeros(x.shape[0], x.shape[1], history)
    full = torch.cat([state.conv.to(x.dtype), x], dim=-1)
    state.conv = full[..., -history:].detach().clone() if history else full[..., :0]
    return F.conv1d(full, weight, bias, groups=x.shape[1])


def causal_conv_silu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     state: Optional[DeltaState]) -> torch.Tensor:
    """causal_conv, then SiLU: Gated DeltaNet's and Mamba-2's."""
    return F.silu(causal_conv(x, weight, bias, state))


class GatedRMSNorm(torch.nn.Module):
    """RMSNorm(x) * weight * SiLU(gate) over the last dim (value_head_dim), x normalised in fp32 and
    cast back before the weight (HF's Qwen3_5RMSNormGated / Qwen3NextRMSNormGated)."""

    def __init__(self, size: int, eps: float, tp: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps, self.tp = eps, tp

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = copy_to_tensor_model_parallel_region(self.weight) if self.tp > 1 else self.weight
        return (weight * h.to(dtype) * F.silu(gate.float())).to(dtype)


@dataclasses.dataclass
class GatedDeltaNetSubmodules:
    in_proj: Any = ColumnParallelLinear
    out_proj: Any = RowParallelLinear


def token_keep(attention_mask: Optional[torch.Tensor], batch: int, seq: int) -> Optional[torch.Tensor]:
    """(B, S) True on real tokens from megatron's (B, 1, S, K) True-is-masked mask, K >= S the keys (the
    native engine's cached steps: the S new tokens are the last keys): a token is padding iff it
    cannot see itself. None without a mask. Not asked whether anything is padded: that would be a host
    sync in every DeltaNet layer of every decode step, and multiplying by ones is exact."""
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[-1] < seq:
        return None
    masked_self = attention_mask[:, 0, -seq:, -seq:].diagonal(dim1=-2, dim2=-1)  # (B or 1, S)
    return (~masked_self).expand(batch, seq)


class GatedDeltaNet(MegatronModule):
    def __init__(self, config, submodules: Optional[GatedDeltaNetSubmodules] = None, layer_number: int = 1,
                 shape: Optional[DeltaNetShape] = None, **kwargs):
        super().__init__(config=config)
        if shape is None:
            raise ValueError("GatedDeltaNet needs its shape (DeltaNetShape) in the layer spec's params.")
        submodules = submodules or GatedDeltaNetSubmodules()
        self.tp = tp = parallel_state.get_tensor_model_parallel_world_size()
        problem = shape.problem(tp)
        if problem:
            raise ValueError(problem)
        self.shape, self.layer_number = shape, layer_number
        self.groups = shape.key_heads // tp  # key heads of this rank
        self.in_proj = build_module(submodules.in_proj, config.hidden_size, shape.key_heads * sum(shape.group_widths()),
                                    config=config, init_method=config.init_method, gather_output=False, bias=False,
                                    skip_bias_add=False, is_expert=False)
        conv_local = self.groups * shape.conv_group_width()
        self.conv1d = torch.nn.Conv1d(conv_local, conv_local, shape.conv_kernel, groups=conv_local, bias=False,
                                      dtype=config.params_dtype)  # its weight only: _conv pads causally itself
        heads = shape.value_heads // tp
        self.dt_bias = torch.nn.Parameter(torch.ones(heads, dtype=config.params_dtype))
        self.A_log = torch.nn.Parameter(torch.zeros(heads, dtype=config.params_dtype))
        for p in (self.conv1d.weight, self.dt_bias, self.A_log):
            set_tensor_model_parallel_attributes(p, True, 0, 1)
        self.norm = GatedRMSNorm(shape.value_head_dim, shape.norm_eps, tp)
        self.out_proj = build_module(submodules.out_proj, shape.value_heads * shape.value_head_dim,
                                     config.hidden_size, config=config, init_method=config.output_layer_init_method,
                                     bias=False, input_is_parallel=True, skip_bias_add=True, is_expert=False)
        if config.perform_initialization:
            self.reset_parameters()

    def delta_state(self, batch: int) -> DeltaState:
        """A zero generation state for `batch` rows (as a sequence starts: no history), on this mixer's
        device: conv (batch, channels, conv_kernel - 1) in the weights' dtype, recurrent in fp32."""
        weight, s = self.conv1d.weight, self.shape
        return DeltaState(weight.new_zeros(batch, weight.shape[0], s.conv_kernel - 1),
                          torch.zeros(batch, s.value_heads // self.tp, s.key_head_dim, s.value_head_dim,
                                      dtype=torch.float32, device=weight.device))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """HF's initialisation of the mixer's own parameters: A uniform in [1, 16], the step
        dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1]."""
        heads = self.A_log.numel()
        self.A_log.copy_(torch.empty(heads).uniform_(1, 16).log())
        dt = torch.exp(torch.rand(heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def _conv(self, qkv: torch.Tensor, state: Optional[DeltaState]) -> torch.Tensor:
        return causal_conv_silu(qkv, self.conv1d.weight, None, state)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                delta_state: Optional[DeltaState] = None, **kwargs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """hidden_states (S, B, hidden) [S / TP under sequence parallelism] -> (output, bias None)."""
        mixed, _ = self.in_proj(hidden_states)  # (S, B, this rank's rows)
        mixed = mixed.transpose(0, 1)  # (B, S, .)
        batch, seq = mixed.shape[:2]
        keep = token_keep(attention_mask, batch, seq)
        if keep is not None:
            mixed = mixed * keep.unsqueeze(-1).to(mixed.dtype)
        shape, groups = self.shape, self.groups
        dv = shape.value_head_dim
        q, k, v, z, b, a = mixed.reshape(batch, seq, groups, -1).split(shape.group_widths(), dim=-1)
        qkv = torch.cat([q, k, v], dim=-1).reshape(batch, seq, -1)  # conv channels per key head [q | k | v]
        qkv = self._conv(qkv.transpose(1, 2), delta_state).transpose(1, 2)
        q, k, v = qkv.reshape(batch, seq, groups, -1).split(shape.group_widths()[:3], dim=-1)
        v = v.reshape(batch, seq, -1, dv)  # value head g * r + j reads key head g
        z = z.reshape(batch, seq, -1, dv)
        b, a = b.reshape(batch, seq, -1), a.reshape(batch, seq, -1)
        if shape.ratio > 1:
            q, k = q.repeat_interleave(shape.ratio, dim=2), k.repeat_interleave(shape.ratio, dim=2)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        rule = kernels(mixed.device.type)
        initial = None if delta_state is None else delta_state.recurrent
        kernel = rule.recurrent if (delta_state is not None and initial is not None and seq == 1) else rule.chunk
        out, final = kernel(q.contiguous(), k.contiguous(), v.contiguous(), g=g, beta=beta,
                            initial_state=initial, output_final_state=delta_state is not None,
                            use_qk_l2norm_in_kernel=True)
        if delta_state is not None:
            delta_state.recurrent = final.detach()
        out = self.norm(out, z)
        out = out.reshape(batch, seq, -1).transpose(0, 1).contiguous()
        return self.out_proj(out)


def gated_delta_net_spec(attention_spec: ModuleSpec, shape: DeltaNetShape) -> ModuleSpec:
    """The mixer's spec for a layer's self_attention slot (attention_spec: the spec it replaces; its
    linear classes are reused, so a platform's linear layers apply here too)."""
    sub = attention_spec.submodules
    linears = GatedDeltaNetSubmodules(in_proj=getattr(sub, "linear_qkv", ColumnParallelLinear),
                                      out_proj=getattr(sub, "linear_proj", RowParallelLinear))
    return ModuleSpec(module=GatedDeltaNet, submodules=linears, params={"shape": shape})
