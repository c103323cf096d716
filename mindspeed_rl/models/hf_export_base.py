"""The pieces every config.json writer of models/hf_export_config.py shares: the keys every architecture writes
(base_config, rope_parameters, DTYPE_NAMES), the layer types of windowed models (layer_types_config, per_type_rope),
and the conditions several writers ask of the args (pre_norms_only, plain_scaling, head_dim_is_quotient).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from mindspeed_rl.models.hf_config import no_rope_pattern, window_pattern

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
GRANITE_SCALARS = ("embedding_multiplier_scale", "residual_multiplier", "output_multiplier_scale")  # the keys of Granite's multipliers


def pre_norms_only(args: Mapping[str, Any]) -> bool:
    """Norms before attention and MLP only: no norms after them, no q / k norms, no (1 + w) offset or embedding norm."""
    return not (args.get("pre_norm") is False or args.get("post_norm") or args.get("qk_layernorm")
                or args.get("add_rmsnorm_offset") or args.get("input_embeds_norm"))


def plain_scaling(args: Mapping[str, Any]) -> bool:
    """No Granite multipliers and the default score scale (softmax_scale unset)."""
    return not args.get("softmax_scale") and all(float(args.get(k) or 1.0) == 1.0 for k in GRANITE_SCALARS)


def head_dim_is_quotient(args: Mapping[str, Any]) -> bool:
    """Whether the head dimension is hidden_size / num_attention_heads (config.json without head_dim says so)."""
    heads = int(args["num_attention_heads"])
    return int(args.get("kv_channels") or args["hidden_size"] // heads) * heads == int(args["hidden_size"])


def sliding_nope_layout(args: Mapping[str, Any]) -> tuple[bool, bool]:
    """(hybrid, fits) of the hybrid layers EXAONE 4.0's and Cohere 2's config.json say (models/hf_config.sliding_nope_args):
    whether the args have sliding layers (a sliding_window or window_attn_skip_freq), and whether RoPE is in every
    layer without windows, or in the sliding layers only (no_rope_freq exactly on the full ones)."""
    layers = int(args["num_layers"])
    pattern = window_pattern(args.get("window_attn_skip_freq"), layers)
    hybrid = bool(args.get("sliding_window")) or pattern is not None
    no_rope = no_rope_pattern(args.get("no_rope_freq"), layers) or [0] * layers
    return hybrid, no_rope == ([1 - t for t in pattern or [1] * layers] if hybrid else [0] * layers)


def base_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype, model_type: str, cls: str,
                rope: Mapping[str, Any], eps: float) -> dict[str, Any]:
    """The config.json keys every architecture here shares: sizes, heads, vocabulary, length, norm
    epsilon (`eps` when args have none), rotary embedding (rope_scaling too unless default), ties, dtype."""
    heads = int(args["num_attention_heads"])
    config = {
        "architectures": [cls], "model_type": model_type,
        "hidden_size": int(args["hidden_size"]), "intermediate_size": int(args["ffn_hidden_size"]),
        "num_hidden_layers": int(args["num_layers"]), "num_attention_heads": heads,
        "num_key_value_heads": int(args.get("num_query_groups") or heads) if args.get("group_query_attention") else heads,
        "head_dim": int(args.get("kv_channels") or args["hidden_size"] // heads),
        "vocab_size": int(vocab_size), "max_position_embeddings": int(args.get("max_position_embeddings") or 4096),
        "rms_norm_eps": float(args.get("norm_epsilon") or eps),
        "rope_theta": rope["rope_theta"], "rope_parameters": rope,
        "tie_word_embeddings": not args.get("untie_embeddings_and_output_weights", False),
        "torch_dtype": DTYPE_NAMES.get(dtype, "float32"),
    }
    if rope["rope_type"] != "default":
        config["rope_scaling"] = rope
    return config


def layer_types_config(args: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's sliding_window and layer_types (Gemma 2 / 3, OLMo 3) from window_attn_skip_freq
    (none: every layer slides) and sliding_window (none: the whole length)."""
    pattern = window_pattern(args.get("window_attn_skip_freq"), config["num_hidden_layers"])
    return {"sliding_window": int(args.get("sliding_window") or config["max_position_embeddings"]),
            "layer_types": ["sliding_attention" if x else "full_attention"
                            for x in pattern or [1] * config["num_hidden_layers"]]}


def per_type_rope(args: Mapping[str, Any], rope: Mapping[str, Any]) -> dict[str, Any]:
    """rope_parameters per layer type (Gemma 3, OLMo 3): `rope` for the full layers, the default rope
    at rope_local_base_freq (default: the same theta) for the sliding ones."""
    local = {"rope_type": "default", "rope_theta": float(args.get("rope_local_base_freq") or rope["rope_theta"])}
    return {"full_attention": dict(rope), "sliding_attention": local}


def rope_parameters(args: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's rope_parameters for Megatron-named args (the inverse of hf_config's reading).
    longrope is written with the short factors as the long ones too and its original length equal to
    max_position_embeddings (the length limit here), so that every reader (transformers, vLLM) uses
    the short factors, with the attention factor as vLLM's short_mscale as well."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(args.get("rotary_base") or 10000.0)}
    kind = args.get("rope_scaling_type")
    if kind in ("linear", "llama3", "yarn"):
        rope.update(rope_type=kind, factor=float(args["rope_scaling_factor"]))
    if kind == "llama3":
        rope.update(low_freq_factor=float(args["low_freq_factor"]), high_freq_factor=float(args["high_freq_factor"]),
                    original_max_position_embeddings=int(args["original_max_position_embeddings"]))
    if kind == "yarn":
        rope.update(original_max_position_embeddings=int(args["original_max_position_embeddings"]),
                    beta_fast=float(args.get("rope_scaling_beta_fast") or 32.0),
                    beta_slow=float(args.get("rope_scaling_beta_slow") or 1.0),
                    truncate=bool(args.get("rope_scaling_truncate", True)))
        if args.get("rope_scaling_mscale") and args.get("rope_scaling_mscale_all_dim"):
            rope.update(mscale=float(args["rope_scaling_mscale"]), mscale_all_dim=float(args["rope_scaling_mscale_all_dim"]))
        if args.get("rope_attention_factor") is not None:
            rope["attention_factor"] = float(args["rope_attention_factor"])
    if kind == "longrope":
        short = [float(f) for f in args["rope_short_factor"]]
        factor = float(args.get("rope_attention_factor") or 1.0)
        rope.update(rope_type="longrope", short_factor=short, long_factor=short, attention_factor=factor,
                    short_mscale=factor, long_mscale=factor,
                    original_max_position_embeddings=int(args.get("max_position_embeddings") or 4096))
    return rope
