"""Rotary position embedding for the training and log-prob forwards: cos/sin once, one rotation op.

Megatron's unfused RoPE (`_apply_rotary_pos_emb_bshd`, megatron-core 0.12 and 0.16) recomputes
cos(freqs) and sin(freqs) for q and for k in every layer, rotates half of the head dimension with
chunk + neg + cat, and always concatenates an (empty, without partial rotary) pass-through slice:
on CPU the profile of a SmolLM2-135M update showed those `cat`s and their backward as the largest
non-matmul cost (issue 15). Here:

- cos and sin are computed once per rotary table: megatron's RotaryEmbedding computes the (s, 1, 1,
  rot) frequency table once per forward (and lru-caches it per length), and every layer receives
  that same tensor object, so `rotary_tables` keys its small cache on the object itself (a strong
  reference plus its version counter, so an in-place edit or a new table is never confused with it);
- the rotation is one autograd Function (`RotateHalf`): out = t * cos + rotate_half(t) * sin written
  as one multiply and two `addcmul_` on the halves, and its exact transpose in backward; no cat,
  nothing saved but cos/sin. Partial rotary (rotary_percent < 1) copies the pass-through part in the
  same output tensor.

The patch point is one attribute: `megatron.core.transformer.attention.apply_rotary_pos_emb`, the
name megatron's Attention.forward calls for q and k (0.12 and 0.16). `install()` checks that it is
still megatron's rope_utils function with the expected parameters and replaces it once; anything
this module does not implement (fused kernels, packed sequences, interleaved rotary, multi-latent
attention) goes to megatron's original, and so does a forward traced by torch.compile
(models/compiled_layers.py): inductor fuses megatron's plain formula and differentiates it itself,
where this module's in-place halves would break the graph. Whether a platform uses it is `platform.own_rotary`
(CPU, CUDA; NPU keeps MindSpeed's fused rope). The rollout engine's lean decode path rotates with
the same `rotate_half` (rollout/kv_cache.py), so rollout and training compute RoPE alike.

A partial-rotary longrope / yarn model (Phi-4-mini) scales cos and sin by its attention factor:
`config.rope_mscale` (models/builder.rope_attention_scaling), which every rotation here and in
the rollout multiplies in (`rope_mscale`); megatron's attention passes no mscale itself.
"""
from __future__ import annotations

import inspect
from collections import OrderedDict

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.models.common.embeddings import rope_utils as _rope_utils  # noqa: E402
from megatron.core.transformer import attention as _attention  # noqa: E402

_MEGATRON = _rope_utils.apply_rotary_pos_emb
_EXPECTED = ("t", "freqs", "config", "cu_seqlens", "mscale")  # leading parameters, 0.12 and 0.16
_TABLES: "OrderedDict[tuple, tuple]" = OrderedDict()  # (id, dtype, mscale) -> (freqs, version, cos, sin)
_MAX_TABLES = 8  # distinct lengths alive at once (micro-batches trimmed to their width, PP stages)


