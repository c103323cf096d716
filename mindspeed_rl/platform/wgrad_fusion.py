"""Weight gradients accumulated straight into megatron DDP's fp32 main_grad buffer, on CPU.

Without gradient-accumulation fusion, megatron's linear layers return grad_weight = grad_output^T x
(a fresh (out, in) tensor); autograd stores it in param.grad and DDP's hook then adds it into the
contiguous main_grad buffer (`main_grad.add_`) and frees it: per micro-batch one more pass over every
weight gradient, plus a fresh allocation of each. Megatron's fusion (`gradient_accumulation_fusion`)
instead calls apex's CUDA kernel `wgrad_gemm_accum_fp32(input, grad_output, main_grad)`, a GEMM that
accumulates into main_grad (beta = 1), and hands autograd a dummy gradient that the hook skips.

On CPU there is no apex: `install()` gives megatron's tensor_parallel.layers module (that module
only: nothing else in the process sees it) the same two functions written as one `addmm_` into
main_grad, and `enable(module)` switches the fusion on for the linear layers of a DDP-wrapped model
(their weights have main_grad; models without DDP, e.g. a reference, keep the plain path).
The first micro-batch's gradient is bitwise today's (0 + A B); later ones differ by summation
order only (tests/unit/models/test_train_step.py). Tied embeddings are megatron's own case: it
zeroes the dummy gradient of the shared weight (`zero_out_wgrad`) so the hook still adds the
embedding's part. CUDA (apex's kernel or not) and NPU (MindSpeed) keep what they do today.
"""
from __future__ import annotations

import types

import torch

from mindspeed_rl.platform import get_platform

_KERNEL = "fused_weight_gradient_mlp_" + "cuda"  # the apex module name megatron's layers import


def _wgrad_gemm_accum(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (out, in) += grad_output^T (out, T) @ total_input (T, in), in one GEMM when the dtypes
    agree (bf16 activations with an fp32 buffer: the product in their dtype, then added, as today)."""
    go = grad_output.reshape(-1, grad_output.shape[-1])
    x = total_input.reshape(-1, total_input.shape[-1])
    if go.dtype == main_grad.dtype and x.dtype == main_grad.dtype:
        main_grad.addmm_(go.t(), x)
    else:
        main_grad.add_(go.t().matmul(x))


def applies() -> bool:
    """Whether this platform accumulates weight gradients with this module (CPU only)."""
    return get_platform().name == "cpu"


def install() -> None:
    """Give megatron's tensor_parallel.layers our accumulation functions (idempotent, checked)."""
    from megatron.core.tensor_parallel import layers

    if getattr(layers, "_grad_accum_fusion_available", None) is None:
        import megatron.core

        raise RuntimeError(f"platform/wgrad_fusion.py: megatron-core {megatron.core.__version__}'s "
                           f"tensor_parallel.layers has no _grad_accum_fusion_available; this module must "
                           f"learn this version.")
    if layers._grad_accum_fusion_available and hasattr(layers, _KERNEL):
        return  # a real kernel (or ours, installed before) is there
    setattr(layers, _KERNEL, types.SimpleNamespace(wgrad_gemm_accum_fp32=_wgrad_gemm_accum,
                                                   wgrad_gemm_accum_fp16=_wgrad_gemm_accum))
    layers._grad_accum_fusion_available = True


def enable(model: torch.nn.Module) -> int:
    """Switch gradient-accumulation fusion on for every megatron linear layer of a DDP-wrapped model
    where `applies()`; returns how many layers were switched (0 elsewhere)."""
    if not applies():
        return 0
    install()
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    switched = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)  # None: the output layer given the tied embedding
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and (weight is None or weight.requires_grad):
            module.gradient_accumulation_fusion = True
            switched += 1
    return switched
