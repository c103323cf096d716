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
order only (tests/unit/models/test_train_step.py). CUDA (apex's kernel or not) and NPU (MindSpeed)
keep what they do today.

The word embedding is the same story with a (V, H) gradient: F.embedding's backward allocates a
zeroed (V, H) tensor, adds the T output-gradient rows into it, and DDP's hook adds all of it into
main_grad (SmolLM2: 49152 x 576, 113 MB filled, read and freed per micro-batch for 576 rows). On
the same switch, `enable` gives the embedding a forward (megatron's, mirrored line for line: TP
masking, sequence-parallel scatter) whose lookup adds those rows into main_grad (`index_add_`)
and hands autograd an unfilled dummy with grad_added_to_main_grad set, which the hook skips. A
tied weight (PP=1: the output layer reads the embedding's weight) gets no dummy from the
embedding at all (None: the output layer's dummy is the one the hook sees), and its
`zero_out_wgrad` is cleared: megatron set it because the embedding's part still came through
param.grad, so the output layer's dummy had to be zeros; now both parts are in main_grad already.
At PP>1 each stage's copy is its own chunk's only consumer (a dummy, as untied); megatron's
embedding group all-reduces their main_grads afterwards as before. Untied, the first micro-batch
is bitwise today's; tied, the shared weight's two parts meet in another order ((out + e) against
out + e summed apart: a few float32 ulps); bf16 rows are added in fp32 (today: summed in bf16 first).
Tied, the hook sees a gradient only where the output layer ran in that micro-batch (it always does
in training; with overlap_grad_reduce, which wrap_ddp leaves off, it must).
"""
from __future__ import annotations

import functools
import inspect
import types

import torch
import torch.nn.functional as F

from mindspeed_rl.platform import get_platform

_KERNEL = "fused_weight_gradient_mlp_" + "cuda"  # the apex module name megatron's layers import


_BLOCK_ELEMENTS = 1 << 20  # of a mixed-dtype weight gradient per block (4 MB in fp32)


def _wgrad_gemm_accum(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """main_grad (out, in) += grad_output^T (out, T) @ total_input (T, in), in one GEMM when the dtypes
    agree. bf16 activations with an fp32 buffer: the product in their dtype, then added in fp32, as
    megatron's unfused path does (the same bits), but block by block of output rows through two
    small buffers. A whole-product `main_grad.add_(bf16 product)` makes torch convert the product
    into a fresh fp32 copy first: for SmolLM2's output layer a 56 MB bf16 product and a 113 MB fp32
    copy at once. Blocked, a SmolLM2 bf16 update peaks ~160 MB lower (+970 against +1,140 MB over
    the resident size); its time is the same within noise."""
    go = grad_output.reshape(-1, grad_output.shape[-1])
    x = total_input.reshape(-1, total_input.shape[-1])
    if go.dtype == main_grad.dtype and x.dtype == main_grad.dtype:
        main_grad.addmm_(go.t(), x)
        return
    out_rows, width = main_grad.shape
    rows = min(out_rows, max(1, _BLOCK_ELEMENTS // width))
    product = torch.empty(rows, width, dtype=torch.result_type(go, x), device=main_grad.device)
    widened = torch.empty(rows, width, dtype=main_grad.dtype, device=main_grad.device)
    for r in range(0, out_rows, rows):
        k = min(out_rows, r + rows)
        torch.mm(go[:, r:k].t(), x, out=product[:k - r])
        main_grad[r:k].add_(widened[:k - r].copy_(product[:k - r]))


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
    """Switch gradient-accumulation fusion on for every megatron linear layer and word embedding of a
    DDP-wrapped model where `applies()`; returns how many layers were switched (0 elsewhere)."""
    if not applies():
        return 0
    install()
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    switched = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)  # None: the output layer given the tied embedding
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and (weight is None or weight.requires_grad):
            module.gradient_accumulation_fusion = True
            switched += 1
    # the word embedding's weight is also the output layer's where a chunk has both ends and ties them
    tied = {id(m.shared_embedding_or_output_weight()) for m in model.modules()
            if getattr(m, "share_embeddings_and_output_weights", False) and m.pre_process and m.post_process}
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module.weight, "main_grad"):
            _fuse_embedding(module, tied=id(module.weight) in tied)
            switched += 1
    return switched


def unfuse_embeddings(model: torch.nn.Module) -> None:
    """Give a model's word embeddings megatron's own forward back (its weight gradient through a
    (V, H) param.grad): bench/update_profile.py's unfused-embedding lever and the tests' twin."""
    for module in model.modules():
        if "forward" in vars(module) and getattr(module.forward, "__func__", None) is _embedding_forward:
            del module.forward
            if module._grad_tied:
                module.weight.zero_out_wgrad = True  # the output layer's dummy is added again: zeros


# ---------------------------------------------------------------------------- word embedding
class _LookupIntoMainGrad(torch.autograd.Function):
    """F.embedding whose backward adds the output-gradient rows into weight.main_grad at their ids
    (the plain path's (V, H) zeros, its scatter and the hook's add_, in one index_add_)."""

    @staticmethod
    def forward(ctx, ids, weight, tied):
        ctx.save_for_backward(ids, weight)
        ctx.tied = tied
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad_output):
        ids, weight = ctx.saved_tensors
        rows = grad_output.reshape(-1, grad_output.shape[-1])  # (T, H)
        weight.main_grad.index_add_(0, ids.reshape(-1), rows.to(weight.main_grad.dtype))
        if ctx.tied:  # the output layer's dummy reaches the hook; a second one would be summed with it
            return None, None, None
        # the hook runs only on a gradient (megatron's dummies are there for overlap_grad_reduce too);
        # unfilled: grad_added_to_main_grad makes the hook skip it
        weight.grad_added_to_main_grad = True
        return None, torch.empty(weight.shape, dtype=weight.dtype), None


def _embedding_forward(self, input_: torch.Tensor) -> torch.Tensor:
    """megatron-core's VocabParallelEmbedding.forward (0.12.1 and 0.16), its lookup `_LookupIntoMainGrad`.
    Ids outside this rank's vocab range are looked up at row 0 and their outputs zeroed, as megatron
    does: their gradient rows are then zero, added into row 0 as megatron's backward adds them."""
    from megatron.core.tensor_parallel import layers

    group = getattr(self, "tp_group", None)  # 0.16 keeps its TP group; 0.12 uses the global one
    tp = group.size() if group is not None else self.tensor_model_parallel_size
    by_group = {} if group is None else {"group": group}
    if tp > 1:
        input_mask = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
        masked_input = input_.clone() - self.vocab_start_index
        masked_input[input_mask] = 0
    else:
        masked_input = input_
    output_parallel = _LookupIntoMainGrad.apply(masked_input, self.weight, self._grad_tied)  # deterministic on CPU
    if tp > 1:
        output_parallel[input_mask, :] = 0.0
    if self.reduce_scatter_embeddings:  # sequence parallel: [b s h] -> [s b h], scattered over TP
        output_parallel = output_parallel.transpose(0, 1).contiguous()
        return layers.reduce_scatter_to_sequence_parallel_region(output_parallel, **by_group)
    return layers.reduce_from_tensor_model_parallel_region(output_parallel, **by_group)


# the lines of megatron's forward that _embedding_forward mirrors; any other forward must be re-read
_MIRRORED = ("masked_input = input_.clone() - self.vocab_start_index", "masked_input[input_mask] = 0",
             "F.embedding(masked_input, self.weight)", "output_parallel[input_mask, :] = 0.0",
             "output_parallel = output_parallel.transpose(0, 1).contiguous()")


@functools.cache
def _check_mirrored(cls: type) -> None:
    """Fail loudly where megatron's embedding forward or DDP's hook is not the one this module read."""
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding

    forward = inspect.getsource(cls.forward)
    hook = inspect.getsource(DistributedDataParallel._make_backward_post_hook)
    if (cls is not VocabParallelEmbedding or not all(line in forward for line in _MIRRORED)
            or "not param.grad_added_to_main_grad or getattr(param, 'zero_out_wgrad', False)" not in hook):
        import megatron.core

        raise RuntimeError(f"platform/wgrad_fusion.py: megatron-core {megatron.core.__version__}'s "
                           f"{cls.__name__}.forward or DDP's backward hook is not the one this module "
                           f"mirrors; it must learn this version.")


def _fuse_embedding(module: torch.nn.Module, tied: bool) -> None:
    """Switch one VocabParallelEmbedding (its weight in a DDP buffer) to `_embedding_forward`."""
    _check_mirrored(type(module))
    module._grad_tied = tied
    module.forward = types.MethodType(_embedding_forward, module)
    if tied:
        module.weight.zero_out_wgrad = False  # both parts now land in main_grad: the hook adds nothing