def rotary_tables(freqs: torch.Tensor, dtype: torch.dtype, mscale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos(freqs) * mscale and sin(freqs) * mscale in `dtype`, as megatron computes them; computed
    the first time this table object is seen and reused by every later layer (module docstring)."""
    key = (id(freqs), dtype, float(mscale))
    hit = _TABLES.get(key)
    if hit is not None and hit[0] is freqs and hit[1] == freqs._version:
        _TABLES.move_to_end(key)
        return hit[2], hit[3]
    with torch.no_grad():  # megatron's frequency table carries no gradient
        cos = (torch.cos(freqs) * mscale).to(dtype)
        sin = (torch.sin(freqs) * mscale).to(dtype)
    _TABLES[key] = (freqs, freqs._version, cos, sin)
    _TABLES.move_to_end(key)
    while len(_TABLES) > _MAX_TABLES:
        _TABLES.popitem(last=False)
    return cos, sin


def _rotate_into(out: torch.Tensor, t: torch.Tensor, cos: torch.Tensor, sin_a: torch.Tensor, sin_b: torch.Tensor,
                 sign: float) -> None:
    """out[..., :rot] = t * cos, then on the halves t1, t2 of the rotated part: out1 -= sign * t2 * sin_a,
    out2 += sign * t1 * sin_b. Forward: sin_a, sin_b = the sine halves, sign 1 (rotate_half(t) = (-t2, t1));
    backward: the halves swapped and sign -1, the transpose of that rotation."""
    rot = cos.shape[-1]
    half = rot // 2
    t1, t2 = t[..., :half], t[..., half:rot]
    torch.mul(t[..., :rot], cos, out=out[..., :rot])
    out[..., :half].addcmul_(t2, sin_a, value=-sign)
    out[..., half:rot].addcmul_(t1, sin_b, value=sign)
    if rot < t.shape[-1]:  # partial rotary: the rest passes through
        out[..., rot:].copy_(t[..., rot:])


class RotateHalf(torch.autograd.Function):
    """t (s, b, heads, hn) -> t * cos + rotate_half(t) * sin on the first rot = cos.shape[-1] features
    (cos, sin broadcastable to (s, b, 1, rot)); backward is the transposed rotation."""

    @staticmethod
    def forward(ctx, t, cos, sin):
        ctx.save_for_backward(cos, sin)
        half = cos.shape[-1] // 2
        out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        _rotate_into(out, t, cos, sin[..., :half], sin[..., half:], 1.0)
        return out

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        half = cos.shape[-1] // 2
        out = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
        _rotate_into(out, grad, cos, sin[..., half:], sin[..., :half], -1.0)
        return out, None, None


def rotate_half(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """megatron's non-interleaved RoPE of t (s, ..., hn) with precomputed cos/sin (s, ..., rot).
    Traced by torch.compile (the compiled decode step) it is the plain formula: Dynamo refuses the
    Function's `out=` writes into the non-contiguous rotated part of a partial-rotary head, and
    inductor fuses the plain formula anyway."""
    rot = cos.shape[-1]
    if rot % 2 or rot > t.shape[-1]:
        raise ValueError(f"rotary embedding: {rot} rotary features do not fit a head of {t.shape[-1]}.")
    if not torch.compiler.is_compiling():
        return RotateHalf.apply(t, cos, sin)
    t1, t2, rest = t[..., :rot // 2], t[..., rot // 2:rot], t[..., rot:]
    rotated = t[..., :rot] * cos + torch.cat((-t2, t1), dim=-1) * sin
    return torch.cat((rotated, rest), dim=-1) if rest.shape[-1] else rotated


def layer_uses_rope(config, layer_number: int) -> bool:
    """Whether layer `layer_number` (1-based, megatron's) rotates q and k: not where the model's
    no_rope_freq pattern (models/builder.py; SmolLM3's NoPE layers) has a 1."""
    pattern = getattr(config, "no_rope_freq", None)
    return not (pattern and pattern[layer_number - 1])


def layer_uses_local_rope(config, layer_number: int) -> bool:
    """Whether layer `layer_number` rotates with the local table (config.rope_local_base, Gemma 3's
    sliding layers; models/gemma.py): a model with a local theta, in a layer its window pattern
    (config.window_layers) marks as sliding, or in every layer without a pattern."""
    if getattr(config, "rope_local_base", None) is None:
        return False
    pattern = getattr(config, "window_layers", None)
    return pattern is None or bool(pattern[layer_number - 1])


def rope_mscale(config) -> float:
    """The factor cos and sin are scaled by (1 but for partial-rotary longrope / yarn; module docstring)."""
    return float(getattr(config, "rope_mscale", 1.0))


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, config, cu_seqlens=None, mscale: float = 1.0,
                         **kwargs) -> torch.Tensor:
    """Drop-in for megatron's rope_utils.apply_rotary_pos_emb (same arguments): our rotation where it
    is megatron's unfused bshd path with non-interleaved halves, megatron's own function elsewhere;
    both with the model's rope_mscale."""
    mscale = mscale * rope_mscale(config)
    if (cu_seqlens is not None or torch.compiler.is_compiling() or getattr(config, "apply_rope_fusion", False)
            or getattr(config, "rotary_interleaved", False) or getattr(config, "multi_latent_attention", False)):
        return _MEGATRON(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale, **kwargs)
    cos, sin = rotary_tables(freqs, t.dtype, mscale)
    return rotate_half(t, cos, sin)


def install() -> None:
    """Make megatron's attention call `apply_rotary_pos_emb` above (idempotent, version-checked)."""
    current = getattr(_attention, "apply_rotary_pos_emb", None)
    if current is apply_rotary_pos_emb:
        return
    import megatron.core

    params = tuple(inspect.signature(_MEGATRON).parameters)[:len(_EXPECTED)]
    if current is not _MEGATRON or params != _EXPECTED:
        found = f"{getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', current)}"
        raise RuntimeError(f"models/rotary.py: megatron-core {megatron.core.__version__}'s attention calls {found} "
                           f"instead of rope_utils.apply_rotary_pos_emb{_EXPECTED} (its parameters: {params}); "
                           f"models/rotary.py must learn this version.")
    _attention.apply_rotary_pos_emb = apply_rotary_pos_emb
