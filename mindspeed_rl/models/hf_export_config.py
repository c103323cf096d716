"""config.json for a Hugging Face export from megatron's args: `hf_config_from_args` picks the architecture
whose config.json can say what the args describe (llama, qwen2 when add_qkv_bias, qwen3 when qk_layernorm,
gemma3_text with Gemma's keys, the MoE and hybrid forms, ...) and writes it, read back the same by
models/hf_config.model_config_from_hf; a combination no config.json can say is refused in one sentence.
models/hf_export.py writes the weights beside it; the vLLM engine and validation take the engine's form of it.
The pieces every writer shares (base_config, rope_parameters, ...) are in models/hf_export_base.py, the writers of the
LayerNorm models (StableLM 2, StarCoder2, Nemotron, Jais 2, Cohere, ...) in models/hf_export_layernorm.py, Granite MoE's
and Granite 4.0-H's in models/hf_granite_config.py, LFM2's and AFMoE's in their own readers' modules.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from mindspeed_rl.models.hf_bridge.mapping import gated_mlp
from mindspeed_rl.models.hf_bridge.sharding import moe_layers
from mindspeed_rl.models.hf_config import kv_channels, no_rope_pattern, window_pattern
from mindspeed_rl.models.hf_export_base import (DTYPE_NAMES, GRANITE_SCALARS, base_config, layer_types_config,  # noqa: F401
                                                per_type_rope, plain_scaling, rope_parameters, sliding_nope_layout)
from mindspeed_rl.models.hf_export_layernorm import layernorm_config
from mindspeed_rl.models.hf_granite_config import granite_hybrid_export_config, granite_moe_config

def hf_config_from_args(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """_config_from_args, with clip_qkv (OLMo's q / k / v clamp) written where config.json can say it (OLMo 1) and
    refused in one sentence elsewhere."""
    config = _config_from_args(args, vocab_size, dtype)
    clip = args.get("clip_qkv")
    if clip is not None and config.get("clip_qkv") != float(clip):
        raise ValueError(f"clip_qkv {clip} has a config.json form only in an OLMo model (LayerNorms without weights: "
                         f"layernorm_affine: false), not as {config['model_type']}.")
    return config


def _config_from_args(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A config.json for a Llama / Arcee (squared_relu) / Apertus (xielu) / Mistral (sliding_window) / Phi-3 (rotary_percent < 1) /
    GLM-4 / ERNIE 4.5 (rotary_interleaved: interleaved_rope_config) / SmolLM3
    (no_rope_freq) / Granite (multipliers) / Gemma 1 / 2 / 3 (Gemma's keys) / OLMo 2 / 3 / Qwen2 / Qwen3 / Qwen3-MoE
    (q/k norms) / Qwen2-MoE (shared expert) / Mixtral (other MoE, with or without a sliding_window)
    CausalLM with these Megatron-named args, its rotary embedding included (rope_parameters); a
    combination config.json cannot say is refused in one sentence."""
    from mindspeed_rl.models.hf_gemma4_config import GEMMA4_KEYS, gemma4_export_config
    if any(args.get(k) for k in GEMMA4_KEYS):  # Gemma 4 (models/hf_gemma4_config.py)
        return gemma4_export_config(args, vocab_size, dtype)
    if args.get("embedding_norm") or args.get("rotary_negated") or (args.get("layernorm_affine") is False and
                                                                     args.get("normalization", "RMSNorm") == "RMSNorm"):
        from mindspeed_rl.models.hf_nanochat_config import nanochat_export_config  # weightless RMSNorms: nanochat
        return nanochat_export_config(args, vocab_size, dtype)
    if args.get("hybrid_override_pattern"):  # one block per layer: Nemotron-H (models/hf_nemotron_h_config.py)
        from mindspeed_rl.models.hf_nemotron_h_config import nemotron_h_export_config
        return nemotron_h_export_config(args, vocab_size, dtype)
    if args.get("parallel_hybrid"):  # attention and Mamba-2 side by side: Falcon-H1 (models/hf_falcon_h1_config.py)
        from mindspeed_rl.models.hf_falcon_h1_config import falcon_h1_export_config
        return falcon_h1_export_config(args, vocab_size, dtype)
    if any(args.get("short_conv_layers") or ()):  # LFM2's conv layers (models/hf_lfm2_config.py)
        from mindspeed_rl.models.hf_lfm2_config import lfm2_export_config
        return lfm2_export_config(args, vocab_size, dtype)
    if any(args.get("mamba_layers") or ()):
        return granite_hybrid_export_config(args, vocab_size, dtype)
    if args.get("quick_geglu") or args.get("softmax_type") == "learnable":
        return gpt_oss_config(args, vocab_size, dtype)
    if args.get("normalization") == "LayerNorm":  # models/hf_export_layernorm.py
        return layernorm_config(args, vocab_size, dtype)
    if args.get("attention_gate_proj") and not any(args.get("linear_attention_layers") or ()):  # (hf_afmoe_config.py)
        from mindspeed_rl.models.hf_afmoe_config import afmoe_export_config
        return afmoe_export_config(args, vocab_size, dtype)
    if args.get("linear_attention_layers") is not None or args.get("attention_output_gate"):
        return qwen3_5_config(args, vocab_size, dtype)
    if args.get("qk_layernorm_after_rope"):
        return hunyuan_config(args, vocab_size, dtype)
    if args.get("qk_layernorm_across_heads") and int(args.get("num_experts") or 0) > 1:
        minimax = args.get("moe_router_score_function") == "sigmoid" or args.get("moe_router_enable_expert_bias")
        return (minimax_m2_config if minimax else olmoe_config)(args, vocab_size, dtype)
    if int(args.get("num_experts") or 0) > 1 and any(float(args.get(k) or 1.0) != 1.0 for k in GRANITE_SCALARS):
        return granite_moe_config(args, vocab_size, dtype)
    if args.get("pre_norm") is False and args.get("qk_layernorm") and not args.get("qk_layernorm_across_heads"):
        return exaone4_config(args, vocab_size, dtype)
    if args.get("qk_layernorm_across_heads") or args.get("pre_norm") is False:
        return olmo_config(args, vocab_size, dtype)
    if args.get("rotary_interleaved") and int(args.get("num_experts") or 0) <= 1 and not args.get("multi_latent_attention"):
        return interleaved_rope_config(args, vocab_size, dtype)
    if args.get("post_norm") and int(args.get("num_experts") or 0) <= 1 and \
            not any(args.get(k) for k in ("add_rmsnorm_offset", "input_embeds_norm", "geglu")):
        return hyperclovax_config(args, vocab_size, dtype)  # pre- and post norms, plain RMSNorms: Peri-LN
    gemma = [k for k in GEMMA_KEYS if args.get(k)]
    if gemma:
        return gemma_config(args, vocab_size, dtype, gemma)
    if int(args.get("num_experts") or 0) > 1 and args.get("moe_router_score_function") == "sigmoid" and \
            sliding_nope_layout(args)[0]:  # sliding layers in a sigmoid-routed MoE: EXAONE MoE's
        return exaone_moe_config(args, vocab_size, dtype)
    if int(args.get("num_experts") or 0) > 1 and args.get("qk_layernorm") and \
            (args.get("moe_router_score_function") or "softmax") == "softmax" and \
            (args.get("window_attn_skip_freq") is not None or args.get("rope_local_base_freq")):  # Mellum's
        return mellum_config(args, vocab_size, dtype)
    if args.get("window_attn_skip_freq") is not None or args.get("rope_local_base_freq"):
        raise ValueError("window_attn_skip_freq / rope_local_base_freq have a config.json form only in a Gemma 3 "
                         "model (add_rmsnorm_offset, post_norm, input_embeds_norm, geglu, qk_layernorm), an OLMo 3 "
                         "(pre_norm: false, post_norm, qk_layernorm_across_heads) or a Mellum (Qwen3-MoE's layers).")
    if int(args.get("num_experts") or 0) > 1 and args.get("moe_router_enable_expert_bias") and \
            (args.get("moe_router_score_function") or "softmax") == "softmax":  # softmax + bias: ERNIE 4.5's routing
        return ernie4_5_moe_config(args, vocab_size, dtype)
    if args.get("multi_latent_attention") and int(args.get("num_experts") or 0) <= 1:  # dense: Youtu-LLM's
        from mindspeed_rl.models.hf_youtu_config import youtu_config
        return youtu_config(args, vocab_size, dtype)
    if args.get("multi_latent_attention"):  # DeepSeek-V2's softmax routing, else V3's sigmoid
        v2 = (args.get("moe_router_score_function") or "softmax") == "softmax"
        return glm4_moe_config(args, vocab_size, dtype, "deepseek_v2" if v2 else "deepseek_v3")
    # dense layers among softmax-routed ones with a gated shared expert (Qwen2-MoE) or q / k norms and none (Qwen3-MoE):
    # config.json's mlp_only_layers (below); other dense layers: GLM-4.5's first_k_dense_replace
    qwen_dense = (args.get("moe_router_score_function") or "softmax") == "softmax" and (
        args.get("shared_expert_gate") or (args.get("qk_layernorm") and not args.get("moe_shared_expert_intermediate_size")))
    if int(args.get("num_experts") or 0) > 1 and (args.get("moe_router_score_function") == "sigmoid"
                                                  or not (all(moe_layers(args)) or qwen_dense)):
        return glm4_moe_config(args, vocab_size, dtype)
    if args.get("rotary_interleaved"):  # (Llama's, Qwen's and Mixtral's RoPE turn pairs (i, i + d/2))
        raise ValueError("rotary_interleaved in a mixture of experts has a config.json form only as ERNIE 4.5 MoE (softmax "
                         "routing with an expert bias: moe_router_enable_expert_bias); this one has none.")
    model_type = "qwen3" if args.get("qk_layernorm") else "qwen2" if args.get("add_qkv_bias") else "llama"
    heads = int(args["num_attention_heads"])
    rope = rope_parameters(args)
    shared = int(args.get("moe_shared_expert_intermediate_size") or 0)
    window = args.get("sliding_window")
    if int(args.get("num_experts") or 0) > 1:
        renormalised = args.get("norm_topk_prob", not args.get("moe_router_pre_softmax", False))
        if shared:
            model_type = "qwen2_moe"
        elif args.get("qk_layernorm"):
            model_type = "qwen3_moe"
        elif not args.get("add_qkv_bias") and renormalised:
            model_type, window = "mixtral", None  # Mixtral: Mistral's attention, window included (below)
        else:
            raise ValueError("a mixture of experts without q/k norms (Qwen3-MoE) or a shared expert (Qwen2-MoE) has a "
                             "config.json form only as Mixtral (renormalised top-k routing, no q/k/v bias); this one "
                             f"has {'q/k/v biases' if args.get('add_qkv_bias') else 'top-k routing not renormalised'}.")
    no_rope = no_rope_pattern(args.get("no_rope_freq"), int(args["num_layers"]))
    scalars = {k: float(args.get(k) or 1.0) for k in ("embedding_multiplier_scale", "residual_multiplier",
                                                       "output_multiplier_scale")}
    granite = any(v != 1.0 for v in scalars.values())
    # Llama variants config.json spells as model types of their own: at most one, on a Llama
    variants = {"smollm3": ("no_rope_freq", no_rope), "mistral": ("sliding_window", window),
                "granite": ("embedding / residual / output multipliers", granite)}
    chosen = [(kind, key) for kind, (key, on) in variants.items() if on]
    if chosen and (model_type != "llama" or len(chosen) > 1):
        keys = " and ".join(key for _, key in chosen)
        verb = "have" if len(chosen) > 1 else "has"
        raise ValueError(f"{keys} {verb} no config.json form for a {model_type} model here; config.json has each "
                         f"alone on a Llama-style model ({', '.join(kind for kind, _ in chosen)}).")
    model_type = chosen[0][0] if chosen else model_type
    partial = float(args.get("rotary_percent") or 1.0)
    if not gated_mlp(args) and args.get("xielu"):  # xIELU: Apertus, which always has per-head q / k norms
        if model_type != "qwen3" or args.get("add_qkv_bias") or partial != 1.0:
            raise ValueError(f"an xIELU MLP has a config.json form only in an Apertus model (per-head q / k norms: "
                             f"qk_layernorm, no q/k/v biases, full rotary); this one is a "
                             f"{'model without q / k norms' if model_type != 'qwen3' else model_type}"
                             f"{' with q/k/v biases' if args.get('add_qkv_bias') else ''}"
                             f"{'' if partial == 1.0 else f' with rotary_percent {partial}'}.")
        model_type = "apertus"
    elif not gated_mlp(args):  # config.json says an MLP without a gate for Arcee (relu2) only
        if not args.get("squared_relu") or model_type != "llama" or partial != 1.0:
            raise ValueError(f"an MLP without a gate has a config.json form only in an Arcee model (squared_relu, a "
                             f"Llama-style model with full rotary); this one is a {model_type}"
                             f"{'' if args.get('squared_relu') else ' with a GELU MLP'}"
                             f"{'' if partial == 1.0 else f' with rotary_percent {partial}'}.")
        model_type = "arcee"
    if partial != 1.0:  # config.json says partial rotary for Phi-3 only (models/hf_config.py reads it there)
        head_dim = int(args.get("kv_channels") or args["hidden_size"] // heads)
        if model_type not in ("llama", "mistral") or head_dim * heads != int(args["hidden_size"]):
            raise ValueError(f"rotary_percent {partial} has a config.json form only in a Phi-3 model (a Llama-style "
                             f"model with head dimension hidden_size / num_attention_heads, optionally windowed); "
                             f"this one is a {model_type}"
                             f"{'' if head_dim * heads == int(args['hidden_size']) else f' with head dimension {head_dim}'}.")
        model_type = "phi3"
    cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
           "smollm3": "SmolLM3ForCausalLM", "mistral": "MistralForCausalLM",
           "granite": "GraniteForCausalLM", "mixtral": "MixtralForCausalLM", "phi3": "Phi3ForCausalLM",
           "arcee": "ArceeForCausalLM", "apertus": "ApertusForCausalLM"}[model_type]
    config = base_config(args, vocab_size, dtype, model_type, cls, rope, eps=1e-5)
    config.update(hidden_act={"arcee": "relu2", "apertus": "xielu"}.get(model_type, "silu"),
                  attention_bias=bool(args.get("add_qkv_bias")) and model_type not in ("qwen2", "qwen2_moe"))
    if window or model_type == "mixtral":  # Mixtral's config.json says null for none
        config["sliding_window"] = int(args["sliding_window"]) if args.get("sliding_window") else None
    if model_type == "phi3":  # q/k/v and gate/up stored fused (hf_bridge/names.py); the rotated fraction
        # pad_token_id: Phi3Config's default (32000) lies outside other vocabularies
        config.update(partial_rotary_factor=partial, sliding_window=int(args["sliding_window"]) if window else None,
                      pad_token_id=None)
        config["rope_parameters"]["partial_rotary_factor"] = partial
    if granite:  # attention_multiplier is the score scale, 1 / sqrt(head_dim) unless set
        d = config["head_dim"]
        config.update(embedding_multiplier=scalars["embedding_multiplier_scale"],
                      residual_multiplier=scalars["residual_multiplier"],
                      logits_scaling=1.0 / scalars["output_multiplier_scale"],
                      attention_multiplier=float(args.get("softmax_scale") or d ** -0.5))
    if no_rope:  # SmolLM3's spelling: 1 = the layer applies RoPE
        config.update(no_rope_layers=[1 - x for x in no_rope], use_sliding_window=False)
    if model_type == "qwen2_moe":
        config.update(qkv_bias=bool(args.get("add_qkv_bias")), shared_expert_intermediate_size=shared)
    if model_type == "mixtral":  # renormalised top-k experts, intermediate_size wide
        config.update(num_local_experts=int(args["num_experts"]), num_experts_per_tok=int(args.get("moe_router_topk") or 2),
                      intermediate_size=int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
                      router_jitter_noise=0.0)
    if model_type in ("qwen3_moe", "qwen2_moe"):  # norm_topk_prob is the inverse of megatron's pre-softmax routing
        norm = args.get("norm_topk_prob")
        config.update(num_experts=int(args["num_experts"]), num_experts_per_tok=int(args.get("moe_router_topk") or 2),
                      moe_intermediate_size=int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
                      norm_topk_prob=bool(norm) if norm is not None else not args.get("moe_router_pre_softmax", False),
                      decoder_sparse_step=1, mlp_only_layers=[i for i, m in enumerate(moe_layers(args)) if not m])
    return config


def gpt_oss_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """gpt-oss's config.json (gpt_oss) for Megatron-named args (models/hf_moe_config.gpt_oss_args, read back the
    same); what it cannot say is refused."""
    layers, heads = int(args["num_layers"]), int(args["num_attention_heads"])
    experts = int(args.get("num_experts") or 0)
    window = args.get("sliding_window")
    pattern = (window_pattern(args.get("window_attn_skip_freq"), layers) or [1] * layers) if window else [0] * layers
    problems = [what for what, bad in (
        ("attention sinks (softmax_type: learnable)", args.get("softmax_type") != "learnable"),
        ("the clamped SwiGLU with glu_linear_offset 1 (quick_geglu)",
         not args.get("quick_geglu") or float(args.get("glu_linear_offset") or 0.0) != 1.0),
        ("biases on every linear layer (disable_bias_linear: false)", args.get("disable_bias_linear", True) is not False),
        ("every layer a mixture of experts, softmax over the top-k", experts <= 1 or not all(moe_layers(args))
         or args.get("norm_topk_prob") is False or args.get("moe_router_pre_softmax")),
        ("no shared expert, no q / k norms, Llama's RoPE pairs on whole heads",
         args.get("moe_shared_expert_intermediate_size") or args.get("qk_layernorm") or args.get("rotary_interleaved")
         or float(args.get("rotary_percent") or 1.0) != 1.0),
    ) if bad]
    if problems:
        raise ValueError(f"this model has a config.json form only as gpt-oss, which needs {'; '.join(problems)}.")
    group = args.get("group_query_attention")
    config = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "hidden_size": int(args["hidden_size"]), "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": int(args.get("num_query_groups") or heads) if group else heads,
        "head_dim": kv_channels(args), "intermediate_size": int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
        "num_local_experts": experts, "num_experts_per_tok": int(args.get("moe_router_topk") or 2),
        "vocab_size": vocab_size, "max_position_embeddings": int(args.get("max_position_embeddings") or 4096),
        "rms_norm_eps": float(args.get("norm_epsilon") or 1e-5), "attention_bias": True,
        "rope_parameters": rope_parameters(args), "swiglu_alpha": 1.702,
        "swiglu_limit": float(args["activation_func_clamp_value"]) if args.get("activation_func_clamp_value") is not None else None,
        "sliding_window": int(window) if window else None,
        "layer_types": ["sliding_attention" if w else "full_attention" for w in pattern],
        "tie_word_embeddings": not args.get("untie_embeddings_and_output_weights", False),
        "dtype": DTYPE_NAMES.get(dtype, "float32"),
    }
    return config


