"""config.json's rope scalings that need more than a rotary base: LongRoPE (longrope_args), YaRN (yarn_args),
Ministral 3's Llama 4 query scaling, read as a length limit (llama4_scaling_limit), and dynamic NTK, read as the
default RoPE up to max_position_embeddings (dynamic_ntk_as_default). models/hf_config.py calls them
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


def dynamic_ntk_as_default(hf: Mapping[str, Any], rope: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Dynamic NTK RoPE (rope type `dynamic` with a factor: InternLM3) as the (rope parameters, rope type) the trainer
    computes: the default RoPE at the config's theta. transformers computes the base as
    theta x (factor x max(L, max_position_embeddings) / max_position_embeddings - (factor - 1))^(d / (d - 2)), which is
    theta itself for sequences up to max_position_embeddings, and vLLM's DynamicNTKScalingRotaryEmbedding the same
    with its max_trained_positions at max_position_embeddings (and the engine hands vLLM the default RoPE:
    rollout/vllm_hf_config.vllm_config). Longer sequences are refused (max_position_embeddings is the model's limit)."""
    if not rope.get("factor"):
        raise ValueError("config.json rope type 'dynamic' without a factor is not supported; dynamic NTK needs "
                         "rope_scaling.factor (or remove rope_scaling: up to max_position_embeddings it is no "
                         "scaling at all).")
    original = rope.get("original_max_position_embeddings")
    if original and int(original) != int(hf.get("max_position_embeddings") or 0):
        raise ValueError(f"config.json rope type 'dynamic' with original_max_position_embeddings {original} != "
                         f"max_position_embeddings {hf.get('max_position_embeddings')} is not supported (transformers "
                         f"scales from max_position_embeddings); make them equal or remove rope_scaling.")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    kept = {k: v for k, v in rope.items() if k not in ("type", "rope_type", "factor", "original_max_position_embeddings")}
    return {**kept, "rope_type": "default", "rope_theta": theta}, "default"
