"""LFM2's config.json (model_type lfm2, and lfm2_moe) as Megatron-named args, without megatron.

LFM2 (Liquid AI: LFM2-350M, 700M, 1.2B, 2.6B) is Llama's layer with most token mixers a short convolution
(models/short_conv.py; config.json layer_types "conv", or the older full_attn_idxs listing the attention
layers) and Qwen3's per-head q / k RMSNorms in the attention layers; the MLP is SwiGLU, the final norm
is called embedding_norm, the embedding tied. Its MLP width is computed from config.json as transformers
does (block_auto_adjust_ff_dim: 2/3 of intermediate_size, times block_ffn_dim_multiplier, rounded up to a
multiple of block_multiple_of); block_ff_dim, the releases' spelling, stands for intermediate_size.

LFM2-MoE (lfm2_moe: LFM2-8B-A1B) has the same layers with every MLP after the first num_dense_layers a mixture of
experts (intermediate_size wide dense MLPs, as config.json says, no adjusting; moe_intermediate_size wide experts)
routed as DeepSeek-V3 without groups: sigmoid scores, the top-k chosen by score + the checkpoint's expert_bias
(megatron's expert_bias, loaded and kept fixed), weighted by their scores renormalised, times routed_scaling_factor.
"""
from __future__ import annotations

from typing import Any, Mapping

# transformers' Lfm2Config defaults for the keys a config.json may leave out
DEFAULTS = {"norm_eps": 1e-5, "tie_word_embeddings": True, "conv_bias": False, "conv_L_cache": 3,
            "block_multiple_of": 256, "block_auto_adjust_ff_dim": True, "num_key_value_heads": 8,
            "max_position_embeddings": 128000, "rope_theta": 1000000.0}


def lfm2_ffn(hf: Mapping[str, Any]) -> int:
    """The MLP width transformers' Lfm2MLP builds from config.json (its intermediate_size adjusted)."""
    width = int(hf["intermediate_size"])
    if hf.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = hf.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            multiple = int(hf.get("block_multiple_of") or 256)
            width = multiple * ((int(float(multiplier) * width) + multiple - 1) // multiple)
    return width


def conv_marks(hf: Mapping[str, Any], num_layers: int) -> list[int]:
    """short_conv_layers from config.json's layer_types ("conv" / "full_attention"), or from full_attn_idxs
    (the attention layers; every layer attends when both are absent, as transformers reads it)."""
    types = hf.get("layer_types")
    if types is None:
        attends = hf.get("full_attn_idxs")
        attends = set(range(num_layers)) if attends is None else {int(i) for i in attends}
        return [int(i not in attends) for i in range(num_layers)]
    if len(types) != num_layers:
        raise ValueError(f"config.json layer_types lists {len(types)} layers but num_hidden_layers is {num_layers}; "
                         f"give one per layer.")
    bad = sorted({t for t in types if t not in ("conv", "full_attention")})
    if bad:
        raise ValueError(f"config.json layer_types has {', '.join(repr(t) for t in bad)}; an lfm2 model's layers are "
                         f"'conv' or 'full_attention'.")
    return [int(t == "conv") for t in types]


def lfm2_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """config.json with transformers' defaults and aliases applied, in the keys the common reading takes
    (models/hf_config.py): the adjusted MLP width as intermediate_size, norm_eps as rms_norm_eps."""
    hf = dict(hf)
    if hf.get("block_ff_dim") is not None:  # transformers reads it over intermediate_size
        hf["intermediate_size"] = hf["block_ff_dim"]
    if hf.get("tie_embedding") is not None:
        hf["tie_word_embeddings"] = hf["tie_embedding"]
    hf = {**hf, **{k: v for k, v in DEFAULTS.items() if hf.get(k) is None}}
    for key in ("block_dim", "conv_dim", "conv_dim_out"):  # the releases' (= hidden_size); transformers reads none
        if hf.get(key) is not None and int(hf[key]) != int(hf["hidden_size"]):
            raise ValueError(f"config.json {key} {hf[key]} differs from hidden_size {hf['hidden_size']}; transformers' "
                             f"LFM2 builds every layer hidden_size wide and vLLM's {key} wide, so they would disagree.")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json hidden_act {hf['hidden_act']!r} is not supported for lfm2; its MLP is SwiGLU "
                         f"(silu), whatever the key says in transformers.")
    width = int(hf["intermediate_size"]) if hf.get("model_type") == "lfm2_moe" else lfm2_ffn(hf)
    return {**hf, "intermediate_size": width, "rms_norm_eps": float(hf["norm_eps"]), "hidden_act": "silu"}


def lfm2_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """The Megatron-named args beyond the common ones, from lfm2_config's output."""
    args = {"qk_layernorm": True, "short_conv_kernel": int(hf["conv_L_cache"]),
            "short_conv_bias": bool(hf["conv_bias"])}
    marks = conv_marks(hf, num_layers)
    if any(marks):
        args["short_conv_layers"] = marks
    if hf.get("model_type") == "lfm2_moe":
        args.update(lfm2_moe_args(hf, num_layers))
    return args