def glm4_moe_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype,
                    model_type: str = "glm4_moe") -> dict[str, Any]:
    """GLM-4.5's config.json (glm4_moe) for an MoE model with sigmoid routing or dense layers among
    the MoE ones, or DeepSeek-V3's (deepseek_v3: the same MoE with multi-latent attention), or
    DeepSeek-V2's (deepseek_v2: multi-latent attention, softmax routing without renormalising)
    (models/hf_moe_config.glm4_moe_args / deepseek_v2_moe_args, hf_moe_config.mla_args, read back the same); what it
    cannot say is refused."""
    mla, v2 = model_type in ("deepseek_v3", "deepseek_v2"), model_type == "deepseek_v2"
    if int(args.get("num_experts") or 0) <= 1:
        raise ValueError("multi-latent attention has a config.json form only as DeepSeek-V2 / V3, a mixture of "
                         "experts; a dense model with multi_latent_attention cannot be exported.")
    pattern = moe_layers(args)
    dense = pattern.index(1)
    experts, topk = int(args["num_experts"]), int(args.get("moe_router_topk") or 2)
    f = int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"])
    shared = int(args.get("moe_shared_expert_intermediate_size") or 0)
    groups, group_topk = int(args.get("moe_router_num_groups") or 1), int(args.get("moe_router_group_topk") or 1)
    problems = [what for what, bad in (
        ("MoE layers after the first dense ones only (moe_layer_freq)", pattern != [0] * dense + [1] * (len(pattern) - dense)),
        ("sigmoid routing with an expert bias (moe_router_score_function, moe_router_enable_expert_bias)",
         not v2 and (args.get("moe_router_score_function") != "sigmoid" or not args.get("moe_router_enable_expert_bias"))),
        ("softmax over all experts, the top-k not renormalised (norm_topk_prob: false), no expert bias",
         v2 and (args.get("norm_topk_prob") is not False and not args.get("moe_router_pre_softmax")
                 or args.get("moe_router_enable_expert_bias"))),
        ("shared experts as wide as a multiple of moe_ffn_hidden_size, without a gate", shared % f or args.get("shared_expert_gate")),
        ("groups ranked by their two best scores (moe_router_topk / moe_router_group_topk = 2)",
         not v2 and groups > 1 and topk != 2 * group_topk),
        ("groups ranked by their best score (moe_router_topk = moe_router_group_topk)",
         v2 and groups > 1 and topk != group_topk),
        ("Llama's RoPE pairs, optionally on part of each head, RMSNorm before attention and MLP only",
         not mla and (args.get("rotary_interleaved") or args.get("post_norm") or args.get("pre_norm") is False
                      or args.get("qk_layernorm_across_heads") or args.get("sliding_window") or args.get("no_rope_freq"))),
        ("RMSNorms on the compressed query and key / value (qk_layernorm: true), no biases or other norms on the "
         "attention, RMSNorm before attention and MLP only",
         mla and (not args.get("qk_layernorm") or args.get("add_qkv_bias") or args.get("post_norm")
                  or args.get("pre_norm") is False or args.get("sliding_window") or args.get("no_rope_freq"))),
    ) if bad]
    if problems:
        what = (f"multi-latent attention with {'softmax' if v2 else 'sigmoid'} routing has a config.json form only as "
                f"DeepSeek-{'V2' if v2 else 'V3'} ({model_type})" if mla else
                "a mixture of experts with sigmoid routing or dense layers has a config.json form only as GLM-4.5 "
                "(glm4_moe)")
        raise ValueError(f"{what}, which needs {'; '.join(problems)}.")
    partial = float(args.get("rotary_percent") or 1.0)
    rope = rope_parameters(args) if mla else dict(rope_parameters(args), partial_rotary_factor=partial)
    cls = {"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM"}.get(model_type, "Glm4MoeForCausalLM")
    config = base_config(args, vocab_size, dtype, model_type, cls, rope, eps=1e-5)
    config.update(hidden_act="silu", n_routed_experts=experts, num_experts_per_tok=topk,
                  moe_intermediate_size=f, n_shared_experts=shared // f, first_k_dense_replace=dense,
                  norm_topk_prob=not v2, n_group=groups, topk_group=group_topk,
                  routed_scaling_factor=float(args.get("moe_router_topk_scaling_factor") or 1.0),
                  num_nextn_predict_layers=0)
    if mla:  # DeepSeek-V3's names of the MLA dimensions; vLLM reads scoring_func / topk_method for the routing
        config.update(attention_bias=False, q_lora_rank=int(args["q_lora_rank"]) if args.get("q_lora_rank") else None,
                      kv_lora_rank=int(args["kv_lora_rank"]), qk_nope_head_dim=int(args["qk_head_dim"]),
                      qk_rope_head_dim=int(args["qk_pos_emb_head_dim"]), v_head_dim=int(args["v_head_dim"]),
                      head_dim=int(args["qk_pos_emb_head_dim"]), moe_layer_freq=1)
        if v2:
            config.update(scoring_func="softmax", topk_method="group_limited_greedy" if groups > 1 else "greedy")
        else:
            config.update(rope_interleave=True, scoring_func="sigmoid", topk_method="noaux_tc")
    else:
        config.update(attention_bias=bool(args.get("add_qkv_bias")), partial_rotary_factor=partial,
                      use_qk_norm=bool(args.get("qk_layernorm")))
    return config


