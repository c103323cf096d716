"""Hugging Face config.json -> megatron's MoE arguments (dict logic, no megatron): how each MoE model type
routes (softmax or sigmoid, top-k renormalised or not, the expert bias, groups, routed scale), its shared
experts, which layers are dense, and the multi-token-prediction layers a checkpoint keeps after its last
layer; and the multi-latent attention of the DeepSeek-V3 family's MoE models (mla_args). models/hf_config.
model_config_from_hf calls moe_args_from_hf for an MoE config.json, mla_args for an MLA one.
"""

from __future__ import annotations

from typing import Any, Mapping

# DeepSeek-V3's MoE routing (glm4_moe_args): sigmoid scores + expert bias, groups, routed scale, shared experts
V3_ROUTING = ("glm4_moe", "deepseek_v3", "glm4_moe_lite", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe")

# transformers' HYV3Config (Hy3-preview's sizes) where config.json leaves a key out
HY_V3_DEFAULTS = {"rope_theta": 11158840.0, "rms_norm_eps": 1e-5, "head_dim": 128, "num_experts": 192,
                  "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 1536,
                  "router_scaling_factor": 2.826}


def hy_v3_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Hy3 (hy_v3: Tencent's Hy3-preview) config.json under the names glm4_moe_args takes, as transformers' HYV3
    reads it: Llama's attention with per-head q / k norms before RoPE, the first layers dense (mlp_layer_types, or
    first_k_dense_replace, which vLLM reads: first_dense_layers), then DeepSeek-V3's routing without groups (sigmoid
    scores, the top-k chosen by score + expert_bias, renormalised, x router_scaling_factor) beside
    num_shared_experts x moe_intermediate_size wide shared experts. Its releases also carry the keys vLLM's module
    reads (expert_hidden_dim for moe_intermediate_size, route_norm, qk_norm); where they say other than transformers
    does, it is refused, since rollout and training would differ. enable_moe_fp32_combine (the shared experts' output
    added in fp32) is exact in fp32 and within rounding in bf16."""
    hf = dict(hf)
    theirs, ours = "expert_hidden_dim", "moe_intermediate_size"
    if hf.get(theirs) is not None and hf.get(ours) is not None and int(hf[theirs]) != int(hf[ours]):
        raise ValueError(f"config.json {theirs} {hf[theirs]} disagrees with {ours} {hf[ours]}: vLLM reads the one and "
                         f"transformers the other; make them agree.")
    if hf.get(ours) is None:
        hf[ours] = hf.get(theirs)
    for key, what in (("route_norm", "renormalises the top-k expert weights"), ("qk_norm", "normalises q and k")):
        if hf.get(key) is False:
            raise ValueError(f"config.json {key} false is not supported for hy_v3: transformers' HYV3 always {what} "
                             f"(vLLM would not); Hy3's releases set it true.")
    hf = {**hf, **{k: v for k, v in HY_V3_DEFAULTS.items() if hf.get(k) is None}}
    # (transformers' HYV3 and vLLM's route over all experts at once, whatever n_group says)
    return {**hf, "n_group": None, "topk_group": None, "routed_scaling_factor": hf["router_scaling_factor"],
            "norm_topk_prob": True}


def _ling_routing_problems(hf: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """(what, whether config.json says it) for the routing keys of Ling's (Bailing's) vLLM modules, which Sarvam's
    releases carry, that would make vLLM route otherwise than transformers' GLM-4.5 / DeepSeek-V3 does."""
    return [(f"score_function {hf.get('score_function')!r} (transformers scores by sigmoid)",
             hf.get("score_function") not in (None, "sigmoid")),
            ("moe_router_enable_expert_bias false (transformers adds the expert bias)",
             hf.get("moe_router_enable_expert_bias") is False),
            (f"moe_shared_expert_intermediate_size {hf.get('moe_shared_expert_intermediate_size')} (transformers' shared "
             f"experts are moe_intermediate_size {hf.get('moe_intermediate_size')} wide each)",
             hf.get("moe_shared_expert_intermediate_size") not in (None, hf.get("moe_intermediate_size")))]


# transformers' SarvamMoEConfig (Sarvam-30B's sizes) where config.json leaves a key out
SARVAM_MOE_DEFAULTS = {"rope_theta": 8000000.0, "head_dim": 64, "use_qk_norm": True, "first_k_dense_replace": 1,
                       "moe_intermediate_size": 1024, "num_experts_per_tok": 6, "routed_scaling_factor": 2.5,
                       "norm_topk_prob": True, "n_group": 1, "topk_group": 1}


