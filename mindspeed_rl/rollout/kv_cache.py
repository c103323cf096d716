"""Our own KV cache for megatron-core's GPTModel: one documented hook instead of megatron's static
inference path.

Why not megatron-core 0.12's `StaticInferenceContext`: it works (left padding included, with an
explicit mask) but stores keys *before* RoPE and re-applies RoPE to the whole cached key tensor in
every layer at every step, and its DotProductAttention `repeat_interleave`s the cache for GQA.
On CPU that made decode ~2x slower than transformers (profile: rope cat/mul/neg and copies took
twice the time of the matmuls). Here keys are stored after RoPE and GQA is a grouped matmul.

The hook: `cached_attention(model, cache)` swaps each layer's `self_attention.core_attention`
(the softmax(QK^T)V part, after the QKV projection and q/k norms) for `CachedCoreAttention` for
the duration of a `with` block and restores the originals on exit. Everything else (embedding,
norms, TP-parallel linears and their all-reduces, MLP, residuals) is megatron's own code.
`forward_stage` runs GPTModel's pieces (embedding -> decoder -> output layer) without
rotary embeddings, so CachedCoreAttention receives un-rotated q/k and applies RoPE itself at
sequence index `cache.length + i`, which is what GPTModel does in the training forward (RoPE by
sequence index; left padding shifts a row uniformly and attention sees relative positions only).
Only the last position's logits are computed.

Pipeline parallelism: each rank's GPTModel is one stage (pre_process / post_process as megatron
builds it), so the cache holds this stage's layers only, indexed locally. A stage without the
embedding reads the previous stage's hidden states from `model.set_input_tensor` (as megatron's
schedules do); a stage without the output layer returns its hidden states for the next stage.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb  # noqa: E402


class KVCache:
    """K and V of every layer for the rows still generating: (b, groups/TP, max_len, head_dim) each,
    valid up to `length` (the same for all rows: prompts are left-padded to one width)."""

    def __init__(self, num_layers: int, batch: int, groups: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, rotary_freqs: torch.Tensor):
        shape = (batch, groups, max_len, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = 0
        self.freqs = rotary_freqs  # (max_len, 1, 1, rot_dim) megatron RotaryEmbedding output

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def keep(self, rows: torch.Tensor) -> None:
        """Drop finished rows: keep `rows` (indices into the current batch) of every layer. Copies
        only the filled part; one layer at a time, so the transient extra memory is one layer's."""
        def shrink(t):
            out = t.new_empty((rows.numel(), *t.shape[1:]))
            out[:, :, :self.length] = t[rows, :, :self.length]
            return out

        self.k = [shrink(t) for t in self.k]
        self.v = [shrink(t) for t in self.v]


class CachedCoreAttention(torch.nn.Module):
    """Drop-in for megatron's core attention (DotProductAttention's forward signature) that
    applies RoPE, appends K/V to the cache and attends over everything cached so far.

    Masks are megatron's: bool (b, 1, s, k), True = may not attend; k = cache.length + s.
    """

    def __init__(self, index: int, original: torch.nn.Module, cache: KVCache):
        super().__init__()
        config = original.config
        self.index, self.cache, self.config = index, cache, config
        heads, groups = config.num_attention_heads, config.num_query_groups or config.num_attention_heads
        tp = config.tensor_model_parallel_size
        self.heads, self.groups = heads // tp, groups // tp
        head_dim = config.kv_channels
        # DotProductAttention: softmax_scale / layer_number on the scores, times layer_number in the
        # fp32 softmax when apply_query_key_layer_scaling: the product is what matters
        self.scale = config.softmax_scale or 1.0 / math.sqrt(head_dim)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("rollout KV cache: packed sequences / attention bias are not supported")
        cache, i = self.cache, self.index
        s, b = query.shape[0], query.shape[1]  # query (s, b, np, hn); key/value (s, b, ng, hn)
        start, end = cache.length, cache.length + s
        freqs = cache.freqs[start:end]  # (s, 1, 1, rot)
        query = apply_rotary_pos_emb(query, freqs, self.config)
        key = apply_rotary_pos_emb(key, freqs, self.config)
        cache.k[i][:, :, start:end] = key.permute(1, 2, 0, 3)  # (b, ng, s, hn)
        cache.v[i][:, :, start:end] = value.permute(1, 2, 0, 3)
        k, v = cache.k[i][:, :, :end], cache.v[i][:, :, :end]  # (b, ng, end, hn) views

        per_group = self.heads // self.groups
        q = query.permute(1, 2, 0, 3).reshape(b, self.groups, per_group * s, -1)  # (b, ng, q*s, hn)
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * self.scale  # (b, ng, q*s, end)
        scores = scores.view(b, self.groups, per_group, s, end)
        scores = scores.masked_fill(attention_mask[:, :, None], torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1).to(v.dtype).view(b, self.groups, per_group * s, end)
        context = torch.matmul(probs, v)  # (b, ng, q*s, hn)
        context = context.view(b, self.heads, s, -1).permute(2, 0, 1, 3)  # (s, b, np, hn)
        return context.reshape(s, b, -1)


@contextlib.contextmanager
def cached_attention(model: torch.nn.Module, cache: KVCache) -> Iterator[None]:
    """Swap every layer's core attention for CachedCoreAttention over `cache`; restore on exit."""
    attentions = [layer.self_attention for layer in model.decoder.layers]
    originals = [a.core_attention for a in attentions]
    try:
        for i, (a, orig) in enumerate(zip(attentions, originals)):
            a.core_attention = CachedCoreAttention(i, orig, cache)
        yield
    finally:
        for a, orig in zip(attentions, originals):
            a.core_attention = orig


def new_cache(model: torch.nn.Module, batch: int, max_len: int) -> KVCache:
    """An empty cache sized for this rank's model chunk (its TP share of the query groups)."""
    config = model.config
    groups = (config.num_query_groups or config.num_attention_heads) // config.tensor_model_parallel_size
    param = next(model.parameters())
    freqs = model.rotary_pos_emb(max_len)  # (max_len, 1, 1, rot); megatron lru-caches it
    return KVCache(len(model.decoder.layers), batch, groups, max_len, config.kv_channels, param.dtype,
                   param.device, freqs)


def forward_stage(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                  attention_mask: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
    """This pipeline stage's part of GPTModel.forward, without rotary embeddings (the cache applies
    them) and with only the last position's logits. Inside `cached_attention(model, cache)`;
    advances cache.length.

    Args:
        input_ids / position_ids: (b, s) new tokens (read by the first stage only: later stages take
            the previous stage's (s, b, h) output, given to `model.set_input_tensor` beforehand);
        attention_mask: (b, 1, s, cache.length + s) bool, True = may not attend.
    Returns:
        last stage: (b, V/TP) logits of the last position (vocab-parallel);
        other stages: (s, b, h) hidden states for the next stage.
    """
    hidden = model.embedding(input_ids=input_ids, position_ids=position_ids) if model.pre_process else None
    hidden = model.decoder(hidden_states=hidden, attention_mask=attention_mask)  # (s, b, h), final norm on the last stage
    if cache is not None:
        cache.length += input_ids.shape[1]
    if not model.post_process:
        return hidden
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(hidden[-1:], weight=weight)  # (1, b, V/TP)
    return logits[0]
