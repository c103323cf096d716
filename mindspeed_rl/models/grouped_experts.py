"""Grouped-GEMM experts over megatron's per-expert weights (`moe_grouped_gemm: true`).

Why: megatron's `SequentialMLP` runs the local experts one after another: two small matmuls per
expert, a `tokens_per_expert.tolist()` (a host sync) to split the tokens, and a cat. On one H200 a
bf16 update of a 16-expert, top-4 model took 2.65x transformers' (which groups the experts' GEMMs),
at 2 % of the matmul peak (docs/accelerators.md). megatron's own `GroupedMLP` needs the
`grouped_gemm` package (or Transformer Engine) and stores the experts stacked, under other names
than every checkpoint, export and weight-sync path of this project reads.

What: `GroupedExperts` is a `SequentialMLP` (the same `local_experts.N.linear_fc1/fc2` parameters, so
the HF bridge, checkpoints, HF export, vLLM sync and routing replay see nothing new) whose forward
stacks the local experts' weights and runs two grouped matmuls over the tokens the dispatcher
already sorted by expert (`Platform.grouped_mm`: torch's `_grouped_mm` on CPU and CUDA, with the
group offsets computed on the device, so no host sync in the experts; MindSpeed's `npu_gmm_v2` on
Ascend). With the static dispatch of models/moe_dispatch.py (token counts left on the device) a
MoE layer runs without a host sync at all. The activation between them is megatron's own for the config (the fused-swiglu hook
with the routing probs, or the plain glu; for experts without a gate, Nemotron-H's relu(x)^2, the activation alone),
so the numbers are those of `SequentialMLP`: in fp32 the
grouped GEMM computes each group's rows as the per-expert matmul does (tests compare outputs,
gradients and a whole update).

Expert TP / EP need nothing here: an expert's linear layers do no communication of their own
(megatron's `explicit_expert_comm`; the dispatcher gathers and scatters), so each rank multiplies its
local shards. Where a case is not covered (biases, glu activations other than silu, fp8, probs applied on the
input, a row width the grouped GEMM cannot take: its strides must be 16-byte multiples) the forward
is `SequentialMLP`'s. If the grouped GEMM itself fails (a device or dtype without a kernel, MindSpeed
absent), one warning says so and the experts run sequentially from then on in this process.

Verified on CPU (tests); the CUDA kernel and MindSpeed's are written against their APIs, not yet run.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from mindspeed_rl.platform import get_platform
from mindspeed_rl.platform.base import compile_error_summary  # `Type: first line` of any error

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.transformer import mlp as _mlp  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402

log = logging.getLogger(__name__)

_STATE = {"failed": None}  # the error that turned the grouped GEMM off in this process


def _stacked(weights: list[torch.Tensor]) -> torch.Tensor:
    """(E, in, out) view of E (out, in) weights for `_grouped_mm`'s second operand (column-major)."""
    return torch.stack(weights).transpose(1, 2)


def _aligned(*widths: int, dtype: torch.dtype) -> bool:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return all(w * itemsize % 16 == 0 for w in widths)


class GroupedExperts(SequentialMLP):
    """SequentialMLP's parameters, grouped GEMMs in the forward (module docstring)."""

    def _grouped(self, hidden: torch.Tensor) -> bool:
        c = self.config
        # no rows (an EP rank routed nothing): torch's CPU backward of an empty grouped GEMM fails
        if _STATE["failed"] is not None or self.num_local_experts < 2 or hidden.dim() != 2 or not hidden.shape[0]:
            return False
        if c.add_bias_linear or (c.gated_linear_unit and c.activation_func is not F.silu):
            return False
        if not c.gated_linear_unit and c.bias_activation_fusion:  # megatron fuses no activation without a gate
            return False
        if getattr(c, "fp8", None) or getattr(c, "fp4", None) or getattr(c, "moe_apply_probs_on_input", False):
            return False
        if getattr(c, "activation_func_clamp_value", None) is not None or getattr(c, "glu_linear_offset", 0.0):
            return False
        fc1 = self.local_experts[0].linear_fc1.weight
        fc2 = self.local_experts[0].linear_fc2.weight
        # the rows of x (hidden), of fc1's output (2 x ffn) and of fc2's input (ffn), and the weights' strides
        return hidden.dtype == fc1.dtype and _aligned(fc1.shape[0], fc1.shape[1], fc2.shape[1], dtype=fc1.dtype)

    def _activation(self, intermediate: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """MLP.forward between fc1 and fc2 for a gated silu without bias (or experts without a gate: Nemotron-H's
        relu(x)^2), scaled by the routing probs."""
        if not self.config.gated_linear_unit:  # MLP.forward's unfused path: the activation, then the probs
            out = self.config.activation_func(intermediate)
            return (out * probs.unsqueeze(-1)).to(out.dtype)
        if self.config.bias_activation_fusion:  # megatron's fused swiglu name (models/swiglu.py's on CPU/CUDA)
            return _mlp.weighted_bias_swiglu_impl(intermediate, None, probs.unsqueeze(-1),
                                                  self.config.activation_func_fp8_input_store)
        gate, linear = torch.chunk(intermediate, 2, dim=-1)
        out = F.silu(gate) * linear
        return (out * probs.unsqueeze(-1)).to(out.dtype)

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor):
        hidden = permuted_local_hidden_states
        if not self._grouped(hidden):
            return super().forward(hidden, tokens_per_expert, permuted_probs)
        counts = torch.as_tensor(tokens_per_expert).to(hidden.device, non_blocking=True)
        grouped_mm = get_platform().grouped_mm
        try:
            fc1 = grouped_mm(hidden.contiguous(), _stacked([e.linear_fc1.weight for e in self.local_experts]), counts)
            out = grouped_mm(self._activation(fc1, permuted_probs).contiguous(),
                             _stacked([e.linear_fc2.weight for e in self.local_experts]), counts)
        except GROUPED_GEMM_ERRORS as err:  # no kernel for this device / dtype
            turn_off(err)
            return super().forward(hidden, tokens_per_expert, permuted_probs)
        return out, None


def install(model) -> int:
    """Turn every SequentialMLP of `model` (a module or a list of chunks) into GroupedExperts, keeping
    its parameters. Returns how many were turned."""
    count = 0
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        for module in chunk.modules():
            if type(module) is SequentialMLP:
                module.__class__ = GroupedExperts
                count += 1
    return count


GROUPED_GEMM_ERRORS = (RuntimeError, NotImplementedError, ImportError)  # what a missing kernel raises


def turn_off(err: Exception) -> None:
    """The grouped GEMM failed (`err`): off for every MoE layer of this process, said once."""
    _STATE["failed"] = err
    log.warning("moe_grouped_gemm: the grouped matmul failed (%s); the experts run one by one from "
                "here on (set moe_grouped_gemm: false to skip the attempt).", compile_error_summary(err))


def failed() -> Exception | None:
    """The error that turned the grouped GEMM off in this process, if any."""
    return _STATE["failed"]
