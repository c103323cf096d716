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
Only the last position's logits are computed. Layers may differ in their window and rotary table
(Gemma's sliding and full layers: models/sliding_window.layer_window, rotary.layer_uses_local_rope);
each CachedCoreAttention is told its layer's, and so is each layer of the compiled step.

Lean decode (`lean_forward`, issue 15): at TP=1 and PP=1 with megatron's dense local-spec layers,
the decode steps skip megatron's module orchestration and run the same operations on the same
weights directly: norms are megatron's own modules; each linear is `matmul(x, W.t()) (+ bias)`
as megatron's linear autograd function computes it (no TP identity regions, no autograd.Function
dispatch, no bias-dropout-add closures). On a 10M model on CPU this is ~40 % of a decode step.
RoPE's cos/sin are computed once per step for all layers (`KVCache.rope`), not once per layer.
Anything else (TP > 1, PP > 1, MoE, cross attention, fused kernels) takes megatron's modules.
A test checks that both paths give the same tokens and log-probs.

Compiled decode (`static_decode_step`, ray_gpt `enforce_eager: false`): the lean step rewritten so
that its shapes do not change from token to token, for torch.compile. The new K/V go in at a 0-d
device-tensor position (`index_copy_`), and the query attends over the whole zero-filled cache with
the keys not written yet masked. The growing-window step above recompiled at every token instead.
The same per-layer maths (`_lean_layer`), on CPU 1.4-1.9x faster decoding in bf16. Each layer is
one nested compile region (`_static_layer`): inductor compiles one layer and reuses it for all, so
the first compile takes ~20 s whatever the depth (107 s for 30 layers as one whole-model graph).

Prepacked weights (bf16 on the CPU, eager and compiled lean steps alike): each linear's matmul reads
a copy of its weight in oneDNN's blocked layout, made once per generate() by the engine
(platform/packed_linear.py), instead of oneDNN reordering the weight at every call; bitwise the
same results, 1.3x faster decoding at 50M.

Pipeline parallelism: each rank's GPTModel is one stage (pre_process / post_process as megatron
builds it), so the cache holds this stage's layers only, indexed locally. A stage without the
embedding reads the previous stage's hidden states from `model.set_input_tensor` (as megatron's
schedules do); a stage without the output layer returns its hidden states for the next stage.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator, Optional

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb  # noqa: E402
from megatron.core.transformer.identity_op import IdentityOp  # noqa: E402

from mindspeed_rl.models import swiglu  # noqa: E402
from mindspeed_rl.models.cohere import mlp_input  # noqa: E402
from mindspeed_rl.models.olmo import clipped_qkv  # noqa: E402
from mindspeed_rl.models.gemma import post_norm, softcap  # noqa: E402
from mindspeed_rl.models.qk_norm_after_rope import AfterRope, cached_norms, rotated_norms, set_position_ids  # noqa: E402
from mindspeed_rl.models.rotary import layer_uses_local_rope, layer_uses_rope, rope_mscale, rotate_half  # noqa: E402
from mindspeed_rl.models.multipliers import multiplier, scaled  # noqa: E402
from mindspeed_rl.models.gpt_oss import sinks_of  # noqa: E402
from mindspeed_rl.models.sliding_window import layer_window, window_mask  # noqa: E402
from mindspeed_rl.platform.packed_linear import matmul_t  # noqa: E402