def minimax_m2_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """MiniMax-M2's config.json (minimax_m2, MiniMaxM2ForCausalLM) for an MoE model with q / k norms across
    heads (models/hf_moe_config.minimax_m2_moe_args, read back the same): every layer MoE, sigmoid routing with
    an expert bias, renormalised, Llama's RoPE pairs on the first rotary_dim of each head, no biases, shared
    experts, groups, routed scale or other norms. vLLM reads rotary_dim, scoring_func and use_routing_bias."""
    experts, topk = int(args.get("num_experts") or 0), int(args.get("moe_router_topk") or 2)
    problems = [what for what, bad in (
        ("every layer an MoE layer (moe_layer_freq)", not all(moe_layers(args))),
        ("sigmoid routing with an expert bias (moe_router_score_function, moe_router_enable_expert_bias)",
         args.get("moe_router_score_function") != "sigmoid" or not args.get("moe_router_enable_expert_bias")),
        ("no shared expert, expert groups or routed scale", args.get("moe_shared_expert_intermediate_size")
         or int(args.get("moe_router_num_groups") or 1) > 1
         or float(args.get("moe_router_topk_scaling_factor") or 1.0) != 1.0),
        ("no biases (add_qkv_bias, disable_bias_linear: true)", args.get("add_qkv_bias")
         or args.get("disable_bias_linear") is False),
        ("Llama's RoPE pairs, qk_layernorm, RMSNorm before attention and MLP only, full attention",
         not args.get("qk_layernorm") or args.get("rotary_interleaved") or args.get("post_norm")
         or args.get("sliding_window") or args.get("no_rope_freq") or args.get("multi_latent_attention")),
    ) if bad]
    if problems:
        raise ValueError(f"an MoE model with q / k norms across heads has a config.json form only as MiniMax-M2 "
                         f"(minimax_m2), which needs {'; '.join(problems)}.")
    partial = float(args.get("rotary_percent") or 1.0)
    config = base_config(args, vocab_size, dtype, "minimax_m2", "MiniMaxM2ForCausalLM",
                         dict(rope_parameters(args), partial_rotary_factor=partial), eps=1e-6)
    config.update(hidden_act="silu", intermediate_size=int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
                  num_local_experts=experts, num_experts_per_tok=topk, rotary_dim=int(config["head_dim"] * partial),
                  scoring_func="sigmoid", use_routing_bias=True, use_qk_norm=True, qk_norm_type="per_layer",
                  shared_intermediate_size=0, router_jitter_noise=0.0, attention_bias=False,
                  attn_type_list=[1] * config["num_hidden_layers"], use_mtp=False, num_mtp_modules=0)
    return config