def lfm2_moe_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """LFM2-MoE's experts and routing (the module docstring), refusing what megatron would route otherwise."""
    experts, topk, dense = int(hf["num_experts"]), int(hf["num_experts_per_tok"]), int(hf.get("num_dense_layers") or 0)
    if experts < 2 or not 1 <= topk <= experts:
        raise ValueError(f"config.json num_experts {experts} / num_experts_per_tok {topk}: an lfm2_moe model needs at "
                         f"least 2 experts and 1 to num_experts of them per token.")
    if not 0 <= dense < num_layers:
        raise ValueError(f"config.json num_dense_layers {dense} leaves no MoE layer of {num_layers}; a dense model is an "
                         f"lfm2 config.json.")
    if hf.get("norm_topk_prob", True) is False:
        raise ValueError("config.json norm_topk_prob false for lfm2_moe is not supported: megatron renormalises the "
                         "top-k sigmoid scores; LFM2-MoE's releases set it true.")
    args = {"num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": int(hf["moe_intermediate_size"]),
            "norm_topk_prob": True, "moe_router_score_function": "sigmoid",
            "moe_router_enable_expert_bias": hf.get("use_expert_bias", True) is not False,
            "moe_layer_freq": [0] * dense + [1] * (num_layers - dense)}
    if args["moe_router_enable_expert_bias"]:
        args["moe_router_bias_update_rate"] = 0.0
    scale = float(hf.get("routed_scaling_factor") or 1.0)
    if scale != 1.0:
        args["moe_router_topk_scaling_factor"] = scale
    return args


def lfm2_export_config(args: Mapping[str, Any], vocab_size: int, dtype) -> dict[str, Any]:
    """LFM2's config.json (lfm2, Lfm2ForCausalLM) for a model with short-convolution layers, read back the same by
    lfm2_config / lfm2_args: its attention and MLP those of a Qwen3 config.json (what else the args say is refused
    there), the MLP width as it is (block_auto_adjust_ff_dim false), the layer types and the conv's kernel and biases."""
    from mindspeed_rl.models.hf_export_config import _config_from_args

    moe = int(args.get("num_experts") or 0) > 1
    rest = {k: v for k, v in args.items() if not k.startswith(("short_conv_", "moe_")) and k not in (
        "num_experts", "norm_topk_prob")} if moe else {k: v for k, v in args.items() if not k.startswith("short_conv_")}
    base = _config_from_args(rest, vocab_size, dtype)
    head_dim = int(args["hidden_size"]) // int(args["num_attention_heads"])
    if base["model_type"] != "qwen3" or not args.get("swiglu", True) or int(base["head_dim"]) != head_dim:
        raise ValueError(f"a model with short-convolution layers has a config.json form only as LFM2 (attention with "
                         f"per-head q / k norms, head_dim hidden_size / num_attention_heads = {head_dim}, a SwiGLU MLP, "
                         f"no biases); this one's layers are a {base['model_type']}'s with head_dim {base['head_dim']}.")
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
            "tie_word_embeddings", "num_hidden_layers", "rope_parameters", "rope_theta", "torch_dtype", "bos_token_id",
            "eos_token_id", "pad_token_id")
    config = {k: base[k] for k in keep if k in base}
    marks = list(args.get("short_conv_layers") or [0] * int(args["num_layers"]))
    config.update(architectures=["Lfm2ForCausalLM"], model_type="lfm2", intermediate_size=int(args["ffn_hidden_size"]),
                  block_auto_adjust_ff_dim=False, layer_types=["conv" if m else "full_attention" for m in marks],
                  conv_L_cache=int(args.get("short_conv_kernel") or 3), conv_bias=bool(args.get("short_conv_bias")),
                  norm_eps=float(base["rms_norm_eps"]), **dict.fromkeys(("block_dim", "conv_dim", "conv_dim_out"),
                                                                         int(args["hidden_size"])))
    if "rope_theta" not in config:  # (transformers 5 keeps it in rope_parameters; written at the top level too)
        config["rope_theta"] = float((config.get("rope_parameters") or {}).get("rope_theta", args.get("rotary_base", 1e6)))
    if moe:
        config.update(lfm2_moe_config_json(args))
    return config


def lfm2_moe_config_json(args: Mapping[str, Any]) -> dict[str, Any]:
    """LFM2-MoE's config.json keys for an MoE model with short-convolution layers (read back the same by lfm2_moe_args);
    what its config.json cannot say refused in one sentence."""
    from mindspeed_rl.models.hf_moe_config import moe_layer_pattern

    layers = int(args["num_layers"])
    pattern = moe_layer_pattern(args.get("moe_layer_freq", 1), layers)
    dense = pattern.index(1) if 1 in pattern else layers
    problems = [why for bad, why in (
        (pattern != [0] * dense + [1] * (layers - dense), f"MoE layers {pattern} that are not all after the dense ones"),
        ((args.get("moe_router_score_function") or "softmax") != "sigmoid", "routing other than by sigmoid scores"),
        (args.get("norm_topk_prob") is False, "top-k scores not renormalised"),
        (bool(args.get("moe_shared_expert_intermediate_size")), "a shared expert"),
        (int(args.get("moe_router_num_groups") or 1) > 1, "expert groups"),
        (args.get("moe_router_enable_expert_bias") and float(args.get("moe_router_bias_update_rate") or 0.0) != 0.0,
         "an expert bias that training updates")) if bad]
    if problems:
        raise ValueError(f"an MoE model with short-convolution layers has a config.json form only as LFM2-MoE (dense "
                         f"layers first, sigmoid routing with the top-k renormalised); this one has {', '.join(problems)}.")
    return {"model_type": "lfm2_moe", "architectures": ["Lfm2MoeForCausalLM"], "num_experts": int(args["num_experts"]),
            "num_experts_per_tok": int(args.get("moe_router_topk") or 2),
            "moe_intermediate_size": int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
            "num_dense_layers": dense, "use_expert_bias": bool(args.get("moe_router_enable_expert_bias")),
            "routed_scaling_factor": float(args.get("moe_router_topk_scaling_factor") or 1.0), "norm_topk_prob": True}
