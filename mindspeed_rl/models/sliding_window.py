"""Sliding-window attention (Mistral 7B v0.1, Mixtral, Phi-3-mini-4k; Gemma 3's sliding layers): every
layer (or those window_attn_skip_freq marks) attends to at most `window` latest positions, itself
included, as transformers' and vLLM's kernels do.

    install(model, window)           # build time (models/builder.py), every core attention of the chunk
    band = window_mask(start, sq, sk, window, device)   # the rollout's KV-cache paths (rollout/kv_cache.py)

megatron-core 0.12's local attention refuses a window (`config.window_size`), and 0.16's replaces
the padding mask with its own window mask, so neither is used: the window is one more set of masked
scores, OR-ed into the bool mask (True = may not attend) each core attention receives, by a forward
pre-hook. Any core attention that honours megatron's mask then computes the windowed softmax exactly:
models/core_attention.py's SDPA (CPU, CUDA) and megatron's DotProductAttention. NPU attends with
MindSpeed's fused kernel, which builds its own causal mask, so there validation caps the length
limit at the window instead (config/validate.py), where full attention equals the windowed one.

With left padding the positions of a row are shifted alike for its queries and keys, so the window
is a distance in the padded sequence, as in transformers (`kv_idx > q_idx - sliding_window`).
"""
from __future__ import annotations

from typing import Optional

import torch


def window_mask(start: int, sq: int, sk: int, window: int, device: torch.device) -> torch.Tensor:
    """(1, 1, sq, sk) bool, True where query start + i may not attend key j: j > start + i (causal)
    or start + i - j >= window (too far back)."""
    q = torch.arange(start, start + sq, device=device)[:, None]
    k = torch.arange(sk, device=device)[None, :]
    return ((k > q) | (q - k >= window))[None, None]


def windowed(mask: Optional[torch.Tensor], start: int, sq: int, sk: int, window: int,
             device: torch.device) -> torch.Tensor:
    """`mask` (b|1, 1, sq, sk) bool or None (causal) with the window's band masked too."""
    band = window_mask(start, sq, sk, window, device)
    return band if mask is None else mask | band


def layer_window(config, layer_number: int) -> Optional[int]:
    """The window layer `layer_number` (1-based, megatron's) attends within, or None (full
    attention): config.attention_window where config.window_layers (megatron-core's
    window_attn_skip_freq as a 0/1 list, Gemma 3's layer types) marks the layer, or has no pattern."""
    window = getattr(config, "attention_window", None)
    pattern = getattr(config, "window_layers", None)
    if not window or (pattern is not None and not pattern[layer_number - 1]):
        return None
    return int(window)


def install(model: torch.nn.Module, window: int, pattern: Optional[list] = None) -> None:
    """Mask the core attention of `model`'s (a GPTModel chunk) layers to a `window`-position band:
    every layer, or those `pattern` (one 0/1 per layer of the whole model, 1 = sliding) marks. The
    queries are the last sq of the sk keys (training and the log-prob forwards: sq == sk).

    Every layer gets the same hook, which reads its core attention's `attention_window` (None in a
    full-attention layer): the compiled layers (models/compiled_layers.py) share one graph between
    layers, and Dynamo tells them apart by that attribute, where a hook on some layers only went
    unnoticed (its guards missed the difference in the submodule's hooks)."""
    if int(window) < 1:
        raise ValueError(f"sliding_window {window} must be at least 1.")

    def hook(module, args, kwargs):
        if module.attention_window is None:
            return None
        query, key = args[0], args[1]
        mask = args[3] if len(args) > 3 else kwargs.get("attention_mask")
        sq, sk = query.shape[0], key.shape[0]
        mask = windowed(mask, sk - sq, sq, sk, module.attention_window, query.device)
        if len(args) > 3:
            return (*args[:3], mask, *args[4:]), kwargs
        return args, {**kwargs, "attention_mask": mask}

    for layer in model.decoder.layers:
        core = layer.self_attention.core_attention
        core.attention_window = int(window) if pattern is None or pattern[layer.layer_number - 1] else None
        core.register_forward_pre_hook(hook, with_kwargs=True)