def sarvam_moe_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Sarvam MoE (sarvam_moe: Sarvam-30B) config.json as transformers reads it: GLM-4.5's model (Glm4MoeForCausalLM:
    per-head q / k RMSNorms, DeepSeek-V3's routing, num_shared_experts x moe_intermediate_size wide shared experts)
    under Ling's (Bailing's) names and keys, RoPE on whole heads unless partial_rotary_factor says. Its releases also
    carry keys vLLM's SarvamMoEForCausalLM (Bailing's module) reads; where they say what transformers does not compute
    (another score_function, no expert bias, biases on every linear, RoPE on rotary_dim dimensions, shared experts of
    another width), it is refused in one sentence, since rollout and training would differ."""
    hf = {**hf, **{k: v for k, v in SARVAM_MOE_DEFAULTS.items() if hf.get(k) is None}}
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    partial = float((hf.get("rope_parameters") or {}).get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0)
    rotary = int(head_dim * partial)
    problems = [what for what, bad in (
        *_ling_routing_problems(hf),
        ("use_bias true (transformers has no biases on o_proj and the MLPs)", bool(hf.get("use_bias"))),
        (f"rotary_dim {hf.get('rotary_dim')} (transformers rotates {rotary} dimensions of each head)",
         hf.get("rotary_dim") is not None and int(hf["rotary_dim"]) != rotary),
        ("use_rmsnorm false (transformers' q / k norms are RMSNorms)", hf.get("use_rmsnorm") is False and hf["use_qk_norm"]),
    ) if bad]
    if problems:
        raise ValueError(f"config.json {'; '.join(problems)} is not supported for sarvam_moe: vLLM would compute it, "
                         f"transformers and the trainer would not. Sarvam's releases do not set it.")
    return {**hf, "partial_rotary_factor": partial}


# transformers' SarvamMLAConfig (Sarvam-105B's sizes) where they differ from DeepseekV3Config's, for keys config.json
# leaves out (q_lora_rank null: one full-rank query projection)
SARVAM_MLA_DEFAULTS = {"vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
                       "num_attention_heads": 64, "n_routed_experts": 128, "q_lora_rank": None, "n_group": 1,
                       "topk_group": 1, "first_k_dense_replace": 1}
# its releases' (Ling's) spellings -> DeepSeek-V3's
SARVAM_MLA_KEYS = {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
                   "num_mtp_layers": "num_nextn_predict_layers"}


# transformers' Dots1Config defaults where GLM-4.5's reading (hf_config.HF_DEFAULTS glm4_moe) assumes others
DOTS1_DEFAULTS = {"norm_topk_prob": False, "first_k_dense_replace": 0, "routed_scaling_factor": 1.0, "n_group": 1,
                  "topk_group": 1, "max_position_embeddings": 2048, "attention_bias": False, "max_window_layers": 62}


def dots1_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """dots.llm1 (dots1: rednote-hilab/dots.llm1.base / .inst) config.json as the GLM-4.5 one it is: Qwen3's attention
    (per-head q / k norms before RoPE on the whole head, no biases) with DeepSeek-V3's MoE (sigmoid routing with the
    expert bias, groups, shared experts, dense first layers), under DeepSeek-V3's tensor names, which are GLM-4.5's.
    Dots1Config's defaults where config.json leaves a key out. Read, served (vLLM's Glm4MoeForCausalLM: vLLM 0.32 dropped
    its own Dots1 module) and exported as glm4_moe (hf_config.SAME_AS). Sliding-window layers (layer_types, or
    layers from max_window_layers on with a sliding_window) are refused in one sentence: GLM-4.5 has none."""
    hf = {**{k: v for k, v in DOTS1_DEFAULTS.items() if config.get(k) is None}, **{k: v for k, v in config.items()
                                                                                  if v is not None}}
    layers = int(hf["num_hidden_layers"])
    types = hf.get("layer_types") or ["sliding_attention" if hf.get("sliding_window") is not None and
                                      hf.get("use_sliding_window", True) and i >= int(hf["max_window_layers"])
                                      else "full_attention" for i in range(layers)]
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding:
        raise ValueError(f"config.json makes layers {sliding} of this dots1 model sliding-window layers (layer_types, or "
                         f"sliding_window with max_window_layers {hf['max_window_layers']}); only full attention is "
                         f"supported for dots1: set max_window_layers to num_hidden_layers ({layers}).")
    drop = ("layer_types", "sliding_window", "max_window_layers", "use_sliding_window", "auto_map")
    head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // int(hf["num_attention_heads"])  # (Qwen3's; vLLM's GLM
    return {**{k: v for k, v in hf.items() if k not in drop}, "architectures": ["Glm4MoeForCausalLM"],  # needs it)
            "use_qk_norm": True, "partial_rotary_factor": 1.0, "head_dim": head_dim}


# transformers' SolarOpenConfig defaults (Solar-Open-100B's sizes) for the keys config.json may leave out
SOLAR_OPEN_DEFAULTS = {"hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 8,
                       "head_dim": 128, "vocab_size": 196608, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                       "moe_intermediate_size": 1280, "num_experts_per_tok": 8, "n_shared_experts": 1,
                       "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
                       "norm_topk_prob": True, "attention_bias": False, "rope_theta": 1000000.0}


def solar_open_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Solar Open (solar_open: upstage/Solar-Open-100B) config.json as the GLM-4.5 one it is: Llama's attention (no q / k
    norms, RoPE on the whole head unless rope_parameters says a partial_rotary_factor, q / k / v biases where
    attention_bias says) with GLM-4.5's MoE in every layer, under GLM-4.5's tensor names. SolarOpenConfig's defaults where
    config.json leaves a key out. Read, served (vLLM's Glm4MoeForCausalLM) and exported as glm4_moe (hf_config.SAME_AS)."""
    hf = {**{k: v for k, v in SOLAR_OPEN_DEFAULTS.items() if config.get(k) is None},
          **{k: v for k, v in config.items() if v is not None and k != "auto_map"}}
    rope = dict(hf.get("rope_parameters") or {})
    partial = float(rope.get("partial_rotary_factor") or 1.0)
    return {**hf, "architectures": ["Glm4MoeForCausalLM"], "use_qk_norm": False, "first_k_dense_replace": 0,
            "partial_rotary_factor": partial, "intermediate_size": hf.get("intermediate_size") or hf["moe_intermediate_size"]}


