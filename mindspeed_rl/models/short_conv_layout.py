"""LFM2's short-convolution layers (models/short_conv.py): which layers, their sizes and weight layouts,
without megatron: the HF bridge (hf_bridge/mapping.py) and the config checks use them before any worker starts.

A conv layer of hidden size H projects B, C and x (H each), convolves B x causally per channel (kernel
short_conv_kernel), multiplies by C and projects back. HF (Lfm2ShortConv) stores in_proj (3 H, H) as
[B | C | x], conv.weight (H, 1, kernel) and out_proj (H, H), with biases when conv_bias is set.

Megatron's mixer splits the channels over TP: its `in_proj_bcx` is column-parallel and interleaved per
channel, [B_c, C_c, x_c] for channel c, so a TP shard of whole channels is a contiguous block and the shards
concatenated in rank order are the whole tensor at any TP; the conv's channels are split the same way (no
regrouping), `conv_out_proj` is row-parallel.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch


def has_short_conv(args: Mapping[str, Any]) -> bool:
    """Whether Megatron-named model args have short-convolution layers (LFM2's short_conv_layers)."""
    return any(args.get("short_conv_layers") or ())


def is_conv_layer(args: Mapping[str, Any], layer: int) -> bool:
    """Whether global layer `layer` mixes tokens with a short convolution."""
    marks = list(args.get("short_conv_layers") or ())
    return layer < len(marks) and bool(marks[layer])


def bcx_from_parts(b: torch.Tensor, c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Megatron's in_proj_bcx (weight or bias) from the B, C and x rows of the same channels (all, or a TP
    shard's: HF's in_proj [B | C | x] split in three and sliced alike)."""
    return torch.stack([b, c, x], dim=1).reshape(-1, *b.shape[1:])


def bcx_to_hf(weight: torch.Tensor) -> torch.Tensor:
    """HF's in_proj [B | C | x] from megatron's whole in_proj_bcx (weight or bias)."""
    return weight.reshape(-1, 3, *weight.shape[1:]).transpose(0, 1).reshape(weight.shape)
