"""Nemotron-H's config.json (model_type nemotron_h) as Megatron-named args, without megatron.

Nemotron-H (Nemotron-H 8B / 47B / 56B, NVIDIA-Nemotron-Nano-9B-v2 / 12B-v2) stacks layers that each
hold one block behind its own RMSNorm and residual (models/hybrid_pattern.py): Mamba-2 (M; 8 groups of
B / C), attention without RoPE (*), or an MLP without a gate, down(relu(up(x))^2) (-). Their order is
config.json's hybrid_override_pattern (the releases) or layers_block_type (transformers 5 writes it).
The mixture-of-experts layers (E: NVIDIA-Nemotron-3-Nano-30B-A3B) route as DeepSeek-V3 (sigmoid
scores, the expert bias choosing, groups, the top-k renormalised and scaled) over experts without
a gate, relu(up)^2, beside one shared expert of the same kind; each expert stored on its own.

Mamba-2's step dt = softplus(dt_raw + dt_bias) is used within config.json's time_step_limit, (0, inf)
in every release: unclamped, as vLLM's mixer and the releases' own code run it. transformers 5's port
clamps it from below at time_step_min (0.001) in its chunked scan whatever time_step_limit says; where
softplus falls under that, the two differ.
"""
from __future__ import annotations

from typing import Any, Mapping

from mindspeed_rl.models import hybrid_pattern

# transformers' NemotronHConfig defaults for the keys a config.json may leave out
DEFAULTS = {"mlp_hidden_act": "relu2", "mamba_hidden_act": "silu", "layer_norm_epsilon": 1e-5, "head_dim": 128,
            "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "use_conv_bias": True, "ssm_state_size": 128,
            "mamba_num_heads": 128, "mamba_head_dim": 64, "tie_word_embeddings": False, "num_key_value_heads": 8,
            "max_position_embeddings": 4096}
# the legacy spellings transformers' NemotronHConfig still reads
ALIASES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_conv_bias": "use_conv_bias",
           "mamba_chunk_size": "chunk_size", "mamba_dt_limit": "time_step_limit"}


def pattern(hf: Mapping[str, Any]) -> str:
    """The layers' blocks as a hybrid_override_pattern string, from either spelling of config.json."""
    types = hf.get("layers_block_type") or hf.get("layer_types")
    if types:
        try:
            return hybrid_pattern.from_block_types(types)
        except ValueError as err:
            raise ValueError(f"config.json layers_block_type: {err}.") from None
    text = hf.get("hybrid_override_pattern")
    why = hybrid_pattern.problem(text)
    if why:
        raise ValueError(f"config.json hybrid_override_pattern {why} (or give layers_block_type).")
    return text


def nemotron_h_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """config.json with the keys the common reading (models/hf_config.py) takes: the layer count from the pattern,
    the MLP's activation as hidden_act, the norm epsilon as rms_norm_eps. Refuses what the releases do not have."""
    hf = {ALIASES.get(k, k): v for k, v in hf.items()}
    hf = {**hf, **{k: v for k, v in DEFAULTS.items() if hf.get(k) is None}}
    blocks = pattern(hf)
    if "E" in blocks and hf.get("moe_latent_size") is not None:
        raise ValueError(f"config.json moe_latent_size {hf['moe_latent_size']} (experts behind latent projections) is "
                         f"not supported; set it null.")
    if "E" in blocks and int(hf.get("n_shared_experts", 1) or 0) != 1:
        raise ValueError(f"config.json n_shared_experts {hf.get('n_shared_experts')} is not supported: transformers "
                         f"builds one shared expert moe_shared_expert_intermediate_size wide and vLLM n_shared_experts of "
                         f"them; the releases have 1.")
    for key, what in (("use_bias", "biases on the Mamba-2 in_proj / out_proj"), ("mamba_proj_bias", "biases on the "
                      "Mamba-2 in_proj / out_proj"), ("attention_bias", "biases on q / k / v / o"),
                      ("mlp_bias", "biases on up_proj / down_proj")):
        if hf.get(key):
            raise ValueError(f"config.json {key}=true ({what}) is not supported; Nemotron-H's releases have none.")
    if hf.get("mamba_hidden_act") != "silu":
        raise ValueError(f"config.json mamba_hidden_act {hf.get('mamba_hidden_act')!r} is not supported; Mamba-2 uses "
                         f"silu.")
    if hf.get("tie_word_embeddings"):
        raise ValueError("config.json tie_word_embeddings=true is not supported for nemotron_h: neither transformers' "
                         "nor vLLM's Nemotron-H ties lm_head to the embedding; the releases are untied.")
    if hf.get("sliding_window") is not None:
        raise ValueError(f"config.json sliding_window {hf['sliding_window']} is not supported for nemotron_h; its "
                         f"releases have none.")
    return {**hf, "num_hidden_layers": len(blocks), "hidden_act": hf["mlp_hidden_act"],
            "rms_norm_eps": float(hf["layer_norm_epsilon"]), "hybrid_override_pattern": blocks}