def sarvam_mla_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Sarvam MLA (sarvam_mla: Sarvam-105B) config.json as the DeepSeek-V3 one it is (transformers runs it as
    DeepseekV3ForCausalLM, under DeepSeek-V3's tensor names): Ling's key spellings (num_experts, num_shared_experts,
    num_mtp_layers) as DeepSeek-V3's, its rope type deepseek_yarn as yarn (what transformers' SarvamMLAConfig does), its
    legacy head_dim / q_head_dim dropped, SarvamMLAConfig's defaults where config.json leaves a key out. Read, served
    (vLLM's DeepSeek-V3) and exported as deepseek_v3 (hf_config.SAME_AS). The keys of vLLM's own Sarvam module that
    would say another model than transformers computes (score_function, moe_router_enable_expert_bias,
    moe_shared_expert_intermediate_size, moe_layer_freq) are refused in one sentence."""
    hf = {k: v for k, v in config.items() if k not in ("auto_map", "head_dim", "q_head_dim")}
    for theirs, ours in SARVAM_MLA_KEYS.items():
        if theirs in hf:
            value = hf.pop(theirs)
            if hf.get(ours) is not None and value is not None and hf[ours] != value:
                raise ValueError(f"config.json {theirs} {value} disagrees with {ours} {hf[ours]}; make them agree.")
            hf.setdefault(ours, value)
    hf = {**{k: v for k, v in SARVAM_MLA_DEFAULTS.items() if k not in hf}, **hf}
    problems = [what for what, bad in (
        *_ling_routing_problems(hf),
        (f"moe_layer_freq {hf.get('moe_layer_freq')} (transformers makes every layer after first_k_dense_replace MoE)",
         hf.get("moe_layer_freq") not in (None, 1)),
    ) if bad]
    if problems:
        raise ValueError(f"config.json {'; '.join(problems)} is not supported for sarvam_mla: vLLM's Sarvam module "
                         f"would compute it, transformers and the trainer would not. Sarvam's releases do not set it.")
    for key in ("rope_parameters", "rope_scaling"):
        rope = dict(hf.get(key) or {})
        if "deepseek_yarn" in (rope.get("type"), rope.get("rope_type")):
            hf[key] = {**{k: v for k, v in rope.items() if k != "type"}, "rope_type": "yarn"}
    hf.update(architectures=["DeepseekV3ForCausalLM"], scoring_func="sigmoid", topk_method="noaux_tc")
    return hf


def hunyuan_moe_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron MoE args of a HunYuan-MoE config.json (hunyuan_v1_moe: Hunyuan-A13B), as transformers computes it:
    every layer MoE, softmax over num_experts routed experts, the top moe_topk renormalised, experts and one shared
    MLP without a gate all intermediate_size wide, added. The releases list moe_topk, moe_intermediate_size and
    num_shared_expert per layer; transformers reads one value for all, so lists must be uniform, and what it
    does not build (another expert width, several shared MLPs or none, dense layers, cross-layer attention) is
    refused in one sentence."""
    def one(key: str, default: Any) -> Any:
        value = hf.get(key, default)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if not values or len(set(values)) > 1:
            raise ValueError(f"config.json {key} {value} differs between layers; HunYuan-MoE as transformers builds it "
                             f"takes one value for every layer.")
        return values[0]

    width = int(hf["intermediate_size"])
    problems = [f"{what} (transformers builds {wanted})" for what, bad, wanted in (
        (f"moe_intermediate_size {hf.get('moe_intermediate_size')}",
         hf.get("moe_intermediate_size") is not None and int(one("moe_intermediate_size", width)) != width,
         f"experts intermediate_size {width} wide"),
        (f"num_shared_expert {hf.get('num_shared_expert')}", int(one("num_shared_expert", 1)) != 1,
         "one shared MLP"),
        ("use_mixed_mlp_moe false", hf.get("use_mixed_mlp_moe") is False, "the shared MLP in every layer"),
        (f"moe_layer_num_skipped {hf.get('moe_layer_num_skipped')}", int(hf.get("moe_layer_num_skipped") or 0),
         "every layer MoE"),
        ("use_cla true", bool(hf.get("use_cla")), "no cross-layer attention"),
    ) if bad]
    if problems:
        raise ValueError(f"config.json of a hunyuan_v1_moe model: {'; '.join(problems)} is not supported.")
    experts, topk = int(one("num_experts", 1)), int(one("moe_topk", 1))
    if experts < 2 or not 1 <= topk <= experts:
        raise ValueError(f"config.json num_experts {experts} / moe_topk {topk}: a HunYuan-MoE model needs at least 2 "
                         f"experts and 1 <= moe_topk <= num_experts.")
    return {"num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": width, "norm_topk_prob": True,
            "moe_shared_expert_intermediate_size": width}


def granite_moe_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron MoE args of a Granite MoE config.json (granitemoe: granite-3.x-1b-a400m / 3b-a800m; granitemoeshared;
    granitemoehybrid with experts), as transformers computes it: every layer MoE, Mixtral's routing (softmax over
    the top num_experts_per_tok router logits), experts intermediate_size wide, and with shared_intermediate_size >
    0 a shared MLP of that width without a gate added to them (granitemoehybrid always has one)."""
    experts, topk = expert_count(hf), int(hf["num_experts_per_tok"])
    if experts < 2 or not 1 <= topk <= experts:
        raise ValueError(f"config.json num_local_experts {experts} / num_experts_per_tok {topk}: a {hf.get('model_type')} "
                         f"model needs at least 2 experts and 1 <= num_experts_per_tok <= num_local_experts.")
    shared = int(hf.get("shared_intermediate_size") or 0) if hf.get("model_type") != "granitemoe" else 0
    return {"num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": int(hf["intermediate_size"]),
            "norm_topk_prob": True, **({"moe_shared_expert_intermediate_size": shared} if shared else {})}


def expert_count(hf: Mapping[str, Any]) -> int:
    """Routed experts per MoE layer as config.json names them: num_experts (Qwen-MoE),
    num_local_experts (Mixtral), n_routed_experts (GLM-4.5, DeepSeek), moe_num_experts (ERNIE 4.5); 0 for a
    dense model."""
    return int(hf.get("num_experts") or hf.get("num_local_experts") or hf.get("n_routed_experts")
               or hf.get("moe_num_experts") or 0)


def moe_args_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron MoE args of a Qwen3-MoE / Qwen2-MoE / Mixtral / GLM-4.5 config.json. HF's norm_topk_prob
    (renormalise the top-k softmax probabilities) is megatron's softmax over the top-k logits, i.e.
    moe_router_pre_softmax = not norm_topk_prob. Qwen2-MoE adds a shared expert with a sigmoid gate
    (megatron's SharedExpertMLP with gate). Mixtral always renormalises, and its experts are
    `intermediate_size` wide, as OLMoE's and FlexOlmo's (which route as Qwen2-MoE). GLM-4.5: glm4_moe_args."""
    if hf.get("model_type") in V3_ROUTING:
        return glm4_moe_args(hf)
    if hf.get("model_type") == "deepseek_v2":
        return deepseek_v2_moe_args(hf)
    if hf.get("model_type") == "minimax_m2":
        return minimax_m2_moe_args(hf)
    if hf.get("model_type") == "ernie4_5_moe":
        return ernie4_5_moe_args(hf)
    if hf.get("model_type") == "hunyuan_v1_moe":
        return hunyuan_moe_args(hf)
    if hf.get("model_type") in ("granitemoe", "granitemoeshared", "granitemoehybrid"):
        return granite_moe_args(hf)
    dense_between = bool(hf.get("mlp_only_layers")) or int(hf.get("decoder_sparse_step") or 1) != 1
    if dense_between and hf.get("model_type") not in QWEN_DENSE_LAYERS:
        raise ValueError("config.json mlp_only_layers / decoder_sparse_step != 1 (dense layers between MoE "
                         "layers) is not supported for this model type; every layer must be an MoE layer.")
    experts = expert_count(hf)
    if not experts:
        raise ValueError(f"config.json of a {hf.get('model_type')} model has no num_experts (or num_local_experts).")
    mixtral = hf.get("model_type") in ("mixtral", "gpt_oss")  # gpt-oss routes as Mixtral: softmax over the top-k
    wide = mixtral or hf.get("model_type") in ("olmoe", "flex_olmo")  # experts intermediate_size wide
    if mixtral and float(hf.get("router_jitter_noise") or 0.0) > 0:
        raise ValueError(f"config.json router_jitter_noise {hf['router_jitter_noise']} (noise on the router logits "
                         "in training) is not supported; set it to 0.")
    shared = {}
    qwen3_5 = hf.get("model_type") == "qwen3_5_moe_text"  # Qwen3.5-MoE: Qwen2-MoE's experts, always renormalised
    if hf.get("model_type") in ("qwen2_moe", "qwen3_5_moe_text", "qwen3_next") and \
            int(hf.get("shared_expert_intermediate_size") or 0) > 0:
        shared = {"moe_shared_expert_intermediate_size": int(hf["shared_expert_intermediate_size"]),
                  "shared_expert_gate": True}
    if dense_between:
        shared["moe_layer_freq"] = qwen_moe_layers(hf)
    if hf.get("model_type") == "mellum" and "dense" in (hf.get("mlp_layer_types") or ()):  # Mellum: its dense layers
        types = list(hf["mlp_layer_types"])
        if len(types) != int(hf["num_hidden_layers"]) or set(types) - {"dense", "sparse"}:
            raise ValueError(f"config.json mlp_layer_types must name dense or sparse for each of "
                             f"{hf['num_hidden_layers']} layers; it has {types}.")
        shared["moe_layer_freq"] = [int(t == "sparse") for t in types]
    return {**shared,
        "num_experts": int(experts),
        "moe_router_topk": int(hf["num_experts_per_tok"]),
        "moe_ffn_hidden_size": int(hf["intermediate_size"] if wide else hf["moe_intermediate_size"]),
        "norm_topk_prob": True if mixtral or qwen3_5 else bool(hf.get("norm_topk_prob", False)),
    }


