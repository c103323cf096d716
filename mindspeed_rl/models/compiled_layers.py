"""Decoder layers of the training and log-prob forwards compiled with torch.compile (`use_torch_compile`).

What it is for: on CPU a small model's update is bound by its element-wise work, not its matmuls.
In the profile of a 10M bf16 update `aten::mm` was ~22 % of the time; the rest was RMSNorm's pow /
mul / rsqrt, the residual adds, SwiGLU's silu and mul, RoPE, the bf16 <-> fp32 casts around
attention and their backward, each a separate pass over the activations. Inductor fuses the work
between two matmuls into a few loops, forward and backward (issue 15).

How:
- one `torch.compile` of megatron's `TransformerLayer.forward` is shared by every layer of every model
  it is installed on (`install`): Dynamo lifts each layer's parameters as inputs, so layers of the same
  shape reuse one graph (the first call compiles; a second compile marks the token count dynamic, and
  train / eval and grad / no-grad are separate graphs);
- megatron's parallel linear layers stay eager (`torch.compiler.disable` on their forward): their
  autograd functions accumulate the weight gradient into `main_grad` (platform/wgrad_fusion.py,
  megatron's gradient_accumulation_fusion) and run the TP communication, which Dynamo cannot trace;
  the graph breaks there cleanly, so a layer is six compiled pieces around four eager matmuls (nine
  on megatron-core 0.16);
- under compile, models/rotary.py and models/swiglu.py hand over to the plain formulas (megatron's
  unfused RoPE, silu(a) * b), which inductor fuses and differentiates itself;
- the layer runs eagerly when a KV-cache attention is swapped in (rollout/kv_cache.py's non-lean path
  writes into its cache) or megatron's inference context is given; and for good once a compile fails
  (e.g. inductor finds no C++ compiler): one warning with the fix, and the step goes on eagerly. The
  backward graph is compiled together with the forward (not lazily at the first backward), so a
  failure there too is caught at the layer's first call, before any gradient of the step exists.

Numerics: inductor computes a fused bf16 chain in fp32 and rounds once, so bf16 results differ from
the eager ops' by bf16 rounding; fp32 agrees within 2e-6 (tests/unit/models/test_compiled_layers.py).
Where it applies (platform.base.compiled_layers for the platform): dense TransformerLayer / MLP layers with attention (MoE
layers and Gated DeltaNet / Mamba-2 ones stay eager), not on
Ascend (torch_npu's graph mode is MindSpeed's business).
"""
from __future__ import annotations

import functools
import logging

import torch

from mindspeed_rl.platform import get_platform
from mindspeed_rl.platform.base import compile_failed, compile_error_summary, compile_fix

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.transformer.mlp import MLP  # noqa: E402
from megatron.core.transformer.transformer_layer import TransformerLayer  # noqa: E402

log = logging.getLogger(__name__)

_STATE = {"compiled": {}, "failed": None}  # backend -> the shared compiled forward; the error that stopped it
_CACHE_SIZE = 32  # graphs per compiled frame: shapes x train/eval x grad modes x layer kinds


def _compiled(backend):
    if backend not in _STATE["compiled"]:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, _CACHE_SIZE)
        _STATE["compiled"][backend] = torch.compile(TransformerLayer.forward, backend=backend)
    return _STATE["compiled"][backend]


def _stop(err: Exception) -> None:
    _STATE["failed"] = err
    summary = compile_error_summary(err)
    log.warning("use_torch_compile: torch.compile failed on a decoder layer (%s); the layers run eagerly from "
                "here on. %s", summary, compile_fix(summary, "use_torch_compile: false"))


def _forward(layer: TransformerLayer, attention_type: type, compiled, *args, **kwargs):
    eager = (_STATE["failed"] is not None or type(layer.self_attention.core_attention) is not attention_type
             or kwargs.get("inference_context") is not None or kwargs.get("inference_params") is not None)
    if not eager:
        try:
            # the backward is compiled with the forward (AOTAutograd lowers it lazily, at the first
            # loss.backward(), by default): a failure of either surfaces here, before the step began
            with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
                return compiled(layer, *args, **kwargs)
        except compile_failed() as err:  # raised while compiling, before the layer's graph ran
            _stop(err)
    return TransformerLayer.forward(layer, *args, **kwargs)


def compilable(layer: torch.nn.Module) -> bool:
    """A dense megatron decoder layer this module compiles (MoE and other layer kinds stay eager, and so do layers
    whose token mixer is not attention alone: Gated DeltaNet, Mamba-2, LFM2's short convolution, Falcon-H1's attention
    with Mamba-2 beside it)."""
    attention = getattr(layer, "self_attention", None)
    return (type(layer) is TransformerLayer and type(getattr(layer, "mlp", None)) is MLP
            and hasattr(attention, "core_attention") and not hasattr(attention, "mamba"))


def install(chunks, backend="inductor") -> int:
    """Make every compilable decoder layer of the model chunk(s) run through the shared compiled
    forward (idempotent; `backend` is torch.compile's, the tests swap it). Returns the number of
    layers that compile."""
    count = 0
    for chunk in chunks if isinstance(chunks, (list, tuple)) else [chunks]:
        for layer in chunk.modules():
            if not compilable(layer):
                continue
            count += 1
            if getattr(layer, "_compiled_forward", False):
                continue
            for module in layer.modules():  # eager matmuls: main_grad accumulation and TP communication
                if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                    module.forward = torch.compiler.disable(module.forward, recursive=True)
            layer.forward = functools.partial(_forward, layer, type(layer.self_attention.core_attention),
                                              _compiled(backend))
            layer._compiled_forward = True
    return count


def failed() -> Exception | None:
    """The compile error that turned the compiled layers off in this process, if any."""
    return _STATE["failed"]