def nemotron_h_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The Megatron-named args beyond the common ones, from nemotron_h_config's output: the one-block layers, their
    Mamba-2 sizes, the MLP without a gate (squared ReLU) and attention without RoPE (no_rope_freq on every layer)."""
    from mindspeed_rl.models.mamba_layout import mamba_step_limit
    from mindspeed_rl.models.hf_moe_config import glm4_moe_args

    mamba_step_limit(hf)
    blocks = hf["hybrid_override_pattern"]
    heads, head_dim = int(hf["mamba_num_heads"]), int(hf["mamba_head_dim"])
    moe: dict[str, Any] = {}
    if "E" in blocks:  # DeepSeek-V3's routing (sigmoid + expert bias, groups, routed scale); one shared expert
        moe = glm4_moe_args({**hf, "first_k_dense_replace": 0, "n_shared_experts": 0})
        moe.update(moe_layer_freq=hybrid_pattern.moe_marks(blocks),
                   moe_shared_expert_intermediate_size=int(hf["moe_shared_expert_intermediate_size"]))
    return {**moe, "hybrid_override_pattern": blocks, "mamba_layers": hybrid_pattern.mamba_marks(blocks),
            "mamba_num_heads": heads, "mamba_head_dim": head_dim, "mamba_num_groups": int(hf["n_groups"]),
            "mamba_state_dim": int(hf["ssm_state_size"]), "mamba_conv_kernel": int(hf["conv_kernel"]),
            "mamba_chunk_size": int(hf["chunk_size"]), "mamba_conv_bias": hf["use_conv_bias"] is not False,
            "swiglu": False, "squared_relu": True, "no_rope_freq": [1] * len(blocks)}


def nemotron_h_export_config(args: Mapping[str, Any], vocab_size: int, dtype) -> dict[str, Any]:
    """Nemotron-H's config.json (nemotron_h, NemotronHForCausalLM) for a model with hybrid_override_pattern, read back
    the same by nemotron_h_config / nemotron_h_args: its attention and MLP those of a Llama / Arcee config.json (what
    else the args say is refused there), without RoPE, the MLP relu(up)^2 without a gate."""
    from mindspeed_rl.models.hf_config import no_rope_pattern
    from mindspeed_rl.models.hf_export_config import _config_from_args
    from mindspeed_rl.models.mamba_layout import MambaShape

    blocks = args["hybrid_override_pattern"]
    layers = len(blocks)
    if ("-" in blocks or "E" in blocks) and not args.get("squared_relu"):
        raise ValueError("a hybrid_override_pattern model's MLP and MoE layers (- / E) have a config.json form only as "
                         "Nemotron-H's relu(up)^2 without a gate; set squared_relu: true and swiglu: false.")
    if "*" in blocks and (no_rope_pattern(args.get("no_rope_freq"), layers) or [0]) != [1] * layers:
        raise ValueError("a hybrid_override_pattern model's attention layers (*) have a config.json form only as "
                         "Nemotron-H's, without RoPE; set no_rope_freq to 1 for every layer.")
    if not args.get("untie_embeddings_and_output_weights", False):
        raise ValueError("a hybrid_override_pattern model has a config.json form only with its own lm_head "
                         "(untie_embeddings_and_output_weights: true): neither transformers' nor vLLM's Nemotron-H ties it "
                         "to the embedding.")
    rest = {k: v for k, v in args.items() if not k.startswith(("mamba_", "moe_")) and k not in (
        "hybrid_override_pattern", "no_rope_freq", "squared_relu", "swiglu", "num_experts", "norm_topk_prob")}
    base = _config_from_args({**rest, "swiglu": True}, vocab_size, dtype)
    if base["model_type"] != "llama":
        raise ValueError(f"a hybrid_override_pattern model has a config.json form only as Nemotron-H (Llama's attention "
                         f"without RoPE, biases or q / k norms); this one's layers are a {base['model_type']}'s.")
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "tie_word_embeddings", "torch_dtype", "bos_token_id", "eos_token_id",
            "pad_token_id")
    config = {k: base[k] for k in keep if k in base}
    config.update(architectures=["NemotronHForCausalLM"], model_type="nemotron_h",
                  layers_block_type=hybrid_pattern.to_block_types(blocks), hybrid_override_pattern=blocks,
                  num_hidden_layers=layers, layer_norm_epsilon=base["rms_norm_eps"], mlp_hidden_act="relu2", mamba_hidden_act="silu", attention_bias=False, mlp_bias=False,
                  use_bias=False, time_step_limit=[0.0, float("inf")])
    if "E" in blocks:
        config.update(nemotron_h_moe_config(args))
    if "M" in blocks:
        shape = MambaShape.from_args(args)
        config.update(mamba_num_heads=shape.heads, mamba_head_dim=shape.head_dim, n_groups=shape.groups,
                      ssm_state_size=shape.state, conv_kernel=shape.conv_kernel, chunk_size=shape.chunk,
                      use_conv_bias=shape.conv_bias)
    return config


def nemotron_h_moe_config(args: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's MoE keys of a Nemotron-H model from megatron's args: DeepSeek-V3's routing only (sigmoid scores,
    the expert bias, the top-k renormalised), one shared expert; anything else refused in one sentence."""
    routing = (args.get("moe_router_score_function"), bool(args.get("moe_router_enable_expert_bias")),
               args.get("norm_topk_prob", not args.get("moe_router_pre_softmax", False)) is not False)
    if routing != ("sigmoid", True, True):
        raise ValueError("a hybrid_override_pattern model's MoE layers (E) have a config.json form only as Nemotron-H's "
                         "routing: moe_router_score_function sigmoid, moe_router_enable_expert_bias true and the top-k "
                         "renormalised (norm_topk_prob true).")
    shared = int(args.get("moe_shared_expert_intermediate_size") or 0)
    if not shared or args.get("shared_expert_gate"):
        raise ValueError("a hybrid_override_pattern model's MoE layers (E) have a config.json form only as Nemotron-H's, "
                         "with one shared expert without a gate (moe_shared_expert_intermediate_size).")
    return {"n_routed_experts": int(args["num_experts"]), "num_experts_per_tok": int(args["moe_router_topk"]),
            "moe_intermediate_size": int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
            "moe_shared_expert_intermediate_size": shared, "n_shared_experts": 1, "norm_topk_prob": True,
            "routed_scaling_factor": float(args.get("moe_router_topk_scaling_factor") or 1.0),
            "n_group": int(args.get("moe_router_num_groups") or 1), "topk_group": int(args.get("moe_router_group_topk") or 1),
            "moe_latent_size": None}