def hunyuan_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """HunYuan's config.json (hunyuan_v1_dense, HunYuanDenseV1ForCausalLM) for a model whose per-head q / k norms
    apply after RoPE (qk_layernorm_after_rope), HunYuan-MoE's (hunyuan_v1_moe) where it has experts (read back the
    same: models/hf_moe_config.hunyuan_moe_args), otherwise Llama's layout: a SwiGLU MLP, no biases, window,
    partial or interleaved rotary, NoPE layers, post norms or multipliers. The RoPE is written as it is in args
    (HunYuan's NTK alpha was read as the default RoPE at its stretched theta, and is written so)."""
    extra = [k for k in ("add_qkv_bias", "sliding_window", "no_rope_freq", "rotary_interleaved",
                         "post_norm", "qk_layernorm_across_heads", "multi_latent_attention", "add_rmsnorm_offset",
                         "input_embeds_norm", "geglu", "squared_relu", "xielu", "softmax_scale", "window_attn_skip_freq")
             if args.get(k)]
    moe = int(args.get("num_experts") or 0) > 1
    width = int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"])
    if moe and (not all(moe_layers(args)) or (args.get("moe_router_score_function") or "softmax") != "softmax"
                or args.get("moe_router_enable_expert_bias") or int(args.get("moe_router_num_groups") or 1) > 1
                or float(args.get("moe_router_topk_scaling_factor") or 1.0) != 1.0
                or not args.get("norm_topk_prob", not args.get("moe_router_pre_softmax", False))
                or int(args.get("moe_shared_expert_intermediate_size") or 0) != width or args.get("shared_expert_gate")):
        extra.append("MoE other than HunYuan-MoE's (every layer MoE, softmax routing renormalised, one shared expert "
                     "without a gate as wide as the experts)")
    extra += [k for k in ("embedding_multiplier_scale", "residual_multiplier", "output_multiplier_scale")
              if float(args.get(k) or 1.0) != 1.0]
    if float(args.get("rotary_percent") or 1.0) != 1.0:
        extra.append("rotary_percent")
    if not args.get("qk_layernorm") or args.get("pre_norm") is False or args.get("disable_bias_linear") is False \
            or not gated_mlp(args):
        extra.append("not qk_layernorm, pre_norm, no biases and a gated MLP")
    if extra:
        raise ValueError(f"qk_layernorm_after_rope has a config.json form only as HunYuan (hunyuan_v1_dense: per-head "
                         f"q / k norms after RoPE on a Llama-style model), which has no {', '.join(extra)}.")
    config = base_config(args, vocab_size, dtype, "hunyuan_v1_moe" if moe else "hunyuan_v1_dense",
                         "HunYuanMoEV1ForCausalLM" if moe else "HunYuanDenseV1ForCausalLM", rope_parameters(args), eps=1e-5)
    config.update(hidden_act="silu", attention_bias=False, mlp_bias=False)
    if moe:  # HunYuan-MoE: the experts and the shared MLP intermediate_size wide (models/hf_moe_config.hunyuan_moe_args)
        config.update(intermediate_size=width, num_experts=int(args["num_experts"]),
                      moe_topk=int(args.get("moe_router_topk") or 1), num_shared_expert=1, use_mixed_mlp_moe=True,
                      moe_intermediate_size=width, use_cla=False, moe_layer_num_skipped=0)
    return config


