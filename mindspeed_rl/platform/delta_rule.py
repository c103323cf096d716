"""The gated delta rule's kernels (Qwen3-Next / Qwen3.5 linear attention, models/gated_delta_net.py).

Two forms with one calling convention, flash-linear-attention's (`fla`): (q, k, v, g, beta,
initial_state=, output_final_state=, use_qk_l2norm_in_kernel=) on (batch, seq, heads, dim) tensors,
returning (out, final state or None):
- chunk: the whole sequence at once (training forward, prompt prefill);
- recurrent: token by token (one-token decode steps).

On CUDA with `flash-linear-attention` installed they are its Triton kernels; everywhere else (CPU, and
NPU until a fused kernel is wired here) transformers' pure-torch versions of the same two functions
(`transformers.models.qwen3_next`, present since transformers 4.57), which autograd differentiates.
The model repeats q / k to the value heads before the call, so both kernels see equal head counts.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable, NamedTuple


class DeltaRuleKernels(NamedTuple):
    chunk: Callable
    recurrent: Callable
    source: str  # "fla" or "torch"


def _torch_kernels() -> DeltaRuleKernels:
    try:
        m = importlib.import_module("transformers.models.qwen3_next.modeling_qwen3_next")
        return DeltaRuleKernels(m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule, "torch")
    except (ImportError, AttributeError) as err:
        raise RuntimeError(
            f"Gated delta-rule linear attention (Qwen3-Next / Qwen3.5) needs transformers >= 4.57 "
            f"(transformers.models.qwen3_next); this one fails with {err!r}: pip install 'transformers>=4.57'."
        ) from err


@functools.lru_cache(maxsize=None)
def kernels(device_type: str) -> DeltaRuleKernels:
    """The kernels for tensors on `device_type` ("cpu", "cuda", "npu"); resolved once per device type (every
    Gated DeltaNet layer asks at every forward: a missing fla would be searched for on disk each time)."""
    if device_type == "cuda":
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
            return DeltaRuleKernels(chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, "fla")
        except ImportError:
            pass
    return _torch_kernels()
