"""Multi-latent attention (DeepSeek-V3) on megatron-core's local layer spec: the one fix it needs there.

megatron's local spec splits the key / value down projection (`linear_kv_down_proj`, output
kv_lora_rank + qk_pos_emb_head_dim) over TP as a ColumnParallelLinear and gathers its output
(`gather_from_tensor_model_parallel_region`) before taking the key's RoPE part (k_pos_emb) from it.
That part then feeds this rank's heads only, so its gradient on each rank holds only this rank's
heads' share, and the gather's backward hands each rank back its own columns of that partial
gradient: the down projection's weight rows of the RoPE part, and every gradient before it, miss
the other ranks' heads (megatron-core 0.12 and 0.16 alike; its Transformer Engine spec uses a
replicated down projection instead, whose sequence-parallel gather sums them). Measured on a tiny
DeepSeek-V3 at TP 2 + SP: embedding gradients 15 % off transformers'.

`install(model)` marks each MLA layer's down-projection output and makes MLA's gather of a marked
tensor sum the RoPE columns' gradient over the TP group (identity in forward). At TP 1 nothing is
installed.

Importing this module also fixes megatron-core 0.16 without Transformer Engine: its
transformer_engine extension then defines TELinear as a MagicMock, MLA's import of it succeeds
(HAVE_TE True) and `isinstance(linear_proj, TELinear)` raises TypeError when an MLA layer is built.
HAVE_TE is set False there when TELinear is not a class (the path written for no TE).
"""
from __future__ import annotations

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.transformer import multi_latent_attention as _mla  # noqa: E402

_MEGATRON_GATHER = _mla.gather_from_tensor_model_parallel_region
if getattr(_mla, "HAVE_TE", False) and not isinstance(getattr(_mla, "TELinear", None), type):
    _mla.HAVE_TE = False  # megatron-core 0.16 without Transformer Engine (see the module docstring)
_MARK = "_mla_rope_width"  # attribute on the down projection's output: the RoPE columns at its end


class _SumTrailingGradOverTP(torch.autograd.Function):
    """Identity; in backward the last `width` columns of the gradient are summed over the TP group."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, width: int, group) -> torch.Tensor:
        ctx.width, ctx.group = width, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        part = grad[..., -ctx.width:].contiguous()
        torch.distributed.all_reduce(part, group=ctx.group)
        grad[..., -ctx.width:] = part
        return grad, None, None


def _gather(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """megatron's gather_from_tensor_model_parallel_region; for a marked down-projection output, the
    gathered RoPE columns' gradient summed over TP."""
    out = _MEGATRON_GATHER(x, *args, **kwargs)
    width = getattr(x, _MARK, 0)
    if not width:
        return out
    group = kwargs.get("group") or (args[0] if args else None) or parallel_state.get_tensor_model_parallel_group()
    return _SumTrailingGradOverTP.apply(out, width, group)


def _mark(width: int):
    def hook(module, inputs, output):
        setattr(output[0] if isinstance(output, tuple) else output, _MARK, width)
    return hook


def install(model: torch.nn.Module) -> None:
    """The fix above on every multi-latent attention layer of `model` (TP > 1; idempotent)."""
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return
    if _mla.gather_from_tensor_model_parallel_region is _MEGATRON_GATHER:
        _mla.gather_from_tensor_model_parallel_region = _gather
    elif _mla.gather_from_tensor_model_parallel_region is not _gather:
        raise RuntimeError("models/mla.py: megatron's multi_latent_attention.gather_from_tensor_model_parallel_region "
                           "was replaced by something else; models/mla.py must learn it.")
    width = model.config.qk_pos_emb_head_dim
    for layer in model.decoder.layers:
        down = getattr(layer.self_attention, "linear_kv_down_proj", None)
        if down is not None and not getattr(down, "_mla_marked", False):
            down.register_forward_hook(_mark(width))
            down._mla_marked = True