class KVCache:
    """K and V of every layer for the rows still generating: (b, groups/TP, max_len, head_dim) each,
    valid up to `length` (the same for all rows: prompts are left-padded to one width). Multi-latent
    attention keeps its latent in k and its RoPE key in v instead, (b, 1, max_len, width) each
    (mla_cached_attention)."""

    def __init__(self, num_layers: int, batch: int, groups: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, rotary_freqs: Optional[torch.Tensor], zeroed: bool = False,
                 mscale: float = 1.0, window: Optional[int] = None, local_freqs: Optional[torch.Tensor] = None,
                 v_head_dim: Optional[int] = None, no_kv: frozenset = frozenset(), shapes: Optional[dict] = None):
        # zeroed: positions not written yet hold 0, not garbage (static_decode_step attends over
        # them, masked: 0 x NaN would poison the context)
        self.zeroed = zeroed
        new = torch.zeros if zeroed else torch.empty
        # shapes: layer -> (groups, head_dim) where a layer's differ from the model's (Gemma 4's sliding layers)
        own = lambda i: (shapes or {}).get(i, (groups, head_dim))  # noqa: E731
        k_shape = lambda i: (batch, own(i)[0], max_len, own(i)[1])  # noqa: E731
        v_shape = lambda i: (batch, own(i)[0], max_len, own(i)[1] if i in (shapes or {}) else v_head_dim or head_dim)  # noqa: E731
        kept = lambda shape, i: shape if i not in no_kv else (*shape[:2], 0, shape[3])  # noqa: E731  (no_kv: none)
        self.k = [_static_dims(new(kept(k_shape(i), i), dtype=dtype, device=device), zeroed) for i in range(num_layers)]
        self.v = [_static_dims(new(kept(v_shape(i), i), dtype=dtype, device=device), zeroed) for i in range(num_layers)]
        self.length = 0
        # (max_len, 1, 1, rot_dim) megatron RotaryEmbedding output; None for multi-latent attention, whose
        # layers rotate with their own table (mla_cached_attention)
        self.freqs = rotary_freqs
        self.mscale = mscale  # cos / sin scale (models/rotary.rope_mscale)
        self.local_freqs = local_freqs  # the sliding layers' own table (Gemma 3; models/gemma.py), or None
        if zeroed and rotary_freqs is not None:  # its own tensor, not a view of megatron's cached table (Dynamo would size the base)
            self.freqs = _static_dims(rotary_freqs.clone(), True, (1, 2, 3))
            if local_freqs is not None:
                self.local_freqs = _static_dims(local_freqs.clone(), True, (1, 2, 3))
        self.lean = False  # forward_stage runs lean_forward (set by the engine when lean_supported)
        self.packed = False  # lean_forward's matmuls read prepacked weights (set by the engine)
        self._rope: dict = {}  # local? -> ((start, end, dtype), (cos, sin)) of the current step
        self.window = window  # sliding-window attention (models/sliding_window.py)
        self._band: tuple = (None, None)  # ((start, end), window mask) of the current step
        self.delta: dict = {}  # layer index (a no_kv one) -> DeltaState of a Gated DeltaNet layer (Qwen3.5; new_cache)
        self.hybrid: frozenset = frozenset()  # layers with keys / values and a Mamba-2 state in .delta (Falcon-H1)
        self.attention_free: frozenset = frozenset()  # layers without an attention slot (Nemotron-H's MLP ones; new_cache)

    def rope(self, start: int, end: int, dtype: torch.dtype, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (s, 1, 1, rot) of positions start..end-1 in `dtype` of the model's table (times
        mscale), or of the local one (unscaled: the sliding layers' default rope): computed by the first
        layer of a step that needs them, reused by
        the others (megatron recomputes them in every layer)."""
        key = (start, end, dtype)
        hit = self._rope.get(local)
        if hit is None or hit[0] != key:
            freqs = (self.local_freqs if local else self.freqs)[start:end]
            m = 1.0 if local else self.mscale  # the local table is the default rope, unscaled
            hit = (key, ((torch.cos(freqs) * m).to(dtype), (torch.sin(freqs) * m).to(dtype)))
            self._rope[local] = hit
        return hit[1]

    def windowed(self, mask: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """`mask` (b, 1, end - start, end) with the sliding window's band masked too (the band computed
        by the first layer of a step, reused by the others); `mask` itself without a window."""
        if not self.window:
            return mask
        if self._band[0] != (start, end):
            self._band = ((start, end), window_mask(start, end - start, end, self.window, mask.device))
        return mask | self._band[1]

    @property
    def nbytes(self) -> int:
        states = [t for d in self.delta.values() for t in (d.conv, d.recurrent) if t is not None]
        return sum(t.numel() * t.element_size() for t in self.k + self.v + states)

    def keep(self, rows: torch.Tensor) -> None:
        """Drop finished rows: keep `rows` (indices into the current batch) of every layer. Copies
        only the filled part; one layer at a time, so the transient extra memory is one layer's."""
        def shrink(t):
            shape = (rows.numel(), *t.shape[1:])
            out = t.new_zeros(shape) if self.zeroed else t.new_empty(shape)
            out[:, :, :self.length] = t[rows, :, :self.length]
            return out

        self.k = [_static_dims(shrink(t), self.zeroed) for t in self.k]
        self.v = [_static_dims(shrink(t), self.zeroed) for t in self.v]
        for state in self.delta.values():
            state.keep(rows)


def _static_dims(t: torch.Tensor, static: bool, dims: tuple = (1, 3)) -> torch.Tensor:
    """t with `dims` marked static for torch.compile (static_decode_step, dynamic shapes): the cache's
    query groups and head dim, the rotary table's (1, 1, rot). Only the batch and the cache length
    vary. Otherwise Dynamo makes them symbols and specialises them inside the layer region, which
    its reuse of the region for the next layers does not survive (KeyError in invoke_subgraph's
    stamp-out, torch 2.13, at a recompile for a batch of 1)."""
    if static:
        for d in dims:
            torch._dynamo.mark_static(t, d)
    return t


