"""Mamba-2: the state-space mixer of Granite 4.0-H (most of its layers), as a megatron module in the
self-attention slot of a TransformerLayer, split over TP by heads.

Per token the mixer projects z and x (heads x head_dim), B and C (groups x state) and dt (one per head).
x, B and C go through a causal depthwise conv1d (kernel mamba_conv_kernel, with bias) and SiLU; the step
is softplus(dt + dt_bias) and the decay exp(step x A) with A = -exp(A_log); the scan (platform/ssd.py)
gives y = S C + D x per head. The output is RMSNorm over each group's heads of y x SiLU(z), times the
norm's weight, then out_proj (transformers' GraniteMoeHybridMambaLayer, norm_before_gate False).

Tensor parallelism (layouts: models/mamba_layout.py): rank r holds heads r*H/TP .. (r+1)*H/TP - 1, their
z / x / dt rows, x's conv channels, A_log, D, dt_bias and the norm weight's part. B and C of every group
are computed on every rank (a group may feed heads of several ranks; Granite's one group feeds all): their
projection and conv weights are whole on every rank, used through an identity whose backward all-reduces
over TP, so each holds the full gradient, as for any replicated weight. A norm group spread over several
ranks (Granite's, at TP > 1) sums its squares over TP (forward and backward). `out_proj` is row-parallel.

Padding: as transformers does, the layer input of padded tokens is zeroed (here: their projections, which
have no bias) and so is the conv output, so with left padding the real tokens see a zero history and a
zero state: the same as the unpadded sequence.

Incremental use (generation): `forward(..., delta_state=DeltaState)` (the same state object and call as
Gated DeltaNet, so the native engine's cache treats both alike) starts from the state's conv history (the
last conv_kernel - 1 pre-conv x | B | C inputs) and SSM state (fp32) and leaves the new ones in it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.nn.functional as F

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes  # noqa: E402
from megatron.core.tensor_parallel.mappings import (  # noqa: E402
    copy_to_tensor_model_parallel_region, gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region)
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec, build_module  # noqa: E402

from mindspeed_rl.models.gated_delta_net import DeltaState, causal_conv_silu, token_keep  # noqa: E402
from mindspeed_rl.models.mamba_layout import MambaShape  # noqa: E402
from mindspeed_rl.models.spec_tree import with_mixers  # noqa: E402
from mindspeed_rl.platform.ssd import kernels  # noqa: E402


@dataclasses.dataclass
class Mamba2Submodules:
    in_proj: Any = ColumnParallelLinear
    out_proj: Any = RowParallelLinear


class _GroupNorm(torch.nn.Module):
    """The gated norm's weight (this rank's d_inner / TP features)."""

    def __init__(self, size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size, dtype=dtype))


class Mamba2Mixer(MegatronModule):
    def __init__(self, config, submodules: Optional[Mamba2Submodules] = None, layer_number: int = 1,
                 shape: Optional[MambaShape] = None, **kwargs):
        super().__init__(config=config)
        if shape is None:
            raise ValueError("Mamba2Mixer needs its shape (MambaShape) in the layer spec's params.")
        submodules = submodules or Mamba2Submodules()
        self.tp = tp = parallel_state.get_tensor_model_parallel_world_size()
        problem = shape.problem(tp)
        if problem:
            raise ValueError(problem)
        self.shape, self.layer_number = shape, layer_number
        self.heads = heads = shape.heads // tp  # this rank's
        first = parallel_state.get_tensor_model_parallel_rank() * heads
        # the group each of this rank's heads reads
        self.register_buffer("head_group", torch.arange(first, first + heads) // shape.heads_per_group,
                             persistent=False)
        dtype, gn = config.params_dtype, shape.groups * shape.state
        self.ssm_A_log = torch.nn.Parameter(torch.zeros(heads, dtype=dtype))
        self.ssm_D = torch.nn.Parameter(torch.ones(heads, dtype=dtype))
        self.ssm_dt_bias = torch.nn.Parameter(torch.ones(heads, dtype=dtype))
        self.in_proj_zxdt = build_module(submodules.in_proj, config.hidden_size, shape.heads * sum(shape.head_widths()),
                                         config=config, init_method=config.init_method, gather_output=False, bias=False,
                                         skip_bias_add=False, is_expert=False)
        self.in_proj_bc = torch.nn.Linear(config.hidden_size, 2 * gn, bias=False, dtype=dtype)
        local_x = heads * shape.head_dim
        self.conv1d_x = torch.nn.Conv1d(local_x, local_x, shape.conv_kernel, groups=local_x, bias=shape.conv_bias,
                                        dtype=dtype)  # its weight and bias only: _conv pads causally itself
        self.conv1d_bc = torch.nn.Conv1d(2 * gn, 2 * gn, shape.conv_kernel, groups=2 * gn, bias=shape.conv_bias,
                                         dtype=dtype)
        self.ssm_norm = _GroupNorm(local_x, dtype) if shape.norm else None
        split = (self.ssm_A_log, self.ssm_D, self.ssm_dt_bias, *self.conv1d_x.parameters())
        for p in (*split, *(self.ssm_norm.parameters() if self.ssm_norm is not None else ())):
            set_tensor_model_parallel_attributes(p, True, 0, 1)
        if shape.in_multipliers:  # Falcon-H1's muP vector on in_proj's output, in the activations' dtype as its
            mz, mx, mb, mc, mdt = shape.in_multipliers  # transformers' and vLLM's buffers are
            per_head = [mz] * shape.head_dim + [mx] * shape.head_dim + [mdt]  # in_proj_zxdt's rows, per head
            self.register_buffer("zxdt_multipliers", torch.tensor(per_head * heads, dtype=dtype), persistent=False)
            self.register_buffer("bc_multipliers", torch.tensor([mb] * gn + [mc] * gn, dtype=dtype), persistent=False)
        self.ssm_out_proj = build_module(submodules.out_proj, shape.inner, config.hidden_size, config=config,
                                         init_method=config.output_layer_init_method, bias=False,
                                         input_is_parallel=True, skip_bias_add=True, is_expert=False)
        if config.perform_initialization:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """transformers' initialisation of the mixer's own parameters: A_log = log(1 .. H), D = 1, dt_bias = 1;
        the B / C projection like megatron's linears."""
        rank = parallel_state.get_tensor_model_parallel_rank()
        self.ssm_A_log.copy_(torch.arange(rank * self.heads + 1, (rank + 1) * self.heads + 1).float().log())
        self.ssm_D.fill_(1.0)
        self.ssm_dt_bias.fill_(1.0)
        self.config.init_method(self.in_proj_bc.weight)

    def delta_state(self, batch: int) -> DeltaState:
        """A zero generation state for `batch` rows: conv (batch, x | B | C channels, conv_kernel - 1) in the
        weights' dtype, the SSM state (batch, heads, head_dim, state) in fp32."""
        w, s = self.conv1d_x.weight, self.shape
        channels = w.shape[0] + self.conv1d_bc.weight.shape[0]
        return DeltaState(w.new_zeros(batch, channels, s.conv_kernel - 1),
                          torch.zeros(batch, self.heads, s.head_dim, s.state, dtype=torch.float32, device=w.device))

    def _conv(self, xbc: torch.Tensor, state: Optional[DeltaState]) -> torch.Tensor:
        """Causal depthwise conv (+ bias) and SiLU on (B, x | B | C channels, S); with a state, from its history."""
        weight = torch.cat([self.conv1d_x.weight, self._replicated(self.conv1d_bc.weight)])
        bias = None if self.conv1d_x.bias is None else torch.cat([self.conv1d_x.bias,
                                                                   self._replicated(self.conv1d_bc.bias)])
        return causal_conv_silu(xbc, weight, bias, state)

    def _replicated(self, t: torch.Tensor) -> torch.Tensor:
        """A weight (or input) whole on every TP rank, whose gradient is summed over TP in backward."""
        return copy_to_tensor_model_parallel_region(t) if self.tp > 1 else t

    def _norm(self, y: torch.Tensor) -> torch.Tensor:
        """y (B, S, heads, P) fp32, gated already -> RMS-normalised over each group's heads (and features)."""
        s = self.shape
        per_group = s.heads_per_group
        if self.heads % per_group == 0:  # this rank holds whole groups
            g = y.reshape(*y.shape[:2], self.heads // per_group, -1)
            g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + s.norm_eps)
            return g.reshape(y.shape)
        # a group spread over several ranks: its sum of squares over TP (every group's slot, zeros elsewhere)
        local = y.pow(2).sum(-1)  # (B, S, heads)
        sums = local.new_zeros(*local.shape[:2], s.groups).index_add(-1, self.head_group, local)
        sums = reduce_from_tensor_model_parallel_region(copy_to_tensor_model_parallel_region(sums))
        mean = sums[..., self.head_group] / (per_group * s.head_dim)  # (B, S, heads)
        return y * torch.rsqrt(mean + s.norm_eps)[..., None]

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                delta_state: Optional[DeltaState] = None, **kwargs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """hidden_states (S, B, hidden) [S / TP under sequence parallelism] -> (output, bias None)."""
        s, heads, p = self.shape, self.heads, self.shape.head_dim
        zxdt, _ = self.in_proj_zxdt(hidden_states)  # (S, B, heads * (2P + 1))
        whole = (gather_from_sequence_parallel_region(hidden_states) if self.config.sequence_parallel
                 else self._replicated(hidden_states))
        bc = F.linear(whole, self._replicated(self.in_proj_bc.weight))  # (S, B, 2 G N)
        if s.in_multipliers:
            zxdt, bc = zxdt * self.zxdt_multipliers.to(zxdt.dtype), bc * self.bc_multipliers.to(bc.dtype)
        zxdt, bc = zxdt.transpose(0, 1), bc.transpose(0, 1)  # (B, S, .)
        batch, seq = zxdt.shape[:2]
        keep = token_keep(attention_mask, batch, seq)
        if keep is not None:
            zxdt, bc = zxdt * keep.unsqueeze(-1).to(zxdt.dtype), bc * keep.unsqueeze(-1).to(bc.dtype)
        z, x, dt = zxdt.reshape(batch, seq, heads, -1).split(s.head_widths(), dim=-1)
        xbc = torch.cat([x.reshape(batch, seq, -1), bc], dim=-1)
        xbc = self._conv(xbc.transpose(1, 2), delta_state).transpose(1, 2)
        if keep is not None:
            xbc = xbc * keep.unsqueeze(-1).to(xbc.dtype)
        x, B, C = xbc.float().split([heads * p, s.groups * s.state, s.groups * s.state], dim=-1)
        x = x.reshape(batch, seq, heads, p)
        B = B.reshape(batch, seq, s.groups, s.state)[:, :, self.head_group]  # (B, S, heads, N)
        C = C.reshape(batch, seq, s.groups, s.state)[:, :, self.head_group]
        dt = F.softplus(dt.squeeze(-1).float() + self.ssm_dt_bias.float())
        A = -torch.exp(self.ssm_A_log.float())
        D = self.ssm_D.float()
        ssd = kernels(x.device.type)
        initial = None if delta_state is None else delta_state.recurrent
        if delta_state is not None and initial is not None and seq == 1:
            y, final = ssd.step(x, dt, A, B, C, D, initial)
        else:
            y, final = ssd.chunk(x, dt, A, B, C, s.chunk, D, initial)
        if delta_state is not None:
            delta_state.recurrent = final.detach()
        y = y * F.silu(z.float())
        if self.ssm_norm is not None:
            y = self._norm(y).reshape(batch, seq, -1) * self.ssm_norm.weight.float()
        y = y.reshape(batch, seq, -1).to(hidden_states.dtype)
        return self.ssm_out_proj(y.transpose(0, 1).contiguous())


def mamba2_spec(attention_spec: ModuleSpec, shape: MambaShape) -> ModuleSpec:
    """The mixer's spec for a layer's self_attention slot (attention_spec: the spec it replaces; its linear
    classes are reused, so a platform's linear layers apply here too)."""
    sub = attention_spec.submodules
    linears = Mamba2Submodules(in_proj=getattr(sub, "linear_qkv", ColumnParallelLinear),
                               out_proj=getattr(sub, "linear_proj", RowParallelLinear))
    return ModuleSpec(module=Mamba2Mixer, submodules=linears, params={"shape": shape})


def hybrid_block_spec(block: Any, args: dict, layers) -> Any:
    """`block` (a layer spec, or a block spec of the layers `layers`: global indices) with Mamba-2 in the
    self-attention slot of the layers mamba_layers marks."""
    marks, shape = args.get("mamba_layers") or [], MambaShape.from_args(args)
    return with_mixers(block, layers, lambda attention, layer: mamba2_spec(attention, shape)
                       if layer < len(marks) and marks[layer] else None)