# model types whose dense layers among the MoE ones config.json places with mlp_only_layers / decoder_sparse_step
QWEN_DENSE_LAYERS = ("qwen2_moe", "qwen3_moe", "qwen3_next")


def qwen_moe_layers(hf: Mapping[str, Any]) -> list[int]:
    """Qwen2-MoE's / Qwen3-MoE's / Qwen3-Next's MoE layers as one 0 / 1 per layer (1 = MoE), as transformers
    places them: layer i (from 0) is an MoE layer when it is not in mlp_only_layers and (i + 1) %
    decoder_sparse_step == 0; the others are dense MLPs intermediate_size wide."""
    layers, step = int(hf["num_hidden_layers"]), int(hf.get("decoder_sparse_step") or 1)
    dense = {int(i) for i in hf.get("mlp_only_layers") or ()}
    if step < 1 or not all(0 <= i < layers for i in dense):
        raise ValueError(f"config.json decoder_sparse_step {step} must be at least 1 and mlp_only_layers "
                         f"{sorted(dense)} must name layers 0 ... {layers - 1}.")
    pattern = [0 if i in dense or (i + 1) % step else 1 for i in range(layers)]
    if not any(pattern):
        raise ValueError(f"config.json mlp_only_layers / decoder_sparse_step {step} leave no MoE layer of {layers}; "
                         f"a dense model is not a {hf.get('model_type')} config.json.")
    return pattern


