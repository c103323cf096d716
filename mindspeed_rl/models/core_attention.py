"""Fused core attention for megatron's local layer spec: torch's scaled_dot_product_attention.

Megatron's local `DotProductAttention` materialises the (b x heads, sq, sk) scores with baddbmm, a
softmax over them and a bmm, each a pass over S x S floats per head, and repeats K/V for GQA.
`SDPACoreAttention` computes the same softmax(Q K^T * scale + mask) V with one call to
`torch.nn.functional.scaled_dot_product_attention` (a fused, flash-style kernel on CPU and CUDA;
issue 15 / 17). It subclasses DotProductAttention so its constructor, attributes and state dict
(none) stay megatron's, in megatron-core 0.12 and 0.16 alike (same forward signature).

Masks: megatron's bool (b, 1, sq, sk), True = may not attend. Megatron fills masked scores with
-10000 before its softmax; SDPA gets the same additive -10000, so every row with an allowed key
gives the same result. A row with no allowed key (a left-padding query) is padding whatever the
kernel does with it: megatron averages all values there, SDPA the softmax of the unmasked scores.
With no mask and a causal layer, SDPA's own causal mask (`is_causal`) is megatron's default one.

Not handled here (megatron's own forward runs instead): attention dropout while training (megatron
draws it from its TP-aware RNG tracker), attention bias, packed sequences, sliding windows and
megatron 0.16's softmax offsets other than gpt-oss's attention sinks (explicit_attention computes
those, and Gemma 2's soft caps: SDPA has neither). Whether the platform uses this module is `platform.sdpa_core_attention`
(NPU: MindSpeed's fused attention, switched by its own keys). On CPU, bf16 query/key/value attend in
fp32 and the context is rounded back to bf16 (`platform.base.sdpa_in_fp32_for_bf16`: torch's CPU
flash kernel is slower in bf16 there, and fp32 is the more precise). GQA: on CPU the groups' K/V go
to SDPA as they are (`enable_gqa`, `platform.base.sdpa_native_gqa`); elsewhere they are repeated for
their heads, as megatron does.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from mindspeed_rl.platform import get_platform
from mindspeed_rl.platform.base import sdpa_in_fp32_for_bf16, sdpa_native_gqa

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402

from mindspeed_rl.models.gpt_oss import sinks_of  # noqa: E402
from mindspeed_rl.models.spec_tree import swap_in_spec  # noqa: E402

MASKED_SCORE = -10000.0  # megatron's attention_mask_func fill value


class MLACoreAttention(DotProductAttention):
    """megatron's DotProductAttention as multi-latent attention builds it: MLA passes the key and value
    head dimensions (k_channels, v_channels), which megatron-core's local DotProductAttention does
    not take (0.12 and 0.16; only Transformer Engine's does). Its forward reads them from the
    tensors; the output width is kv_channels (= v_head_dim) x heads, as MLA sets it."""

    def __init__(self, *args, k_channels: Any = None, v_channels: Any = None, **kwargs):
        super().__init__(*args, **kwargs)


class SDPACoreAttention(MLACoreAttention):
    """DotProductAttention whose forward is one scaled_dot_product_attention call (see module doc)."""

    def _megatron_only(self, attention_bias, packed_seq_params) -> bool:
        dropout = self.attention_dropout.p > 0 and self.training
        sinks = sinks_of(self) is not None
        megatron = (dropout or attention_bias is not None or packed_seq_params is not None
                    or (getattr(self, "softmax_offset", None) is not None and not sinks)
                    or getattr(self.scale_mask_softmax, "window_size", None) is not None)
        if megatron and (getattr(self.config, "attn_logit_softcapping", None) or sinks):
            raise ValueError(f"{'attention sinks (gpt-oss)' if sinks else 'attn_logit_softcapping (Gemma 2)'} with "
                             f"attention dropout, an attention bias or packed sequences is not supported: megatron's "
                             f"attention does not compute them here; set attention_dropout: 0.")
        return megatron

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """query (sq, b, np, hn), key / value (sk, b, ng, hn), attention_mask bool (b|1, 1, sq, sk) or
        None -> context (sq, b, np * hn), as DotProductAttention.forward."""
        if self._megatron_only(attention_bias, packed_seq_params):
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        sq, b, heads, _ = query.shape
        dtype = query.dtype
        sinks = sinks_of(self)
        if sinks is not None:  # gpt-oss: SDPA has no sink column
            return explicit_attention(query, key, value, attention_mask, self.softmax_scale * self._layer_coeff(),
                                      (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal, sinks=sinks)
        cap = getattr(self.config, "attn_logit_softcapping", None)
        if cap:  # Gemma 2: SDPA has no soft cap
            return explicit_attention(query, key, value, attention_mask, self.softmax_scale * self._layer_coeff(),
                                      (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal, cap=cap)
        bf16_in_fp32 = dtype == torch.bfloat16 and sdpa_in_fp32_for_bf16(get_platform().name)  # CPU
        compute = torch.float32 if bf16_in_fp32 else dtype
        q, k, v = (t.permute(1, 2, 0, 3).to(compute) for t in (query, key, value))  # (b, heads | groups, s, hn)
        per_group = heads // k.shape[1]
        # GQA: as megatron, each group's K/V serves per_group consecutive heads; SDPA's enable_gqa
        # does the same without the repeated copies where the platform's kernel takes it (CPU)
        gqa = per_group > 1 and sdpa_native_gqa(get_platform().name)
        if per_group > 1 and not gqa:
            k, v = k.repeat_interleave(per_group, dim=1), v.repeat_interleave(per_group, dim=1)
        mask, causal = None, False
        if attention_mask is not None:
            mask = torch.zeros(attention_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
                attention_mask, MASKED_SCORE)
        else:
            causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal and sq > 1
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=causal,
                                                 scale=self.softmax_scale * self._layer_coeff(),
                                                 **({"enable_gqa": True} if gqa else {}))
        context = context.to(dtype)
        return context.permute(2, 0, 1, 3).reshape(sq, b, heads * context.shape[-1])  # (sq, b, np * hn)

    def _layer_coeff(self) -> float:
        """apply_query_key_layer_scaling divides softmax_scale by layer_number and multiplies the
        scores back in the softmax: the product is softmax_scale x coeff."""
        coeff = getattr(self.scale_mask_softmax, "scale", None)
        return float(coeff) if coeff is not None else 1.0


def explicit_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask, scale: float,
                       causal: bool = True, cap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) V computed step by step where SDPA cannot: with `cap` the scores are
    soft-capped first, cap x tanh(score / cap) (transformers' eager Gemma 2); with `sinks` (np,) each
    head's sink logit joins its softmax and its column is dropped after (transformers' eager gpt-oss).
    Scores and softmax in fp32, megatron's bool mask (True = may not attend; None = causal when
    `causal`) applied after the cap, GQA groups repeated for their heads. query (sq, b, np, hn), key /
    value (sk, b, ng, hn) -> context (sq, b, np * hn) in value's dtype."""
    sq, b, heads, _ = query.shape
    sk = key.shape[0]
    q = query.permute(1, 2, 0, 3).float()  # (b, np, sq, hn)
    k, v = key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3)  # (b, ng, sk, hn)
    per_group = heads // k.shape[1]
    if per_group > 1:
        k, v = k.repeat_interleave(per_group, dim=1), v.repeat_interleave(per_group, dim=1)
    scores = torch.matmul(q, k.float().transpose(-1, -2)) * scale
    if cap:
        scores = torch.tanh(scores / cap) * cap
    if mask is None and causal and sq > 1:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(sk - sq + 1)[None, None]
    if mask is not None:
        scores = scores.masked_fill(mask, MASKED_SCORE)
    if sinks is not None:
        sink = sinks.float().view(1, heads, 1, 1).expand(b, heads, sq, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].to(value.dtype)
    else:
        probs = torch.softmax(scores, dim=-1).to(value.dtype)
    context = torch.matmul(probs, v)  # (b, np, sq, hn)
    return context.permute(2, 0, 1, 3).reshape(sq, b, -1)


def with_mla_attention(spec: Any) -> Any:
    """A copy of a spec tree with megatron's DotProductAttention swapped for MLACoreAttention (platforms
    without SDPACoreAttention, whose multi-latent attention would not build otherwise)."""
    return swap_in_spec(spec, DotProductAttention, MLACoreAttention)


def with_sdpa_attention(spec: Any) -> Any:
    """A copy of a layer / block spec tree with megatron's DotProductAttention swapped for
    SDPACoreAttention (anything else, e.g. Transformer Engine's attention, is left as it is)."""
    return swap_in_spec(spec, DotProductAttention, SDPACoreAttention)
