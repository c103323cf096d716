"""AFMoE's config.json (model_type afmoe: Arcee's Trinity-Nano, Trinity-Mini, Trinity-Large) as Megatron-named args
and back, without megatron.

AFMoE's layer is Qwen3's attention (per-head q / k RMSNorms) with its output gated per head and feature by
sigmoid(gate_proj(x)) (attention_output_gate with attention_gate_proj: models/qwen3_5.ProjGatedSelfAttention),
sandwich norms (megatron's pre-norms and post_norm), every layer but each global_attn_every_n_layers-th attending to
the latest sliding_window positions with RoPE and the others fully without RoPE (window_attn_skip_freq /
no_rope_freq), and the embeddings times sqrt(hidden_size) with mup_enabled (input_embeds_norm). Its MLPs are dense for
the first num_dense_layers, then DeepSeek-V3's mixture of experts without groups (models/hf_moe_config.glm4_moe_args).
"""
from __future__ import annotations

from typing import Any, Mapping


def afmoe_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """AFMoE (afmoe: Arcee's Trinity-Nano / Mini / Large) config.json under the names glm4_moe_args and the attention
    readers take, as transformers' AFMoE reads it: its first num_dense_layers dense (first_k_dense_replace), then
    sigmoid scores, the top-k chosen by score + expert_bias, renormalised, x route_scale (routed_scaling_factor), beside
    num_shared_experts x moe_intermediate_size wide shared experts; sliding layers every layer but each
    global_attn_every_n_layers-th (sliding_window_pattern, where layer_types is not given). vLLM's AfmoeForCausalLM
    also reads score_func, route_norm, n_group and topk_group; where they say what transformers does not compute
    (another score, no renormalisation, expert groups), it is refused, since rollout and training would differ."""
    hf = dict(hf)
    problems = [what for what, bad in (
        (f"score_func {hf.get('score_func')!r} (transformers' AFMoE scores by sigmoid)",
         hf.get("score_func") not in (None, "sigmoid")),
        ("route_norm false (transformers' AFMoE always renormalises the top-k weights)", hf.get("route_norm") is False),
        (f"n_group {hf.get('n_group')} with topk_group {hf.get('topk_group')} (transformers' AFMoE routes over all "
         f"experts at once)", int(hf.get("n_group") or 1) > int(hf.get("topk_group") or hf.get("n_group") or 1)),
    ) if bad]
    if problems:
        raise ValueError(f"config.json {'; '.join(problems)} is not supported for afmoe: vLLM would compute it, "
                         f"transformers and the trainer would not. Trinity's releases do not set it.")
    if hf.get("layer_types") is None:
        hf["sliding_window_pattern"] = int(hf.get("global_attn_every_n_layers") or 4)
    return {**hf, "n_group": None, "topk_group": None, "routed_scaling_factor": float(hf.get("route_scale") or 1.0),
            "norm_topk_prob": True, "first_k_dense_replace": int(hf.get("num_dense_layers") or 0),
            "num_shared_experts": int(hf.get("num_shared_experts") if hf.get("num_shared_experts") is not None else 2)}


def afmoe_export_config(args: Mapping[str, Any], vocab_size: int, dtype) -> dict[str, Any]:
    """AFMoE's config.json (afmoe, AfmoeForCausalLM; afmoe_config and hf_config read it back the same) for a model
    whose attention output gate has its own projection: GLM-4.5's mixture of experts (glm4_moe_config, what that
    refuses refused) with per-head q / k norms, sandwich norms, RoPE on whole heads, no biases, and sliding layers
    with RoPE and full ones without, or none; what else the args say is refused in one sentence."""
    from mindspeed_rl.models.hf_export_base import layer_types_config, sliding_nope_layout
    from mindspeed_rl.models.hf_export_config import glm4_moe_config

    hybrid, fits = sliding_nope_layout(args)
    problems = [what for what, bad in (
        ("a mixture of experts (num_experts > 1)", int(args.get("num_experts") or 0) <= 1),
        ("per-head q / k norms, pre- and post norms (post_norm), no biases, RoPE on whole heads",
         not args.get("qk_layernorm") or args.get("qk_layernorm_across_heads") or not args.get("post_norm")
         or args.get("pre_norm") is False or args.get("add_qkv_bias")
         or float(args.get("rotary_percent") or 1.0) != 1.0 or args.get("rotary_interleaved")),
        ("RoPE in the sliding layers only (no_rope_freq exactly on the full ones)", not fits),
        ("plain RMSNorms and a SwiGLU MLP", args.get("add_rmsnorm_offset") or not args.get("swiglu", True)),
    ) if bad]
    if problems:
        raise ValueError(f"an attention output gate with its own projection (attention_gate_proj) has a config.json "
                         f"form only as AFMoE (afmoe), which needs {'; '.join(problems)}.")
    moe = glm4_moe_config({k: v for k, v in args.items() if k not in (
        "sliding_window", "window_attn_skip_freq", "no_rope_freq", "post_norm", "attention_output_gate",
        "attention_gate_proj", "input_embeds_norm")}, vocab_size, dtype)
    config = {k: v for k, v in moe.items() if k not in (
        "n_routed_experts", "n_shared_experts", "num_nextn_predict_layers", "partial_rotary_factor", "use_qk_norm",
        "attention_bias", "first_k_dense_replace", "routed_scaling_factor", "norm_topk_prob", "n_group", "topk_group")}
    config.update(model_type="afmoe", architectures=["AfmoeForCausalLM"], num_experts=moe["n_routed_experts"],
                  num_shared_experts=moe["n_shared_experts"], num_dense_layers=moe["first_k_dense_replace"],
                  route_scale=moe["routed_scaling_factor"], mup_enabled=bool(args.get("input_embeds_norm")),
                  score_func="sigmoid", route_norm=True, n_group=1, topk_group=1)
    if hybrid:
        config.update(layer_types_config(args, config))
    else:
        config.update(layer_types=["full_attention"] * config["num_hidden_layers"],
                      sliding_window=config["max_position_embeddings"])
    return config