def olmoe_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """OLMoE's config.json (olmoe, OlmoeForCausalLM) for an MoE model with q / k norms across heads under the usual
    pre-norms and softmax routing, or FlexOlmo's (flex_olmo, FlexOlmoForCausalLM) for one with OLMo 2's norms after
    attention and MLP only (pre_norm: false, post_norm), both read back the same (models/hf_config.py): every layer
    MoE, experts intermediate_size wide, the top-k renormalised or not (norm_topk_prob), no shared expert, expert
    bias, groups or routed scale, no biases, Llama's RoPE on whole heads of hidden_size / num_attention_heads."""
    flex = args.get("pre_norm", True) is False
    heads = int(args["num_attention_heads"])
    problems = [what for what, bad in (
        ("every layer an MoE layer (moe_layer_freq)", not all(moe_layers(args))),
        ("softmax routing without an expert bias, shared expert, groups or routed scale",
         (args.get("moe_router_score_function") or "softmax") != "softmax" or args.get("moe_router_enable_expert_bias")
         or args.get("moe_shared_expert_intermediate_size") or int(args.get("moe_router_num_groups") or 1) > 1
         or float(args.get("moe_router_topk_scaling_factor") or 1.0) != 1.0),
        ("no biases (add_qkv_bias, disable_bias_linear: true)", args.get("add_qkv_bias")
         or args.get("disable_bias_linear") is False),
        ("full rotary on Llama's pairs, full attention, head dimension hidden_size / num_attention_heads",
         float(args.get("rotary_percent") or 1.0) != 1.0 or args.get("rotary_interleaved") or args.get("sliding_window")
         or args.get("no_rope_freq") or args.get("multi_latent_attention")
         or int(args.get("kv_channels") or args["hidden_size"] // heads) * heads != int(args["hidden_size"])),
        ("qk_layernorm, and post_norm exactly when pre_norm is false (FlexOlmo's layers)",
         not args.get("qk_layernorm") or bool(args.get("post_norm")) != flex),
    ) if bad]
    if problems:
        raise ValueError(f"an MoE model with q / k norms across heads and softmax routing has a config.json form only "
                         f"as OLMoE (olmoe) or FlexOlmo (flex_olmo), which need {'; '.join(problems)}.")
    config = base_config(args, vocab_size, dtype, "flex_olmo" if flex else "olmoe",
                         "FlexOlmoForCausalLM" if flex else "OlmoeForCausalLM", rope_parameters(args),
                         eps=1e-6 if flex else 1e-5)
    config.update(hidden_act="silu", intermediate_size=int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
                  num_experts=int(args["num_experts"]), num_experts_per_tok=int(args.get("moe_router_topk") or 2),
                  norm_topk_prob=bool(args.get("norm_topk_prob", not args.get("moe_router_pre_softmax", False))),
                  attention_bias=False, pad_token_id=None)
    if not flex:
        config["clip_qkv"] = None
    return config


def interleaved_rope_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """The config.json of a dense model with RoPE on interleaved pairs (rotary_interleaved; models/hf_config.py reads
    each back the same): ERNIE 4.5's (ernie4_5) for every dimension rotated without biases or norms after attention
    and MLP, GLM-4-0414's (glm4) with those norms (post_norm), GLM-4's (glm) otherwise (q / k / v biases or part of
    each head rotated). All three are Llama-style otherwise: a SwiGLU MLP, plain RMSNorms before attention and MLP, no
    q / k norms, full attention, no Granite multipliers."""
    partial = float(args.get("rotary_percent") or 1.0)
    problems = [what for what, bad in (
        ("a SwiGLU MLP without biases (swiglu, disable_bias_linear: true)",
         not gated_mlp(args) or args.get("geglu") or args.get("disable_bias_linear") is False),
        ("plain RMSNorms before attention and MLP (no add_rmsnorm_offset, pre_norm: false, input_embeds_norm or q / k "
         "norms)", args.get("add_rmsnorm_offset") or args.get("pre_norm") is False or args.get("input_embeds_norm")
         or args.get("qk_layernorm") or args.get("normalization", "RMSNorm") != "RMSNorm"),
        ("full attention with RoPE in every layer, no Granite multipliers",
         args.get("sliding_window") or args.get("no_rope_freq") or args.get("window_attn_skip_freq") is not None
         or not plain_scaling(args)),
    ) if bad]
    if problems:
        raise ValueError(f"rotary_interleaved has a config.json form only as GLM-4 (glm / glm4) or ERNIE 4.5 (ernie4_5), "
                         f"which need {'; '.join(problems)}.")
    post = bool(args.get("post_norm"))
    if not post and partial == 1.0 and not args.get("add_qkv_bias"):
        model_type, cls = "ernie4_5", "Ernie4_5ForCausalLM"
    else:
        model_type, cls = ("glm4", "Glm4ForCausalLM") if post else ("glm", "GlmForCausalLM")
    rope = dict(rope_parameters(args))
    config = base_config(args, vocab_size, dtype, model_type, cls, rope, eps=1e-5)
    config.update(hidden_act="silu", pad_token_id=None)  # (GLM's default pad id lies outside other vocabularies)
    if model_type == "ernie4_5":
        config["use_bias"] = False
    else:
        config.update(attention_bias=bool(args.get("add_qkv_bias")), partial_rotary_factor=partial)
        config["rope_parameters"]["partial_rotary_factor"] = partial
    return config


def ernie4_5_moe_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """ERNIE 4.5 MoE's config.json (ernie4_5_moe, Ernie4_5_MoeForCausalLM) for an MoE model routed by softmax
    with an expert bias (models/hf_moe_config.ernie4_5_moe_args, read back the same): the top-k
    renormalised, shared experts a multiple of moe_ffn_hidden_size wide without a gate, MoE layers every
    moe_layer_interval-th from moe_layer_start_index to moe_layer_end_index, RoPE on interleaved pairs of
    every dimension, no biases, q / k norms, post norms, window, groups or routed scale."""
    pattern = moe_layers(args)
    f = int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"])
    shared = int(args.get("moe_shared_expert_intermediate_size") or 0)
    placed = ernie_moe_placement(pattern)
    renormalised = args.get("norm_topk_prob", not args.get("moe_router_pre_softmax", False))
    problems = [what for what, bad in (
        ("MoE layers every N-th between a first and a last one (moe_layer_freq)", placed is None),
        ("the top-k renormalised (norm_topk_prob: true)", not renormalised),
        ("shared experts as wide as a multiple of moe_ffn_hidden_size, without a gate", shared % f or args.get("shared_expert_gate")),
        ("no expert groups or routed scale", int(args.get("moe_router_num_groups") or 1) > 1
         or float(args.get("moe_router_topk_scaling_factor") or 1.0) != 1.0),
        ("no biases (add_qkv_bias, disable_bias_linear: true)", args.get("add_qkv_bias")
         or args.get("disable_bias_linear") is False),
        ("RoPE on interleaved pairs of every dimension (rotary_interleaved, rotary_percent 1), no q / k norms, "
         "RMSNorm before attention and MLP only, full attention",
         not args.get("rotary_interleaved") or float(args.get("rotary_percent") or 1.0) != 1.0
         or args.get("qk_layernorm") or args.get("post_norm") or args.get("pre_norm") is False
         or args.get("sliding_window") or args.get("no_rope_freq") or args.get("multi_latent_attention")),
    ) if bad]
    if problems:
        raise ValueError(f"an MoE model routed by softmax with an expert bias has a config.json form only as ERNIE 4.5 "
                         f"MoE (ernie4_5_moe), which needs {'; '.join(problems)}.")
    start, interval, end = placed
    config = base_config(args, vocab_size, dtype, "ernie4_5_moe", "Ernie4_5_MoeForCausalLM", rope_parameters(args),
                         eps=1e-5)
    config.update(hidden_act="silu", use_bias=False, moe_num_experts=int(args["num_experts"]),
                  moe_k=int(args.get("moe_router_topk") or 2), moe_intermediate_size=f,
                  moe_num_shared_experts=shared // f, moe_layer_start_index=start, moe_layer_interval=interval,
                  moe_layer_end_index=end, moe_norm_min=1e-12)
    return config


def ernie_moe_placement(pattern: list[int]) -> Optional[tuple[int, int, int]]:
    """(moe_layer_start_index, moe_layer_interval, moe_layer_end_index) that place the MoE layers of
    `pattern` (one 0 / 1 per layer) as ERNIE 4.5 does (hf_moe_config.ernie_moe_layers), or None."""
    ones = [i for i, x in enumerate(pattern) if x]
    for interval in range(1, len(pattern) + 1):
        if [1 if (i + 1) % interval == 0 and ones[0] <= i <= ones[-1] else 0 for i in range(len(pattern))] == pattern:
            return ones[0], interval, ones[-1]
    return None


GEMMA_KEYS = ("add_rmsnorm_offset", "post_norm", "input_embeds_norm", "geglu")


def qwen3_5_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Qwen3.5's text config.json (qwen3_5_text, Qwen3_5ForCausalLM): Gated DeltaNet layers where
    linear_attention_layers marks them, output-gated attention with per-head q / k norms in the others,
    (1 + w) norms, a SwiGLU MLP, the default rope on part of each head; Qwen3.5-MoE's (qwen3_5_moe_text,
    Qwen3_5MoeForCausalLM) with Qwen2-MoE's experts in every layer (softmax routing renormalised, a gated
    shared expert); Qwen3-Next's (qwen3_next, Qwen3NextForCausalLM) for those experts with the top-k not
    renormalised or dense layers among them (mlp_only_layers). Other combinations have no form."""
    want = {"attention_output_gate": True, "add_rmsnorm_offset": True, "qk_layernorm": True, "swiglu": True}
    wrong = [f"{k}: {str(bool(args.get(k))).lower()}" for k, v in want.items() if bool(args.get(k, k == "swiglu")) != v]
    extra = [k for k in ("add_qkv_bias", "no_rope_freq", "softmax_scale", "post_norm",
                         "input_embeds_norm", "geglu", "qk_layernorm_across_heads", "sliding_window",
                         "window_attn_skip_freq", "multi_latent_attention") if args.get(k)]
    moe = int(args.get("num_experts") or 0) > 1  # Qwen3.5-MoE: Qwen2-MoE's experts in every layer, renormalised
    renormalised = args.get("norm_topk_prob", not args.get("moe_router_pre_softmax", False))
    pattern = moe_layers(args)
    # Qwen3-Next says what Qwen3.5-MoE cannot: the top-k not renormalised, dense layers (mlp_only_layers)
    model_type = ("qwen3_next" if moe and (not renormalised or not all(pattern)) else
                  "qwen3_5_moe_text" if moe else "qwen3_5_text")
    if moe:
        extra += [what for what, bad in (
            ("no gated shared expert", not (args.get("moe_shared_expert_intermediate_size") and args.get("shared_expert_gate"))),
            (f"{args.get('moe_router_score_function')} routing", (args.get("moe_router_score_function") or "softmax") != "softmax"),
            ("an expert bias", bool(args.get("moe_router_enable_expert_bias")))) if bad]
    rope = rope_parameters(args)
    if rope["rope_type"] != "default":
        extra.append(f"rope_scaling_type {args.get('rope_scaling_type')}")
    marks = list(args.get("linear_attention_layers") or [0] * int(args["num_layers"]))
    if wrong or extra:
        raise ValueError(f"Gated DeltaNet layers / attention_output_gate have a config.json form only as Qwen3.5 "
                         f"or Qwen3-Next ({', '.join(f'{k}: {str(v).lower()}' for k, v in want.items())}, the default "
                         f"rope); this model has {', '.join(wrong + [f'{k} set' for k in extra])}.")
    config = base_config(args, vocab_size, dtype, model_type, {
        "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
        "qwen3_next": "Qwen3NextForCausalLM"}[model_type], rope, eps=1e-6)
    if model_type == "qwen3_5_moe_text":  # every MLP an MoE: no dense width
        del config["intermediate_size"]
    if moe:
        config.update(num_experts=int(args["num_experts"]), num_experts_per_tok=int(args["moe_router_topk"]),
                      moe_intermediate_size=int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
                      shared_expert_intermediate_size=int(args["moe_shared_expert_intermediate_size"]))
    if model_type == "qwen3_next":
        config.update(norm_topk_prob=bool(renormalised), decoder_sparse_step=1,
                      mlp_only_layers=[i for i, m in enumerate(pattern) if not m])
    partial = float(args.get("rotary_percent") or 1.0)
    config["rope_parameters"]["partial_rotary_factor"] = partial
    config.pop("rope_theta", None)  # transformers 5 reads rope_parameters; Qwen3_5TextConfig takes no rope_theta
    config.update(hidden_act="silu", attention_bias=False, partial_rotary_factor=partial,
                  layer_types=["linear_attention" if m else "full_attention" for m in marks])
    if any(marks):
        config.update({k: int(args[k]) for k in ("linear_num_key_heads", "linear_num_value_heads",
                                                 "linear_key_head_dim", "linear_value_head_dim")},
                      linear_conv_kernel_dim=int(args.get("linear_conv_kernel_dim") or 4))
    return config


def qwen3_next_form(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Qwen3.5-MoE text config.json (qwen3_5_moe_text) as the Qwen3-Next one (qwen3_next) that says the same
    model: the same layers (Gated DeltaNet, output-gated attention, (1 + w) norms, RoPE on part of each head;
    M-RoPE on text is the 1-D RoPE) with Qwen2-MoE's experts renormalised in every layer; the weights differ in
    layout only (in_proj_qkvz / in_proj_ba: names.group). The vLLM engine serves Qwen3.5-MoE so: vLLM's own
    Qwen3.5 module imports torchvision, which the CPU vLLM environment cannot have. (Dense Qwen3.5 has no such
    form there: vLLM 0.32's Qwen3-Next needs an MoE layer.) Other configs are returned unchanged."""
    from mindspeed_rl.models.hf_config import without_mrope

    if config.get("model_type") != "qwen3_5_moe_text":
        return dict(config)
    out = without_mrope(config)
    out.update(model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], norm_topk_prob=True,
               decoder_sparse_step=1, mlp_only_layers=[],
               intermediate_size=out.get("intermediate_size") or out.get("moe_intermediate_size"))
    return out


