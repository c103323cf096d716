"""SwiGLU of the gated MLP as one autograd Function: silu(a) * b on the halves of fc1's output, no cat.

megatron-core's unfused gated MLP computes `x = torch.chunk(fc1_out, 2, dim=-1); silu(x[0]) * x[1]`;
autograd's backward of that chunk is a `cat` of the two half gradients, and silu's backward runs on
the strided chunk view. In the CPU profile of a SmolLM2-135M update that cat (a (72, 8, 1536) pair per
layer) was about half of all `aten::cat` time (issue 15). Megatron's own fused path
(fusions/fused_bias_swiglu.py, config.bias_activation_fusion) also cats in backward and is wrapped in
torch.compile. Here:

- forward: silu(a) into the output, then `mul_(b)`; only x (fc1's output, which megatron's unfused
  path keeps alive too) is saved; silu(a) is recomputed in backward instead of kept;
- backward: grad_x = torch.empty_like(x) and its two halves written in place (`out=` views):
  grad_b = silu(a) * g, grad_a = silu_backward(g * b, a), the same ops in the same dtype as autograd
  runs for the unfused path, so the numbers are bit-identical to megatron's chunk version;
- the token-weighted form MoE experts use (SequentialMLP passes the router probs as per_token_scale):
  (silu(a) * b * w).to(x.dtype) with megatron's type promotion, and its backward, also without a cat.

The patch point is two attributes of `megatron.core.transformer.mlp`: `bias_swiglu_impl` and
`weighted_bias_swiglu_impl`, the names MLP.forward calls when config.bias_activation_fusion is set with
a gated silu (megatron-core 0.12 and 0.16). `install()` checks they are still megatron's
fused_bias_swiglu functions with the expected parameters and replaces them once; models/builder.py
sets bias_activation_fusion only for gated silu MLPs on platforms where `platform.own_swiglu` (CPU,
CUDA; NPU keeps MindSpeed's fused swiglu, use_fused_swiglu). What this module does not implement
(fp8 input store, activation CPU offload) goes to megatron's original. Not covered: megatron's
GroupedMLP (moe_grouped_gemm, refused where no grouped-GEMM kernel exists) and shared experts (not
implemented by this framework) keep their own activation code. Under torch.compile
(models/compiled_layers.py) `swiglu` is the plain silu(a) * b, which inductor fuses forward and
backward (the `out=` writes into halves here would break the graph).
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.fusions import fused_bias_swiglu as _fused  # noqa: E402
from megatron.core.transformer import mlp as _mlp  # noqa: E402

_MEGATRON = _fused.bias_swiglu_impl
_MEGATRON_WEIGHTED = _fused.weighted_bias_swiglu_impl
_EXPECTED = ("input", "bias", "fp8_input_store")  # leading parameters, 0.12 and 0.16
_EXPECTED_WEIGHTED = ("input", "bias", "weights", "fp8_input_store")


def _swiglu_into(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """out = silu(a) * b for the halves a, b of x's last dimension (as megatron's glu rounds it)."""
    half = x.shape[-1] // 2
    torch.ops.aten.silu.out(x[..., :half], out=out)
    return out.mul_(x[..., half:])


def _swiglu_grad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad_x of silu(a) * b for the output gradient g: both halves written into one tensor."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    grad = torch.empty_like(x)
    ga, gb = grad[..., :half], grad[..., half:]
    torch.mul(g, b, out=ga)  # d/d silu(a), then through silu in place
    torch.ops.aten.silu_backward.grad_input(ga, a, grad_input=ga)
    torch.ops.aten.silu.out(a, out=gb)
    gb.mul_(g)
    return grad


def _empty_half(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)


class SwiGLU(torch.autograd.Function):
    """x (..., 2h) -> silu(x[..., :h]) * x[..., h:] (..., h); backward without a cat."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _swiglu_into(_empty_half(x), x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return _swiglu_grad(g, x)


