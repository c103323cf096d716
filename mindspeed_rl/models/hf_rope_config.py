"""config.json's rope scalings that need more than a rotary base: LongRoPE (longrope_args), YaRN (yarn_args) and
Ministral 3's Llama 4 query scaling, read as a length limit (llama4_scaling_limit). models/hf_config.py calls them
while reading a config.json into megatron's args.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

def llama4_scaling_limit(hf: Mapping[str, Any], rope: Mapping[str, Any]) -> int:
    """Ministral 3 scales each query by 1 + llama_4_scaling_beta x ln(1 + floor(position / original)),
    original = rope_parameters.original_max_position_embeddings (16384): exactly 1 below that length,
    which becomes the length limit here (as LongRoPE's original length: runs stay below it)."""
    return int(rope.get("original_max_position_embeddings") or hf.get("max_position_embeddings", 4096))


def longrope_args(hf: Mapping[str, Any], rope: Mapping[str, Any], rotary_dim: int) -> dict[str, Any]:
    """LongRoPE (Phi-3's 128k variants, Phi-3.5-mini, Phi-4-mini) up to original_max_position_embeddings,
    the length limit here: the inverse frequencies divided by the short factors, and cos / sin scaled
    by the attention factor (transformers' default: sqrt(1 + ln(factor) / ln(original)), factor =
    max_position_embeddings / original): rope_attention_factor (builder.rope_attention_scaling).
    Beyond the original length LongRoPE switches to its long factors; runs stay below it."""
    original = int(rope.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
                   or hf.get("max_position_embeddings", 4096))
    short = [float(f) for f in rope["short_factor"]]
    if len(short) != rotary_dim // 2:
        raise ValueError(f"config.json rope_scaling.short_factor has {len(short)} entries; {rotary_dim} rotated "
                         f"dimensions need {rotary_dim // 2}.")
    factor = float(rope.get("factor") or int(hf.get("max_position_embeddings", original)) / original)
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"rope_scaling_type": "longrope", "rope_short_factor": short, "rope_attention_factor": float(attention),
            "max_position_embeddings": min(int(hf.get("max_position_embeddings", original)), original)}


def yarn_args(hf: Mapping[str, Any], rope: Mapping[str, Any]) -> dict[str, Any]:
    """YaRN (transformers' `_compute_yarn_parameters`, vLLM's YaRNScalingRotaryEmbedding): static, so
    exact at every length. The inverse frequencies blend interpolated (/ factor) and original ones
    over a ramp between the beta_fast and beta_slow rotation counts at the original length (its
    ends rounded outward unless truncate is false), and cos / sin are scaled by the attention factor:
    given, or 0.1 ln(factor) + 1, or with mscale and mscale_all_dim the ratio of two such terms
    (builder.yarn_inv_freq, rope_attention_scaling). MindSpeed-LLM's names."""
    original = int(rope.get("original_max_position_embeddings") or hf.get("max_position_embeddings", 4096))
    factor = rope.get("factor") or int(hf.get("max_position_embeddings", original)) / original
    args = {"rope_scaling_type": "yarn", "rope_scaling_factor": float(factor),
            "original_max_position_embeddings": original,
            "rope_scaling_beta_fast": float(rope.get("beta_fast") or 32),
            "rope_scaling_beta_slow": float(rope.get("beta_slow") or 1),
            "rope_scaling_truncate": bool(rope.get("truncate", True))}
    if rope.get("mscale") and rope.get("mscale_all_dim"):
        args.update(rope_scaling_mscale=float(rope["mscale"]), rope_scaling_mscale_all_dim=float(rope["mscale_all_dim"]))
    if rope.get("attention_factor") is not None:
        args["rope_attention_factor"] = float(rope["attention_factor"])
    return args