def olmo_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """OLMo 2's config.json (olmo2, Olmo2ForCausalLM): post norms only (pre_norm false, post_norm), q / k
    norms across heads, otherwise a plain Llama-style model; OLMo 3's (olmo3, Olmo3ForCausalLM) where
    it also has sliding-window layers (sliding_window, window_attn_skip_freq): layer types from
    window_attn_skip_freq (none: every layer slides), the sliding layers' default rope at
    rope_local_base_freq (default: rotary_base). Other combinations have no form."""
    want = {"pre_norm": False, "post_norm": True, "qk_layernorm": True, "qk_layernorm_across_heads": True}
    wrong = [f"{k}: {str(args.get(k, k == 'pre_norm')).lower()}" for k, v in want.items()
             if bool(args.get(k, k == "pre_norm")) != v]
    extra = [k for k in ("add_qkv_bias", "num_experts", "no_rope_freq", "softmax_scale", "add_rmsnorm_offset",
                         "input_embeds_norm", "geglu") if args.get(k)]
    olmo3 = bool(args.get("sliding_window")) or args.get("window_attn_skip_freq") is not None
    if args.get("rope_local_base_freq") and not olmo3:
        extra.append("rope_local_base_freq without sliding_window / window_attn_skip_freq (OLMo 3's)")
    heads = int(args["num_attention_heads"])
    if int(args.get("kv_channels") or args["hidden_size"] // heads) * heads != int(args["hidden_size"]):
        extra.append("kv_channels x num_attention_heads != hidden_size (OLMo's head_dim is their quotient)")
    if wrong or extra or float(args.get("rotary_percent") or 1.0) != 1.0:
        raise ValueError(f"pre_norm / qk_layernorm_across_heads have a config.json form only as OLMo 2 or 3 "
                         f"(pre_norm: false, post_norm, qk_layernorm and qk_layernorm_across_heads: true, OLMo 3's "
                         f"sliding windows, nothing else); this model has {', '.join(wrong + extra) or 'partial rotary'}.")
    rope = rope_parameters(args)
    config = base_config(args, vocab_size, dtype, "olmo3" if olmo3 else "olmo2",
                         "Olmo3ForCausalLM" if olmo3 else "Olmo2ForCausalLM", rope, eps=1e-6)
    config.update(hidden_act="silu", attention_bias=False, pad_token_id=None)
    if olmo3:
        config.update(layer_types_config(args, config), rope_parameters=per_type_rope(args, rope))
    return config


def exaone4_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """EXAONE 4.0's config.json (exaone4, Exaone4ForCausalLM; models/hf_config.exaone4_args reads it back the same):
    OLMo 2's post norms (pre_norm false, post_norm) with per-head q / k norms, a Llama-style model otherwise; every
    layer full attention with RoPE (1.2B), or sliding layers with RoPE where window_attn_skip_freq marks them and
    full ones without (32B: no_rope_freq exactly on the full layers). Other combinations have no form."""
    layers = int(args["num_layers"])
    hybrid, fits = sliding_nope_layout(args)
    problems = [what for what, bad in (
        ("norms after attention and MLP only, per-head q / k norms (pre_norm: false, post_norm, qk_layernorm)",
         args.get("post_norm") is not True or args.get("add_rmsnorm_offset") or args.get("input_embeds_norm")),
        ("a dense SwiGLU model without biases",
         int(args.get("num_experts") or 0) > 1 or not gated_mlp(args) or args.get("geglu") or args.get("add_qkv_bias")
         or args.get("disable_bias_linear") is False or args.get("multi_latent_attention")),
        ("RoPE on Llama's pairs of whole heads, no Granite multipliers or softmax_scale",
         float(args.get("rotary_percent") or 1.0) != 1.0 or args.get("rotary_interleaved") or not plain_scaling(args)),
        ("RoPE in every layer without windows, or in the sliding layers only (no_rope_freq on the full ones)",
         not fits),
    ) if bad]
    if problems:
        raise ValueError(f"norms after attention and MLP with per-head q / k norms have a config.json form only as EXAONE "
                         f"4.0 (exaone4), which needs {'; '.join(problems)}.")
    config = base_config(args, vocab_size, dtype, "exaone4", "Exaone4ForCausalLM", rope_parameters(args), eps=1e-5)
    config.update(hidden_act="silu", pad_token_id=None, sliding_window=None, sliding_window_pattern=None,
                  layer_types=["full_attention"] * layers)
    if hybrid:
        config.update(layer_types_config(args, config))
    return config


def hyperclovax_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """HyperCLOVA X's config.json (hyperclovax, HyperCLOVAXForCausalLM; models/hf_config reads it back the same): a
    Llama or Granite model (its four scalars, logits_scaling a multiplier here) with Peri-LN, plain RMSNorms on the
    attention and MLP outputs beside the pre-norms."""
    base = _config_from_args({k: v for k, v in args.items() if k != "post_norm"}, vocab_size, dtype)
    if base["model_type"] not in ("llama", "granite"):
        raise ValueError(f"norms on the attention and MLP outputs beside the pre-norms (post_norm) have a config.json "
                         f"form here only as HyperCLOVA X (a Llama or Granite model around them); this one's layers are a "
                         f"{base['model_type']}'s.")
    return dict(base, model_type="hyperclovax", architectures=["HyperCLOVAXForCausalLM"], use_post_norm=True,
                embedding_multiplier=float(args.get("embedding_multiplier_scale") or 1.0),
                residual_multiplier=float(args.get("residual_multiplier") or 1.0),
                logits_scaling=float(args.get("output_multiplier_scale") or 1.0),
                attention_multiplier=float(args.get("softmax_scale") or base["head_dim"] ** -0.5))


def exaone_moe_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """EXAONE MoE's config.json (exaone_moe, ExaoneMoeForCausalLM; models/hf_config reads it back the same): GLM-4.5's
    mixture of experts (glm4_moe_config, what it refuses refused) with per-head q / k norms under pre-norms, RoPE on
    whole heads, no biases, and EXAONE 4.0's sliding layers with RoPE and full ones without."""
    problems = [what for what, bad in (
        ("per-head q / k norms, no biases, RoPE on whole heads",
         not args.get("qk_layernorm") or args.get("add_qkv_bias") or float(args.get("rotary_percent") or 1.0) != 1.0),
        ("RoPE in the sliding layers only (no_rope_freq exactly on the full ones)", not sliding_nope_layout(args)[1]),
    ) if bad]
    if problems:
        raise ValueError(f"sliding layers in a sigmoid-routed mixture of experts have a config.json form only as EXAONE "
                         f"MoE (exaone_moe), which needs {'; '.join(problems)}.")
    moe = glm4_moe_config({k: v for k, v in args.items() if k not in ("sliding_window", "window_attn_skip_freq",
                                                                     "no_rope_freq")}, vocab_size, dtype)
    layers, dense = moe["num_hidden_layers"], moe["first_k_dense_replace"]
    config = {k: v for k, v in moe.items() if k not in ("n_routed_experts", "n_shared_experts", "num_nextn_predict_layers",
                                                        "partial_rotary_factor", "use_qk_norm", "attention_bias")}
    config.update(model_type="exaone_moe", architectures=["ExaoneMoeForCausalLM"], num_experts=moe["n_routed_experts"],
                  num_shared_experts=moe["n_shared_experts"], mlp_layer_types=["dense"] * dense + ["sparse"] * (layers - dense),
                  **layer_types_config(args, config))
    return config


def mellum_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Mellum's config.json (mellum, MellumForCausalLM; models/hf_config.mellum_args reads it back the same) for a model
    with Qwen3-MoE's layers (what else Qwen3-MoE's config.json cannot say refused there) and sliding layers, which
    rotate with the default rope at rope_local_base_freq on the same part of each head as the full layers; its dense
    layers as mlp_layer_types."""
    rest = {k: v for k, v in args.items() if k not in ("window_attn_skip_freq", "rope_local_base_freq", "sliding_window")}
    base = _config_from_args(rest, vocab_size, dtype)
    if base["model_type"] != "qwen3_moe" or base.get("no_rope_layers"):
        raise ValueError(f"sliding layers in a softmax-routed mixture of experts with q / k norms have a config.json "
                         f"form only as Mellum (Qwen3-MoE's layers, RoPE in every layer); this one's layers are a "
                         f"{base['model_type']}'s{' with NoPE layers' if base.get('no_rope_layers') else ''}.")
    config = {k: v for k, v in base.items() if k not in ("decoder_sparse_step", "mlp_only_layers", "use_sliding_window",
                                                         "max_window_layers", "rope_theta")}
    rope = per_type_rope(args, base["rope_parameters"])
    partial = float(base["rope_parameters"].get("partial_rotary_factor") or 1.0)
    if partial != 1.0:
        rope["sliding_attention"]["partial_rotary_factor"] = partial
    config.update(model_type="mellum", architectures=["MellumForCausalLM"], rope_parameters=rope,
                  mlp_layer_types=["sparse" if m else "dense" for m in moe_layers(args)], **layer_types_config(args, config))
    return config


def gemma1_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype, gemma: list) -> dict[str, Any]:
    """Gemma 1's config.json (gemma, GemmaForCausalLM): add_rmsnorm_offset, input_embeds_norm and
    geglu on an otherwise plain Llama-style model (no q/k norms, windows, caps or other variants)."""
    extra = [k for k in ("qk_layernorm", "add_qkv_bias", "num_experts", "no_rope_freq", "sliding_window",
                         "window_attn_skip_freq", "rope_local_base_freq", "attn_logit_softcapping",
                         "output_logit_softcapping", "softmax_scale", "rope_scaling_type") if args.get(k) is not None
             and args.get(k) is not False]
    extra += [k for k in ("embedding_multiplier_scale", "residual_multiplier", "output_multiplier_scale")
              if float(args.get(k) or 1.0) != 1.0]
    missing = [k for k in ("add_rmsnorm_offset", "input_embeds_norm", "geglu") if not args.get(k)]
    if missing or extra or float(args.get("rotary_percent") or 1.0) != 1.0:
        raise ValueError(f"{', '.join(gemma)} without post_norm {'have' if len(gemma) > 1 else 'has'} a config.json "
                         f"form only as Gemma 1 (add_rmsnorm_offset, input_embeds_norm and geglu on a plain model); "
                         f"this model {'lacks ' + ', '.join(missing) if missing else 'also sets ' + ', '.join(extra)}.")
    config = base_config(args, vocab_size, dtype, "gemma", "GemmaForCausalLM", rope_parameters(args), eps=1e-6)
    config.update(hidden_act="gelu_pytorch_tanh", attention_bias=False)
    return config


def gemma_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype, gemma: list) -> dict[str, Any]:
    """Gemma 3's config.json (gemma3_text, Gemma3ForCausalLM) for args with Gemma's keys and q/k norms,
    Gemma 2's (gemma2, Gemma2ForCausalLM) without them. config.json has these keys together only:
    all four of GEMMA_KEYS, no biases, no MoE, RoPE in every layer, no Granite multipliers; Gemma 2
    has one rotary table (no rope_local_base_freq). Layer types from window_attn_skip_freq (none:
    every layer slides); Gemma 3's sliding layers rotate with rope_local_base_freq (default:
    rotary_base); the soft caps are Gemma 2's (attn_logit_softcapping, output_logit_softcapping). Without post_norm:
    VaultGemma's (vaultgemma: Gemma 2 without its norms after attention and MLP) where Gemma 2's attention keys say
    so (layer types, soft caps, a score scale), else Gemma 1's."""
    vault = not args.get("post_norm") and not args.get("qk_layernorm") and any(
        args.get(k) is not None for k in ("window_attn_skip_freq", "attn_logit_softcapping", "output_logit_softcapping",
                                          "softmax_scale"))
    if not args.get("post_norm") and not vault:  # Gemma 1: the norms, the embedding scale and GeGLU only
        return gemma1_config(args, vocab_size, dtype, gemma)
    gemma2 = not args.get("qk_layernorm")
    others = [k for k in ("add_qkv_bias", "num_experts", "no_rope_freq") if args.get(k)]
    others += [k for k in ("embedding_multiplier_scale", "residual_multiplier", "output_multiplier_scale")
               if float(args.get(k) or 1.0) != 1.0]
    if gemma2 and args.get("rope_local_base_freq"):
        others.append("rope_local_base_freq without qk_layernorm")
    missing = [k for k in GEMMA_KEYS if not args.get(k) and not (vault and k == "post_norm")]
    if missing or others or float(args.get("rotary_percent") or 1.0) != 1.0 or args.get("swiglu", False):
        problems = ([f"lacks {', '.join(missing)}"] if missing else []) + \
                   ([f"also sets {', '.join(others)}"] if others else [])
        raise ValueError(f"{', '.join(gemma)} {'have' if len(gemma) > 1 else 'has'} a config.json form only as Gemma 3 "
                         f"or Gemma 2 (all of {', '.join(GEMMA_KEYS)}, swiglu false, full rotary; q/k norms and "
                         f"rope_local_base_freq in Gemma 3 only); this model {' and '.join(problems) or 'is not one'}.")
    rope = rope_parameters(args)
    kind = "vaultgemma" if vault else "gemma2" if gemma2 else "gemma3_text"
    config = base_config(args, vocab_size, dtype, kind, {"vaultgemma": "VaultGemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                                                         "gemma3_text": "Gemma3ForCausalLM"}[kind], rope, eps=1e-6)
    scale = args.get("softmax_scale")
    scalar = config["head_dim"] if not scale else 1.0 / float(scale) ** 2
    config.update(layer_types_config(args, config), hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                  query_pre_attn_scalar=round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar,
                  attn_logit_softcapping=args.get("attn_logit_softcapping"),
                  final_logit_softcapping=args.get("output_logit_softcapping"))
    if not gemma2:  # Gemma 3: one rotary table per layer type
        per_type = per_type_rope(args, rope)
        config.update(rope_parameters=per_type, rope_local_base_freq=per_type["sliding_attention"]["rope_theta"])
    return config