def glm4_moe_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron MoE args of a GLM-4.5 / 4.6 (glm4_moe) or DeepSeek-V3 (deepseek_v3) config.json, DeepSeek-V3's routing:
    - the first first_k_dense_replace layers dense (intermediate_size wide), the rest MoE
      (moe_layer_freq, one 0 / 1 per layer);
    - sigmoid scores; the top-k chosen by score + a per-expert bias (e_score_correction_bias:
      megatron's expert_bias, loaded and kept fixed, moe_router_bias_update_rate 0), weighted by
      their scores renormalised (norm_topk_prob, megatron always renormalises sigmoid top-k > 1)
      times routed_scaling_factor (moe_router_topk_scaling_factor);
    - with n_group > 1, only the topk_group groups whose two best scores sum highest are eligible:
      megatron sums the best topk / topk_group of a group, so that must be 2 (refused otherwise);
    - n_shared_experts x moe_intermediate_size wide shared experts without a gate."""
    experts, topk = expert_count(hf), int(hf["num_experts_per_tok"])
    layers, dense = int(hf["num_hidden_layers"]), first_dense_layers(hf)
    if not hf.get("norm_topk_prob"):
        raise ValueError(f"config.json norm_topk_prob false with sigmoid routing ({hf.get('model_type')}) is not "
                         "supported: megatron renormalises the top-k sigmoid scores; GLM-4.5's and DeepSeek-V3's "
                         "releases set it true.")
    if dense >= layers:
        raise ValueError(f"config.json first_k_dense_replace {dense} leaves no MoE layer of {layers}; a dense "
                         f"model is not a {hf.get('model_type')} config.json.")
    groups, group_topk = int(hf.get("n_group") or 1), int(hf.get("topk_group") or 1)
    args: dict[str, Any] = {
        "num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": int(hf["moe_intermediate_size"]),
        "norm_topk_prob": True, "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
        "moe_router_bias_update_rate": 0.0,
        "moe_layer_freq": [0] * dense + [1] * (layers - dense),
    }
    if groups > 1:
        if experts % groups or topk % group_topk or topk // group_topk != 2:
            raise ValueError(f"config.json n_group {groups} / topk_group {group_topk} with num_experts_per_tok {topk} "
                             f"is not supported: groups are ranked by the sum of their two best scores, which megatron "
                             f"computes only when num_experts_per_tok / topk_group is 2 (and n_group divides the "
                             f"{experts} experts).")
        args.update(moe_router_num_groups=groups, moe_router_group_topk=group_topk)
    return _scale_and_shared_experts(hf, args)


def minimax_m2_moe_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron MoE args of a MiniMax-M2 config.json (minimax_m2), as transformers routes it: every layer
    MoE with num_local_experts experts intermediate_size wide (Mixtral's), sigmoid scores, the top-k chosen
    by score + the checkpoint's e_score_correction_bias (megatron's expert_bias, kept fixed) and weighted
    by their scores renormalised; no groups, no routed scale, no shared expert. What transformers does
    not compute is refused: MiniMax-Text-01's linear-attention layers (attn_type_list 0), a shared
    expert (shared_intermediate_size), other scoring functions, no routing bias (vLLM would then route
    without the bias transformers always adds), no q / k norms (transformers always has them)."""
    attention = [int(x) for x in hf.get("attn_type_list") or []]
    if 0 in attention:
        raise ValueError(f"config.json attn_type_list has linear-attention layers (0 at layers "
                         f"{[i for i, x in enumerate(attention) if x == 0]}): MiniMax-Text-01's lightning attention is "
                         f"not supported; MiniMax-M2's releases have full attention (1) in every layer.")
    problems = [f"{key} {hf[key]!r} ({why})" for key, bad, why in (
        ("scoring_func", hf.get("scoring_func", "sigmoid") != "sigmoid", "transformers routes by sigmoid"),
        ("use_routing_bias", hf.get("use_routing_bias", True) is not True,
         "transformers always adds e_score_correction_bias, vLLM only with true"),
        ("shared_intermediate_size", int(hf.get("shared_intermediate_size") or 0) > 0, "a shared expert"),
        ("qk_norm_type", hf.get("qk_norm_type", "per_layer") != "per_layer",
         "transformers normalises each token's whole query and key"),
        ("use_qk_norm", hf.get("use_qk_norm", True) is not True, "transformers always has q / k norms"),
        ("router_jitter_noise", float(hf.get("router_jitter_noise") or 0.0) > 0, "noise on the router logits"),
    ) if bad]
    if problems:
        raise ValueError(f"config.json of a minimax_m2 model: {'; '.join(problems)} is not supported; MiniMax-M2's "
                         f"releases have sigmoid routing with the bias, no shared expert and per_layer q / k norms.")
    return {"num_experts": expert_count(hf), "moe_router_topk": int(hf["num_experts_per_tok"]),
            "moe_ffn_hidden_size": int(hf["intermediate_size"]), "norm_topk_prob": True,
            "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
            "moe_router_bias_update_rate": 0.0}


def ernie_moe_layers(hf: Mapping[str, Any]) -> list[int]:
    """ERNIE 4.5's MoE layers as one 0 / 1 per layer (1 = MoE), as transformers places them: layer i (from
    0) is an MoE layer when (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
    moe_layer_end_index (-1: the last layer)."""
    layers = int(hf["num_hidden_layers"])
    start, interval = int(hf.get("moe_layer_start_index", 1)), int(hf.get("moe_layer_interval", 1))
    end = int(hf.get("moe_layer_end_index", -1))
    end = layers - 1 if end < 0 else end
    if interval < 1:
        raise ValueError(f"config.json moe_layer_interval {interval} must be at least 1.")
    return [1 if (i + 1) % interval == 0 and start <= i <= end else 0 for i in range(layers)]


def ernie4_5_moe_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron MoE args of an ERNIE 4.5 MoE config.json (ernie4_5_moe: ERNIE-4.5-21B-A3B, -300B-A47B and
    their -Base / -Thinking models), as transformers routes it: softmax over all moe_num_experts experts,
    the moe_k best of softmax + e_score_correction_bias chosen (the bias for the choice only: megatron's
    expert_bias, loaded and kept fixed), weighted by their softmax probabilities renormalised (which
    is megatron's softmax over the chosen logits: norm_topk_prob); moe_num_shared_experts x
    moe_intermediate_size wide shared experts without a gate; the MoE layers placed by
    moe_layer_start_index / interval / end_index (ernie_moe_layers), the others dense (intermediate_size).
    Megatron-core routes softmax without an expert bias, so models/moe_replay.py adds it (install_softmax_bias).
    The experts' statistics the releases keep beside the router (moe_statics) hold the bias alone."""
    experts, topk = expert_count(hf), int(hf["moe_k"] if hf.get("moe_k") is not None else hf["num_experts_per_tok"])
    pattern = ernie_moe_layers(hf)
    if not any(pattern):
        raise ValueError(f"config.json moe_layer_start_index {hf.get('moe_layer_start_index')} / moe_layer_interval "
                         f"{hf.get('moe_layer_interval')} / moe_layer_end_index {hf.get('moe_layer_end_index')} leave no "
                         f"MoE layer of {hf['num_hidden_layers']}; a dense ERNIE 4.5 is model_type ernie4_5.")
    if not experts or topk > experts:
        raise ValueError(f"config.json moe_num_experts {experts} / moe_k {topk}: an ERNIE 4.5 MoE model needs "
                         f"moe_k <= moe_num_experts, both at least 1.")
    f = int(hf["moe_intermediate_size"])
    args: dict[str, Any] = {
        "num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": f, "norm_topk_prob": True,
        "moe_router_score_function": "softmax", "moe_router_enable_expert_bias": True,
        "moe_router_bias_update_rate": 0.0, "moe_layer_freq": pattern}
    shared = int(hf.get("moe_num_shared_experts") or 0)
    if shared:
        args["moe_shared_expert_intermediate_size"] = shared * f
    return args


def mtp_layer_count(hf: Mapping[str, Any]) -> tuple[str, int]:
    """(config.json key, count) of the multi-token-prediction layers a checkpoint stores after its last
    layer: num_nextn_predict_layers (DeepSeek-V3, GLM-4.5), num_mtp_modules (MiniMax-M2); not trained here."""
    if hf.get("model_type") == "minimax_m2":
        return "num_mtp_modules", int(hf.get("num_mtp_modules") or 0) if hf.get("use_mtp", True) else 0
    return "num_nextn_predict_layers", int(hf.get("num_nextn_predict_layers") or 0)


def first_dense_layers(hf: Mapping[str, Any]) -> int:
    """How many dense layers come before the MoE ones: config.json's first_k_dense_replace, or for
    GLM-4.7-Flash (glm4_moe_lite) its mlp_layer_types, which transformers reads (default: the first layer
    dense) while vLLM reads first_k_dense_replace; a pattern other than dense layers first, or the two
    keys disagreeing, is refused."""
    if hf.get("model_type") not in ("glm4_moe_lite", "exaone_moe", "hy_v3"):  # (EXAONE MoE: vLLM reads mlp_layer_types too)
        return int(hf.get("first_k_dense_replace") or 0)
    layers = int(hf["num_hidden_layers"])
    types = list(hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1))
    dense = next((i for i, t in enumerate(types) if t != "dense"), len(types))
    if len(types) != layers or types != ["dense"] * dense + ["sparse"] * (layers - dense):
        raise ValueError(f"config.json mlp_layer_types {types} must name one layer type per layer ({layers}), "
                         f"'dense' ones first and 'sparse' (MoE) after them, as the releases do.")
    if hf.get("first_k_dense_replace") is not None and int(hf["first_k_dense_replace"]) != dense:
        raise ValueError(f"config.json first_k_dense_replace {hf['first_k_dense_replace']} disagrees with "
                         f"mlp_layer_types ({dense} dense layers first): transformers reads the one and vLLM the "
                         f"other; make them agree.")
    return dense


def _scale_and_shared_experts(hf: Mapping[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """`args` with GLM-4.5's / DeepSeek's routed_scaling_factor (when not 1) and its n_shared_experts (EXAONE MoE's
    num_shared_experts) x moe_intermediate_size wide shared experts (when any)."""
    scale = float(hf.get("routed_scaling_factor") or 1.0)
    if scale != 1.0:
        args["moe_router_topk_scaling_factor"] = scale
    shared = int(hf.get("n_shared_experts") or hf.get("num_shared_experts") or 0) * int(hf["moe_intermediate_size"])
    if shared:
        args["moe_shared_expert_intermediate_size"] = shared
    return args


def deepseek_v2_moe_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron MoE args of a DeepSeek-V2 / V2-Lite config.json (deepseek_v2), as transformers routes:
    softmax over all experts, the top-k taken without renormalising (megatron's pre-softmax routing)
    and times routed_scaling_factor; with topk_method group_limited_greedy only the topk_group groups
    with the highest single score are eligible, which megatron computes when num_experts_per_tok equals
    topk_group (it ranks a group by its best topk / topk_group scores); the first first_k_dense_replace
    layers dense; n_shared_experts x moe_intermediate_size wide shared experts without a gate."""
    experts, topk = expert_count(hf), int(hf["num_experts_per_tok"])
    layers, dense = int(hf["num_hidden_layers"]), int(hf.get("first_k_dense_replace") or 0)
    method, scoring = hf.get("topk_method") or "greedy", hf.get("scoring_func") or "softmax"
    if scoring != "softmax" or method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"config.json scoring_func {scoring!r} / topk_method {method!r} is not DeepSeek-V2's routing "
                         f"(softmax, greedy or group_limited_greedy), which transformers computes for deepseek_v2.")
    if hf.get("norm_topk_prob"):
        raise ValueError("config.json norm_topk_prob true for deepseek_v2: transformers never renormalises its top-k "
                         "weights and vLLM would, so the engines would disagree; DeepSeek-V2's releases set it false.")
    if dense >= layers:
        raise ValueError(f"config.json first_k_dense_replace {dense} leaves no MoE layer of {layers}; a dense model "
                         f"is not a deepseek_v2 config.json.")
    args: dict[str, Any] = {
        "num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": int(hf["moe_intermediate_size"]),
        "norm_topk_prob": False, "moe_layer_freq": [0] * dense + [1] * (layers - dense)}
    groups, group_topk = int(hf.get("n_group") or 1), int(hf.get("topk_group") or 1)
    if method == "group_limited_greedy" and groups > 1:
        if experts % groups or topk != group_topk:
            raise ValueError(f"config.json topk_method group_limited_greedy with n_group {groups} / topk_group "
                             f"{group_topk} and num_experts_per_tok {topk} is not supported: groups are ranked by "
                             f"their best score, which megatron computes only when num_experts_per_tok equals "
                             f"topk_group (and n_group divides the {experts} experts).")
        args.update(moe_router_num_groups=groups, moe_router_group_topk=group_topk)
    return _scale_and_shared_experts(hf, args)


def moe_layer_pattern(moe_layer_freq: Any, num_layers: int) -> list[int]:
    """megatron-core's moe_layer_freq as one 0 / 1 per layer (1 = MoE): an integer N makes every N-th
    layer from the first an MoE layer, a list is taken as it is (its length must be num_layers)."""
    if isinstance(moe_layer_freq, bool) or not isinstance(moe_layer_freq, (int, list, tuple)):
        raise ValueError(f"moe_layer_freq {moe_layer_freq!r} must be an integer N or a list of 0 / 1 per layer.")
    if isinstance(moe_layer_freq, int):
        if moe_layer_freq < 1:
            raise ValueError(f"moe_layer_freq {moe_layer_freq} must be at least 1 (1 = every layer is an MoE layer).")
        return [1 if i % moe_layer_freq == 0 else 0 for i in range(num_layers)]
    pattern = [int(x) for x in moe_layer_freq]
    if len(pattern) != num_layers or set(pattern) - {0, 1} or not any(pattern):
        raise ValueError(f"moe_layer_freq {list(moe_layer_freq)} must hold one 0 or 1 per layer ({num_layers}), at "
                         "least one 1 (1 = MoE layer).")
    return pattern


def mla_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron args of DeepSeek-V3's multi-latent attention (deepseek_v3: DeepSeek-V3 / R1, Kimi K2's
    layout, Moonlight; deepseek_v2: DeepSeek-V2 / V2-Lite, the same attention): q = q_b(norm(q_a(x))) (or one q_proj when q_lora_rank is null), k / v from
    kv_b(norm(c)) of the compressed c = kv_a(x)[:kv_lora_rank], plus RoPE on qk_rope_head_dim dimensions
    of each head, the key's part kv_a(x)[kv_lora_rank:] shared by all heads (the norms: megatron's
    qk_layernorm with MLA); RoPE over interleaved pairs
    (rope_interleave, megatron's MLA rotation). The value head dimension is kv_channels. YaRN (DeepSeek-V3's
    factor 40) as megatron's MLA computes it, with the scores scaled by the square of its mscale_all_dim
    term (builder.mla_config_fields)."""
    if hf.get("rope_interleave") is False:
        raise ValueError("config.json rope_interleave false (RoPE on the two halves of the rotary dimensions) is not "
                         "supported for deepseek_v3: megatron's multi-latent attention rotates interleaved pairs, as "
                         "DeepSeek's releases do; remove the key.")
    if hf.get("attention_bias"):
        raise ValueError("config.json attention_bias=true (biases on the MLA projections) is not supported; "
                         "DeepSeek's releases have none.")
    routing = (hf.get("scoring_func", "sigmoid"), hf.get("topk_method", "noaux_tc"))
    kind = hf.get("model_type")
    if kind in ("deepseek_v3", "glm4_moe_lite") and routing != ("sigmoid", "noaux_tc"):
        # transformers always routes so; vLLM follows these keys
        raise ValueError(f"config.json scoring_func {routing[0]!r} / topk_method {routing[1]!r} is not DeepSeek-V3's "
                         f"routing (sigmoid / noaux_tc, which transformers always uses for {kind}): fix "
                         f"config.json or remove the keys.")
    # transformers' default when the key is absent (null: one full-rank query projection)
    q_lora = hf["q_lora_rank"] if "q_lora_rank" in hf else 768 if kind == "glm4_moe_lite" else 1536
    v_dim = int(hf["v_head_dim"])
    return {"multi_latent_attention": True, "q_lora_rank": int(q_lora) if q_lora else None,
            "kv_lora_rank": int(hf["kv_lora_rank"]), "qk_head_dim": int(hf["qk_nope_head_dim"]),
            "qk_pos_emb_head_dim": int(hf["qk_rope_head_dim"]), "v_head_dim": v_dim, "kv_channels": v_dim,
            "group_query_attention": False, "num_query_groups": int(hf["num_attention_heads"]),
            "qk_layernorm": True}  # megatron's MLA norms (q_a_layernorm, kv_a_layernorm), as MindSpeed-LLM spells them


def gpt_oss_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """gpt-oss (gpt_oss: gpt-oss-20b, gpt-oss-120b) in megatron-core 0.16's names (models/gpt_oss.py):
    Mixtral's routing (softmax over the top-k logits) with a biased router; biases on q / k / v,
    o_proj and the experts (add_bias_linear); attention sinks (softmax_type learnable); the experts'
    clamped SwiGLU (quick_geglu: gate x sigmoid(1.702 gate) x (up + 1), gate <= swiglu_limit, up
    within +-swiglu_limit); every sliding_attention layer of layer_types (the even ones) within
    sliding_window positions; YaRN without rounding the ramp's ends (truncate: false, yarn_args)."""
    from mindspeed_rl.models.hf_config import layer_types

    alpha = float(hf.get("swiglu_alpha") or 1.702)
    if alpha != 1.702:
        raise ValueError(f"config.json swiglu_alpha {alpha} is not supported; gpt-oss's experts use 1.702 "
                         f"(megatron's quick_gelu).")
    if not hf.get("attention_bias", True):
        raise ValueError("config.json attention_bias false for gpt_oss is not supported: its biases on the "
                         "attention, router and experts come as one (add_bias_linear); gpt-oss's releases have them.")
    args: dict[str, Any] = {"disable_bias_linear": False, "add_qkv_bias": True, "softmax_type": "learnable",
                            "quick_geglu": True, "glu_linear_offset": 1.0, "swiglu": True,
                            "window_attn_skip_freq": layer_types(hf, num_layers, 2)}
    if hf.get("swiglu_limit") is not None:
        args["activation_func_clamp_value"] = float(hf["swiglu_limit"])
    window = hf.get("sliding_window")
    if window and int(window) < int(hf.get("max_position_embeddings", 4096)):
        args["sliding_window"] = int(window)
    return args
