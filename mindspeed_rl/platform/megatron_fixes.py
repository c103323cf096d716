"""Fixes for megatron-core itself (every platform), applied once, each checked and explained.

- megatron-core 0.12.x without Transformer Engine (CPU, and NPU/CUDA stacks without TE):
  DistributedOptimizer.step() always calls fp8_utils.quantize_param_shard, whose no-TE fallback
  raises "Invalid Transformer Engine version for FP8 distributed optimizer" even when there is no
  fp8 parameter to quantize. The fix skips the call exactly when the list of fp8 parameters is
  empty (nothing to do, whatever the implementation); with fp8 parameters the original runs.
"""
from __future__ import annotations

_applied = False


def apply() -> None:
    """Idempotent; call once megatron.core is importable (after the platform patch)."""
    global _applied
    if _applied:
        return
    from megatron.core import fp8_utils

    impl = getattr(fp8_utils, "_quantize_param_shard_impl", None)
    if impl is None:  # newer megatron-core restructured fp8 handling; nothing to fix there
        _applied = True
        return

    def quantize_param_shard(model_params, *args, **kwargs):
        if len(model_params) == 0:  # nothing is fp8: nothing to quantize
            return None
        return impl(model_params, *args, **kwargs)

    fp8_utils._quantize_param_shard_impl = quantize_param_shard
    _applied = True