class CachedCoreAttention(torch.nn.Module):
    """Drop-in for megatron's core attention (DotProductAttention's forward signature) that
    applies RoPE, appends K/V to the cache and attends over everything cached so far.

    Masks are megatron's: bool (b, 1, s, k), True = may not attend; k = cache.length + s.
    """

    def __init__(self, index: int, original: torch.nn.Module, cache: KVCache, rope: bool = True,
                 windowed: bool = True, local: bool = False, norms=None, source: Optional[int] = None):
        super().__init__()
        config = original.config
        self.index, self.cache, self.config = index, cache, config
        # KV sharing (Gemma 4 E2B: models/gemma4.py): the cache index of the layer whose keys and values this one
        # attends over (written by that layer earlier in the same step); this layer keeps none of its own
        self.source = source
        groups = config.num_query_groups or config.num_attention_heads
        self.groups = groups // config.tensor_model_parallel_size  # this TP rank's query groups
        self.scale = _attention_scale(config)
        self.own_rope = _own_rope(config)
        self.rope = rope  # False in a NoPE layer (models/rotary.layer_uses_rope)
        self.windowed = windowed  # the cache's sliding window applies to this layer (sliding_window.layer_window)
        self.local = local  # rotates with the cache's local table (rotary.layer_uses_local_rope)
        self.sinks = sinks_of(original)  # gpt-oss's attention sinks (this rank's heads), or None
        # (q, k, start) -> (q, k): HunYuan's q / k norms after RoPE (models/qk_norm_after_rope.cached_norms), or None
        self.norms = norms

    def _rotate(self, t: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """megatron's _apply_rotary_pos_emb_bshd: t (s, b, heads, hn) at positions start..end-1."""
        if not self.rope:
            return t
        if not self.own_rope:
            freqs = self.cache.local_freqs if self.local else self.cache.freqs
            return apply_rotary_pos_emb(t, freqs[start:end], self.config, mscale=1.0 if self.local else self.cache.mscale)
        cos, sin = self.cache.rope(start, end, t.dtype, self.local)
        return rotate_half(t, cos, sin)  # the training forward's rotation (models/rotary.py)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("rollout KV cache: packed sequences / attention bias are not supported")
        cache, i = self.cache, self.index
        s = query.shape[0]  # query (s, b, np, hn); key/value (s, b, ng, hn)
        start, end = cache.length, cache.length + s
        query = self._rotate(query, start, end)
        if self.source is not None:
            k, v = cache.k[self.source][:, :, :end], cache.v[self.source][:, :, :end]
            mask = cache.windowed(attention_mask, start, end) if self.windowed else attention_mask
            return grouped_attention(query, k, v, mask, self.groups, self.scale, _score_cap(self.config), self.sinks)
        key = self._rotate(key, start, end)
        if self.norms is not None:
            query, key = self.norms(query, key, start)
        cache.k[i][:, :, start:end] = key.permute(1, 2, 0, 3)  # (b, ng, s, hn)
        cache.v[i][:, :, start:end] = value.permute(1, 2, 0, 3)
        k, v = cache.k[i][:, :, :end], cache.v[i][:, :, :end]  # (b, ng, end, hn) views
        mask = cache.windowed(attention_mask, start, end) if self.windowed else attention_mask
        return grouped_attention(query, k, v, mask, self.groups, self.scale, _score_cap(self.config), self.sinks)


def _attention_scale(config) -> float:
    """DotProductAttention's softmax_scale / layer_number on the scores, times layer_number in the fp32
    softmax when apply_query_key_layer_scaling: the product is what matters."""
    return config.softmax_scale or 1.0 / math.sqrt(config.kv_channels)


def _score_cap(config) -> Optional[float]:
    """The attention scores' soft cap (Gemma 2's attn_logit_softcapping), or None."""
    return getattr(config, "attn_logit_softcapping", None)


def _own_rope(config) -> bool:
    """megatron's non-interleaved RoPE, rotated here with cos/sin shared by the layers of a step; other
    variants (interleaved, MLA's mscale) go through megatron's apply_rotary_pos_emb."""
    return not getattr(config, "rotary_interleaved", False) and not getattr(config, "multi_latent_attention", False)


def grouped_attention(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, groups: int,
                      scale: float, cap: Optional[float] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v with GQA as a grouped matmul (no repeat of the cache); with
    `cap` the scores are soft-capped first (cap x tanh(score / cap), Gemma 2); with `sinks` (heads,)
    each head's sink logit joins its softmax and its column is dropped after (gpt-oss).

    query (s, b, heads, hn); k, v (b, groups, keys, hn); mask (b, 1, s, keys) bool, True = may not
    attend. Scores and softmax in fp32. Returns (s, b, heads * hn)."""
    s, b, heads = query.shape[0], query.shape[1], query.shape[2]
    keys = k.shape[2]
    per_group = heads // groups
    q = query.permute(1, 2, 0, 3).reshape(b, groups, per_group * s, -1)  # (b, ng, q*s, hn)
    scores = softcap(torch.matmul(q, k.transpose(-1, -2)).float() * scale, cap)  # (b, ng, q*s, keys)
    scores = scores.view(b, groups, per_group, s, keys)
    scores = scores.masked_fill(mask[:, :, None], torch.finfo(torch.float32).min)
    if sinks is not None:  # (heads,) -> one more column per (group, head, query)
        sink = sinks.float().view(1, groups, per_group, 1, 1).expand(b, groups, per_group, s, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        probs = probs.to(v.dtype).reshape(b, groups, per_group * s, keys)
    else:
        probs = torch.softmax(scores, dim=-1).to(v.dtype).view(b, groups, per_group * s, keys)
    context = torch.matmul(probs, v)  # (b, ng, q*s, hn)
    context = context.view(b, heads, s, -1).permute(2, 0, 1, 3)  # (s, b, np, hn)
    return context.reshape(s, b, -1)


def mla_cached_attention(a: torch.nn.Module, index: int, cache: KVCache, hidden: torch.Tensor,
                         attention_mask: torch.Tensor) -> tuple:
    """Multi-latent attention (megatron's MLASelfAttention `a`) over `cache` holding what MLA compresses:
    per token and layer the normalised latent (kv_lora_rank) and the rotated RoPE key (shared by the
    heads), in cache.k / cache.v (b, 1, max_len, width). The key / value up projection is absorbed
    into the query and the output as DeepSeek (and vLLM) decode: scores = (q_nope W_UK) . latent +
    q_pe . k_pe, context = (probs . latent) W_UV, so the cache stays 576 numbers per token in
    DeepSeek-V3 (the full keys and values would be heads x (192 + 128)). Same maths as megatron's MLA
    forward, other rounding. hidden (s, b, h) -> (output, bias) as megatron's attention returns them;
    advances nothing (forward_stage advances cache.length)."""
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region as gather

    c = a.config
    s, b = hidden.shape[0], hidden.shape[1]
    heads, nope, rope, v_dim, rank = (a.num_attention_heads_per_partition, c.qk_head_dim, c.qk_pos_emb_head_dim,
                                      c.v_head_dim, c.kv_lora_rank)
    start, end = cache.length, cache.length + s
    if c.q_lora_rank is not None:
        q_c, _ = a.linear_q_down_proj(hidden)
        if q_c.shape[-1] != c.q_lora_rank:  # split over TP (megatron's local spec)
            q_c = gather(q_c)
        q, _ = a.linear_q_up_proj(a.q_layernorm(q_c))
    else:
        q, _ = a.linear_q_proj(hidden)
    q_nope, q_pe = q.view(s, b, heads, nope + rope).split([nope, rope], dim=-1)
    kv, _ = a.linear_kv_down_proj(hidden)
    if kv.shape[-1] != rank + rope:
        kv = gather(kv)
    latent, k_pe = kv.split([rank, rope], dim=-1)
    latent = a.kv_layernorm(latent)
    table = a.rotary_pos_emb(end)  # YaRN: (table, mscale); megatron lru-caches it
    freqs, mscale = table if isinstance(table, tuple) else (table, 1.0)
    q_pe = apply_rotary_pos_emb(q_pe, freqs[start:end], c, mscale=mscale)
    k_pe = apply_rotary_pos_emb(k_pe.unsqueeze(2), freqs[start:end], c, mscale=mscale)[:, :, 0]  # (s, b, rope)
    cache.k[index][:, 0, start:end] = latent.transpose(0, 1)
    cache.v[index][:, 0, start:end] = k_pe.transpose(0, 1)
    lat, pe = cache.k[index][:, :, :end], cache.v[index][:, :, :end]  # (b, 1, end, rank), (b, 1, end, rope)
    w = a.linear_kv_up_proj.weight.view(heads, nope + v_dim, rank)  # this rank's heads: [k_nope | v] rows each
    q_lat = torch.einsum("sbhn,hnr->bhsr", q_nope, w[:, :nope])  # (b, h, s, rank)
    scores = torch.matmul(q_lat, lat.transpose(-1, -2)) + torch.matmul(q_pe.permute(1, 2, 0, 3), pe.transpose(-1, -2))
    scores = scores.float() * a.core_attention.softmax_scale  # (b, h, s, end)
    scores = scores.masked_fill(attention_mask, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(lat.dtype)
    context = torch.einsum("bhsr,hvr->sbhv", torch.matmul(probs, lat), w[:, nope:])  # (s, b, h, v)
    return a.linear_proj(context.reshape(s, b, heads * v_dim))


def _mla_forward(attention: torch.nn.Module, index: int, cache: KVCache):
    """MLASelfAttention.forward's signature over mla_cached_attention."""
    def forward(hidden_states, attention_mask, key_value_states=None, inference_context=None, rotary_pos_emb=None,
                rotary_pos_cos=None, rotary_pos_sin=None, attention_bias=None, packed_seq_params=None,
                position_ids=None, sequence_len_offset=None, **kwargs):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("rollout KV cache: packed sequences / attention bias are not supported")
        return mla_cached_attention(attention, index, cache, hidden_states, attention_mask)
    return forward


@contextlib.contextmanager
def cached_attention(model: torch.nn.Module, cache: KVCache) -> Iterator[None]:
    """Swap every layer's core attention for CachedCoreAttention over `cache` (a multi-latent attention
    layer's whole forward for mla_cached_attention); restore on exit."""
    layers = list(model.decoder.layers)
    attentions = [layer.self_attention for layer in layers]
    originals = [getattr(a, "core_attention", None) for a in attentions]
    mla = getattr(model.config, "multi_latent_attention", False)
    index_of = {layer.layer_number - 1: i for i, layer in enumerate(layers)}  # global layer -> cache index
    try:
        for i, (layer, a, orig) in enumerate(zip(layers, attentions, originals)):
            n = layer.layer_number
            if i in cache.attention_free:  # an MLP-only layer (Nemotron-H: models/hybrid_pattern.py)
                continue
            if i in cache.delta:  # a Gated DeltaNet layer (Qwen3.5): its own forward, from and into its state
                a.forward = functools.partial(type(a).forward, a, delta_state=cache.delta[i])
                if i not in cache.hybrid:
                    continue  # (Falcon-H1's: Mamba-2 from its state, beside attention over the cache below)
            if mla:
                a.forward = _mla_forward(a, i, cache)
                continue
            a.core_attention = CachedCoreAttention(i, orig, cache, layer_uses_rope(model.config, n),
                                                   layer_window(model.config, n) is not None,
                                                   layer_uses_local_rope(model.config, n),
                                                   cached_norms(model, a),
                                                   index_of.get(getattr(a, "kv_source", None)))
        yield
    finally:
        for a, orig in zip(attentions, originals):
            if orig is not None:
                a.core_attention = orig
            a.__dict__.pop("forward", None)  # MLA, Gated DeltaNet: the class's forward again


def new_cache(model: torch.nn.Module, batch: int, max_len: int, zeroed: bool = False) -> KVCache:
    """An empty cache sized for this rank's model chunk (its TP share of the query groups);
    zeroed for static_decode_step."""
    config = model.config
    groups = (config.num_query_groups or config.num_attention_heads) // config.tensor_model_parallel_size
    param = next(model.parameters())
    local = model.local_rotary_pos_emb(max_len) if hasattr(model, "local_rotary_pos_emb") else None
    if getattr(config, "multi_latent_attention", False):  # the latent and the RoPE key: mla_cached_attention
        return KVCache(len(model.decoder.layers), batch, 1, max_len, config.kv_lora_rank, param.dtype, param.device,
                       None, zeroed, v_head_dim=config.qk_pos_emb_head_dim)
    freqs = model.rotary_pos_emb(max_len)  # (max_len, 1, 1, rot); megatron lru-caches it
    # Gated DeltaNet layers (Qwen3.5) and Mamba-2 ones (Granite 4.0-H, models/mamba2.py) keep a conv history and a
    # state per row instead of keys and values; LFM2's short-convolution layers (models/short_conv.py) a conv history
    delta = {i: layer.self_attention for i, layer in enumerate(model.decoder.layers)
             if getattr(layer.self_attention, "delta_state", None) is not None}
    # Falcon-H1's layers (models/parallel_hybrid.py) keep both: keys and values, and their Mamba-2 mixer's state
    hybrid = {i: layer.self_attention.mamba for i, layer in enumerate(model.decoder.layers)
              if getattr(layer.self_attention, "mamba", None) is not None}
    # layers whose one block is an MLP (Nemotron-H: models/hybrid_pattern.py) keep nothing
    free = frozenset(i for i, layer in enumerate(model.decoder.layers) if isinstance(layer.self_attention, IdentityOp))
    # layers attending over an earlier layer's keys and values (Gemma 4 E2B's KV sharing) keep none of their own
    shared = frozenset(i for i, layer in enumerate(model.decoder.layers)
                       if getattr(layer.self_attention, "kv_source", None) is not None)
    # layers built from a config of their own sizes (Gemma 4's sliding layers: models/gemma4.ShapedLayer)
    shapes = {i: (layer.self_attention.num_query_groups_per_partition, layer.self_attention.hidden_size_per_attention_head)
              for i, layer in enumerate(model.decoder.layers) if i not in free and i not in delta
              and layer.config is not config and (layer.config.kv_channels, layer.config.num_query_groups)
              != (config.kv_channels, config.num_query_groups)}
    cache = KVCache(len(model.decoder.layers), batch, groups, max_len, config.kv_channels, param.dtype,
                    param.device, freqs, zeroed, rope_mscale(config), getattr(config, "attention_window", None), local,
                    no_kv=frozenset(delta) | free | shared, shapes=shapes)
    cache.delta = {i: mixer.delta_state(batch) for i, mixer in {**delta, **hybrid}.items()}
    cache.attention_free, cache.hybrid = free, frozenset(hybrid)
    return cache


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
    set_position_ids(model, position_ids)  # HunYuan's norms after RoPE turn each row to them (models/qk_norm_after_rope.py)
    if cache is not None and getattr(cache, "lean", False):
        return lean_forward(model, input_ids, position_ids, attention_mask, cache)
    hidden = model.embedding(input_ids=input_ids, position_ids=position_ids) if model.pre_process else None
    hidden = model.decoder(hidden_states=hidden, attention_mask=attention_mask)  # (s, b, h), final norm on the last stage
    if cache is not None:
        cache.length += input_ids.shape[1]
    if not model.post_process:
        return hidden
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(hidden[-1:], weight=weight)  # (1, b, V/TP)
    return logits[0]


# ---------------------------------------------------------------------------------------------
# lean decode: megatron's dense layer maths without its module orchestration (TP=1, PP=1)

def lean_supported(model: torch.nn.Module) -> bool:
    """True when `lean_forward` computes exactly what megatron's modules compute for this model:
    the whole model on this rank (TP 1, PP 1), dense local-spec layers (TransformerLayer + MLP, no
    cross attention, no MoE / MLA), pre-norm residuals, unfused bias/activation (or models/swiglu.py's)."""
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.transformer_layer import TransformerLayer

    c = model.config
    if c.tensor_model_parallel_size != 1 or not (model.pre_process and model.post_process):
        return False
    if getattr(c, "num_moe_experts", None) or getattr(c, "multi_latent_attention", False):
        return False
    if getattr(c, "attention_sinks", False):  # gpt-oss's sinks: CachedCoreAttention's path
        return False
    if c.apply_residual_connection_post_layernorm or c.fp32_residual_connection:
        return False
    if c.bias_activation_fusion and not swiglu.runs(c):  # models/swiglu.py's equals the unfused glu below
        return False
    for layer in model.decoder.layers:
        a = layer.self_attention
        if type(layer) is not TransformerLayer or type(layer.mlp) is not MLP:
            return False
        if type(a) is not SelfAttention:  # Qwen3.5's Gated DeltaNet and output-gated attention: megatron's path
            return False
        if not isinstance(layer.cross_attention, IdentityOp) or not isinstance(layer.pre_cross_attn_layernorm, IdentityOp):
            return False
        fused_norm = isinstance(layer.input_layernorm, IdentityOp) and getattr(c, "pre_norm", True)
        if getattr(a.linear_qkv, "skip_bias_add", False) or fused_norm:
            return False  # a norm fused into the qkv linear (TE spec) or a bias kept apart: megatron's path
    return True


def _linear(x: torch.Tensor, module: torch.nn.Module, packed: bool = False) -> torch.Tensor:
    """A megatron (column/row) parallel linear at TP=1: matmul(x, W.t()) + bias, as its autograd
    function computes it (matmul then add, not addmm, so the rounding is the same). packed: the
    matmul reads W's prepacked copy when the engine made one (platform/packed_linear.py; same bits)."""
    out = matmul_t(x, module.weight) if packed else torch.matmul(x, module.weight.t())
    bias = getattr(module, "bias", None)
    return out + bias if bias is not None else out


def lean_forward(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 attention_mask: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """forward_stage for a `lean_supported` model: (b, V) logits of the last position."""
    hidden = model.embedding(input_ids=input_ids, position_ids=position_ids)  # (s, b, h)
    # CachedCoreAttention: RoPE + cache + softmax
    hidden = _lean_layers(model, hidden, lambda i, a, q, k, v: a.core_attention(q, k, v, attention_mask),
                          cache.packed)
    cache.length += hidden.shape[0]
    return _lean_logits(model, hidden, cache.packed)


def _lean_layers(model: torch.nn.Module, hidden: torch.Tensor, attend, packed: bool = False) -> torch.Tensor:
    """The decoder layers of a `lean_supported` model on hidden (s, b, h); attend(i, attention
    module, q, k, v) -> context (s, b, heads * hn) is the core attention of layer i, given
    un-rotated q (s, b, heads, hn) and k, v (s, b, groups, hn). packed: see _linear."""
    for i, layer in enumerate(model.decoder.layers):
        hidden = _lean_layer(layer, hidden, functools.partial(attend, i), packed)
    return hidden


def _lean_layer(layer: torch.nn.Module, hidden: torch.Tensor, attend, packed: bool = False) -> torch.Tensor:
    """One decoder layer of _lean_layers; attend(attention module, q, k, v) -> context."""
    c = layer.config
    s, b = hidden.shape[0], hidden.shape[1]
    a = layer.self_attention
    layer_input = hidden
    x = layer.input_layernorm(hidden)
    groups, per_group = a.num_query_groups_per_partition, a.num_attention_heads_per_partition // a.num_query_groups_per_partition
    hn = a.hidden_size_per_attention_head
    qkv = clipped_qkv(_linear(x, a.linear_qkv, packed), getattr(c, "clip_qkv", None))  # OLMo's clamp (models/olmo.py)
    qkv = qkv.view(s, b, groups, (per_group + 2) * hn)
    q, k, v = torch.split(qkv, [per_group * hn, hn, hn], dim=3)
    q = q.reshape(s, b, -1, hn)
    if a.q_layernorm is not None:
        q = a.q_layernorm(q)
    if a.k_layernorm is not None:
        k = a.k_layernorm(k)
    out = post_norm(layer, "post_self_attn_layernorm", _linear(attend(a, q, k, v), a.linear_proj, packed))  # Gemma's
    residual = multiplier(c, "residual_multiplier")  # Granite's (models/multipliers.py)
    hidden = hidden + scaled(out, residual)  # bias-dropout-add: (out + bias) + residual, dropout off in eval
    # a parallel residual (Cohere, Phi-2, GPT-NeoX) normalises the layer input for the MLP (models/cohere.py)
    x = mlp_input(layer, layer_input, x, hidden)
    h1 = _linear(x, layer.mlp.linear_fc1, packed)
    if c.gated_linear_unit:
        gate, up = torch.chunk(h1, 2, dim=-1)
        h1 = c.activation_func(gate) * up
    else:  # the MLP's own: Apertus's per-layer xIELU module (models/xielu.py), else the config's
        h1 = layer.mlp.activation_func(h1)
    return hidden + scaled(post_norm(layer, "post_mlp_layernorm", _linear(h1, layer.mlp.linear_fc2, packed)), residual)


def output_weight(model: torch.nn.Module) -> torch.Tensor:
    """The output layer's (V/TP, h) weight: the word embeddings' when they are shared."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def decode_weights(model: torch.nn.Module) -> list:
    """The weights the lean decode path multiplies by (every linear and the output layer's), for
    platform/packed_linear.packed_weights."""
    weights = []
    for layer in model.decoder.layers:
        weights += [layer.self_attention.linear_qkv.weight, layer.self_attention.linear_proj.weight,
                    layer.mlp.linear_fc1.weight, layer.mlp.linear_fc2.weight]
    return weights + [output_weight(model)]


def _lean_logits(model: torch.nn.Module, hidden: torch.Tensor, packed: bool = False) -> torch.Tensor:
    """(b, V) logits of the last position of hidden (s, b, h), after the final norm."""
    hidden = model.decoder.final_layernorm(hidden[-1:])  # only the last position's logits are needed
    weight = output_weight(model)
    out = matmul_t(hidden[0], weight) if packed else torch.matmul(hidden[0], weight.t())
    bias = getattr(model.output_layer, "bias", None)
    out = out + bias if bias is not None else out
    out = softcap(out, getattr(model.config, "output_logit_softcapping", None))  # Gemma 2's (models/gemma.py)
    return scaled(out, multiplier(model.config, "logits_multiplier"))  # (b, V)


# ---------------------------------------------------------------------------------------------
# compiled decode (enforce_eager: false): one shape-stable step for torch.compile

def compile_unsupported(model: torch.nn.Module, platform_name: str) -> Optional[str]:
    """Why the decode step of this model cannot be compiled here (None: it can): a phrase for the
    engine's log line."""
    from mindspeed_rl.platform.base import compiled_decode

    if not compiled_decode(platform_name):
        return (f"torch.compile on {platform_name} needs a backend the native engine does not wire (Ascend: "
                f"torchair); rollout_engine: vllm compiles there")
    if not lean_supported(model):
        c = model.config
        hybrid = any(type(layer.self_attention).__name__ in ("GatedDeltaNet", "OutputGatedSelfAttention", "Mamba2Mixer",
                                                             "ParallelHybridAttention", "ShortConv")
                     or isinstance(layer.self_attention, IdentityOp) or isinstance(getattr(layer, "mlp", None), IdentityOp)
                     for layer in model.decoder.layers)  # (IdentityOp: Nemotron-H's one-block layers)
        return (f"only dense models on one rank are compiled (TP 1, PP 1, no MoE, no multi-latent attention, no "
                f"linear or gated attention); this one has TP "
                f"{c.tensor_model_parallel_size}, {'all stages' if model.pre_process and model.post_process else 'one pipeline stage'}"
                f"{', MoE' if getattr(c, 'num_moe_experts', None) else ''}"
                f"{', multi-latent attention' if getattr(c, 'multi_latent_attention', False) else ''}"
                f"{', Gated DeltaNet / Mamba-2 / short-convolution / output-gated attention / one-block layers' if hybrid else ''}")
    return None


def static_decode_step(model: torch.nn.Module, input_ids: torch.Tensor, key_mask: torch.Tensor,
                       position: torch.Tensor, cache_k: list, cache_v: list, freqs: torch.Tensor,
                       packed: bool = False, local_freqs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One decode step of a `lean_supported` model whose every shape stays the same from step to
    step, so that torch.compile builds one graph for the whole generation (and for later ones: the
    batch and cache length are dynamic dimensions of that graph).

    What changes against lean_forward's step (same maths): the new keys/values are written at the
    sequence index `position` (a 0-d device tensor, not a Python int) with index_copy_, and every
    query attends over the whole cache (max_len keys), the keys not written yet hidden by key_mask
    like padding (the cache is zero-filled, so they are finite and their weights are exactly 0).

    Args:
        input_ids: (b, 1) the tokens chosen last step.
        key_mask: (b, max_len) 1 on real keys, the new token's position included.
        position: () long, the sequence index of the new token (P + t).
        cache_k / cache_v: per layer (b, groups, max_len, hn), updated in place.
        freqs: (max_len, 1, 1, rot) megatron's rotary table for the cache length.
        packed: the matmuls read the engine's prepacked weights (see _linear); a constant of the graph.
        local_freqs: the sliding layers' own rotary table (KVCache.local_freqs; Gemma 3), or None.
    Returns:
        (b, V) logits.
    """
    visible = key_mask.bool()
    position_ids = visible.long().sum(-1, keepdim=True) - 1  # (b, 1), as the engine's cumsum gives; unused by RoPE
    hidden = model.embedding(input_ids=input_ids, position_ids=position_ids)  # (1, b, h)
    # the strides every layer's output has ((b h, h, 1), not the embedding's (h, h, 1)): the layer
    # region is reused only for inputs of the same metadata, so the first layer would be compiled apart
    hidden = hidden.clone(memory_format=torch.contiguous_format)
    full = ~visible[:, None, None, :]  # (b, 1, 1, max_len)
    window = getattr(model.config, "attention_window", None)
    # sliding-window attention: the keys `window` or more positions back are hidden too
    windowed = full | (torch.arange(full.shape[-1], device=full.device) <= position - window) if window else full
    at = position.view(1)
    m = rope_mscale(model.config)

    def table(freqs, m):
        f = freqs.index_select(0, at)  # (1, 1, 1, rot)
        return f, (torch.cos(f) * m).to(hidden.dtype), (torch.sin(f) * m).to(hidden.dtype)

    rope = table(freqs, m)
    if getattr(model, "after_rope_positions", None) is not None:
        rope = (freqs[1:2], *rope[1:])  # HunYuan: the frequencies themselves, for _static_layer's rotation by row
    local = table(local_freqs, 1.0) if local_freqs is not None else None  # the default rope, unscaled
    # a NoPE layer (SmolLM3) rotates by angle 0 exactly (t * 1 + rotate_half(t) * 0 = t): every layer
    # keeps one graph, where a branch on the layer would make the shared region differ per layer
    f = rope[0]
    no_rope = (torch.zeros_like(f), torch.ones_like(rope[1]), torch.zeros_like(rope[2])) \
        if getattr(model.config, "no_rope_freq", None) else None
    for i, layer in enumerate(model.decoder.layers):
        n = layer.layer_number
        layer_rope = (no_rope if not layer_uses_rope(model.config, n)
                      else local if layer_uses_local_rope(model.config, n) else rope)
        mask = windowed if layer_window(model.config, n) is not None else full
        hidden = _static_layer(layer, hidden, cache_k[i], cache_v[i], mask, at, *layer_rope, packed)
    return _lean_logits(model, hidden, packed)


@torch.compiler.nested_compile_region
def _static_layer(layer: torch.nn.Module, hidden: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                  mask: torch.Tensor, at: torch.Tensor, f: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  packed: bool) -> torch.Tensor:
    """One layer of static_decode_step. A nested compile region: torch.compile compiles it once and
    reuses the code for every layer (same structure, other weights), so the compile time no longer
    grows with the number of layers (SmolLM2-135M's 30 layers: 107 -> 22 s on 2 CPU cores). Runs as
    plain Python when not compiling."""
    c = layer.config

    def attend(a, q, k, v):
        if isinstance(a.q_layernorm, AfterRope):  # HunYuan's norms after RoPE: each row rotated at its position id
            # (its real keys so far - 1; models/qk_norm_after_rope.py), f being the frequencies (position 1's row).
            # Computed here from inputs every layer has: a new input of shape (1, b, 1, rot) made torch.compile's
            # region stamping fail (KeyError)
            angles = ((~mask).sum(-1) - 1).reshape(1, -1, 1, 1).float() * f  # (1, b, 1, rot)
            q, k = rotated_norms(a, q, k, angles)  # turned from position 0 (unrotated) to the position ids
        elif _own_rope(c):
            q, k = rotate_half(q, cos, sin), rotate_half(k, cos, sin)
        else:
            q, k = apply_rotary_pos_emb(q, f, c, mscale=rope_mscale(c)), apply_rotary_pos_emb(k, f, c, mscale=rope_mscale(c))
        cache_k.index_copy_(2, at, k.permute(1, 2, 0, 3))  # (b, ng, 1, hn) at `position`
        cache_v.index_copy_(2, at, v.permute(1, 2, 0, 3))
        return grouped_attention(q, cache_k, cache_v, mask, a.num_query_groups_per_partition, _attention_scale(c),
                                 _score_cap(c))

    return _lean_layer(layer, hidden, attend, packed)


@functools.cache
def compiled_decode_step(backend="inductor"):
    """static_decode_step under torch.compile (inductor, dynamic shapes), one per process: the graph
    is keyed on the model's structure, and its parameters are inputs (not constants), so the
    optimizer's in-place updates reach it. The first call compiles: ~20 s on a 2-core CPU whatever
    the depth (18 s for 10 layers, 22 s for 30: the layer is one nested region); inductor's on-disk
    cache makes later processes faster.

    Dynamo traces with floats specialised (`specialize_float`), for this step only: with dynamic
    shapes it would otherwise lift each norm's eps into the layer region as a symbolic float, which
    inductor cannot compile there (`aten._local_scalar_dense`), and the graph would break at every
    layer. The config is read when Dynamo traces (the first call, or a recompile), so it is set
    around every call (~4 us). `backend`: torch.compile's (tests pass one that records the graph)."""
    step = torch.compile(static_decode_step, dynamic=True, backend=backend)
    config = torch._dynamo.config

    def run(*args):
        before = config.specialize_float
        config.specialize_float = True
        try:
            return step(*args)
        finally:
            config.specialize_float = before

    return run