class WeightedSwiGLU(torch.autograd.Function):
    """x (..., 2h), w broadcastable to (..., 1) -> (swiglu(x) * w).to(x.dtype), megatron's
    per_token_scale: the product in the promoted dtype of x and w, rounded back to x's."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return (_swiglu_into(_empty_half(x), x) * w).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        wide = g.to(torch.promote_types(x.dtype, w.dtype))  # the backward of .to(x.dtype)
        grad_w = None
        if ctx.needs_input_grad[1]:  # the router's probabilities: d/dw = sum over h of g * swiglu(x)
            grad_w = (wide * _swiglu_into(_empty_half(x), x)).sum_to_size(w.shape).to(w.dtype)
        return _swiglu_grad((wide * w).to(x.dtype), x), grad_w


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """megatron's gated silu of fc1's output x (..., 2h) -> (..., h)."""
    if x.shape[-1] % 2:
        raise ValueError(f"swiglu: the last dimension of fc1's output ({x.shape[-1]}) must be even.")
    if torch.compiler.is_compiling():  # models/compiled_layers.py: inductor fuses the plain form
        a, b = torch.chunk(x, 2, dim=-1)
        return F.silu(a) * b
    return SwiGLU.apply(x)


def bias_swiglu_impl(input, bias, fp8_input_store=False, *args, **kwargs):
    """Drop-in for megatron's fused_bias_swiglu.bias_swiglu_impl: (input + bias) then `swiglu`, as
    megatron's unfused MLP computes it; fp8 input store / activation offload go to megatron's."""
    if fp8_input_store or any(args) or any(kwargs.values()):
        return _MEGATRON(input, bias, fp8_input_store, *args, **kwargs)
    return swiglu(input if bias is None else input + bias)


def weighted_bias_swiglu_impl(input, bias, weights, fp8_input_store=False, *args, **kwargs):
    """Drop-in for megatron's weighted_bias_swiglu_impl: swiglu(input) * weights (per-token router
    probabilities of an expert, (tokens, 1)) in megatron's dtypes; bias as megatron's unfused MLP."""
    if fp8_input_store or any(args) or any(kwargs.values()):
        return _MEGATRON_WEIGHTED(input, bias, weights, fp8_input_store, *args, **kwargs)
    if input.shape[-1] % 2:
        raise ValueError(f"swiglu: the last dimension of fc1's output ({input.shape[-1]}) must be even.")
    return WeightedSwiGLU.apply(input if bias is None else input + bias, weights)


def runs(config) -> bool:
    """Whether megatron's MLP with `config` computes its activation with this module (installed, the
    fused flag set on a gated silu, no fp8 input store): then it equals megatron's unfused glu."""
    return (getattr(_mlp, "bias_swiglu_impl", None) is bias_swiglu_impl and bool(config.bias_activation_fusion)
            and bool(config.gated_linear_unit) and config.activation_func is F.silu
            and not getattr(config, "activation_func_fp8_input_store", False))


def install() -> None:
    """Make megatron's MLP call `bias_swiglu_impl` / `weighted_bias_swiglu_impl` above (idempotent,
    version-checked)."""
    pairs = (("bias_swiglu_impl", _MEGATRON, bias_swiglu_impl, _EXPECTED),
             ("weighted_bias_swiglu_impl", _MEGATRON_WEIGHTED, weighted_bias_swiglu_impl, _EXPECTED_WEIGHTED))
    if all(getattr(_mlp, name, None) is ours for name, _, ours, _ in pairs):
        return
    import megatron.core

    for name, theirs, _, expected in pairs:
        current = getattr(_mlp, name, None)
        params = tuple(inspect.signature(theirs).parameters)[:len(expected)]
        if current is not theirs or params != expected:
            found = f"{getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', current)}"
            raise RuntimeError(f"models/swiglu.py: megatron-core {megatron.core.__version__}'s MLP calls {found} "
                               f"instead of fused_bias_swiglu.{name}{expected} (its parameters: {params}); "
                               f"models/swiglu.py must learn this version.")
    for name, _, ours, _ in pairs:
        setattr(_mlp, name, ours)
