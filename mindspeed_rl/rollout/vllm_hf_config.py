"""config.json as the vLLM engine hands it to vLLM (vllm_config): the model types vLLM serves under another model's
class or keys, and the RoPE it would compute otherwise. Pure dict work, no vLLM import (rollout/vllm_engine.py
writes the result into the engine's model directory).
"""

from __future__ import annotations

from typing import Any, Mapping

from mindspeed_rl.models.hf_bridge.names import names_type
from mindspeed_rl.models.hf_config import HF_DEFAULTS


def vllm_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """config.json as the engine gives it to vLLM: Granite 4.0 whose every layer attends with RoPE (granitemoehybrid
    without Mamba-2 layers) as the model of the same math and names vLLM serves without its Mamba-2 machinery:
    Granite (granite, the shared_mlp as the MLP: names.names_type) or, with experts, Granite MoE with a shared MLP
    (granitemoeshared); Granite 4.0-H (Mamba-2 layers, attention without RoPE) as it is, to vLLM's
    GraniteMoeHybridForCausalLM. Cohere 2 (cohere2) with its sliding_window one smaller: vLLM 0.32 lets its sliding
    layers see sliding_window + 1 positions (its comment: Cohere's training convention), transformers and the trainer
    sliding_window (models/sliding_window.py), so the rollout sees what the trainer does. LFM2 (lfm2) with its
    releases' block_dim and conv_dim (hidden_size), which vLLM 0.32's Lfm2ForCausalLM reads and transformers 5 no
    longer writes, and its MLP width as transformers computes it (block_auto_adjust_ff_dim false). EXAONE 3.0 / 3.5 (exaone) as vLLM's ExaoneForCausalLM, which reads its releases' tensor names
    (transformers 5 writes LlamaForCausalLM into the config.json it saves), under Llama's config class (the
    transformers vLLM pairs with, < 5.20, has no ExaoneConfig; the releases bring theirs as remote code) with the
    releases' activation_function / layer_norm_epsilon, which vLLM's module reads. IQuest-Coder (iquestcoder) as the
    Llama it is. Hy3 (hy_v3) with the keys its releases carry for vLLM, whose defaults differ from transformers'
    (first_k_dense_replace: none, qk_norm / route_norm: false, router_scaling_factor: 1; the expert width as
    expert_hidden_dim), written as transformers reads the model; AFMoE (afmoe) with the routing keys vLLM reads
    (score_func, route_norm, n_group, topk_group) where its config.json leaves them out. Sarvam MoE (sarvam_moe)
    under GLM-4.5's config class (vLLM's transformers has none of its own) with the keys of Ling's module, which vLLM
    runs it with, saying transformers' model (sigmoid routing with the expert bias in fp32, RMSNorm q / k norms, no
    other biases). InternLM3 (internlm3) as the Llama it is (vLLM's registry serves it so) with its head_dim and its
    biases under Llama's key. Youtu-LLM (youtu) as the DeepSeek-V3 whose every layer is dense (first_k_dense_replace: all),
    the module vLLM has for its attention, names and dense MLP (vLLM has no Youtu module; its tied lm_head is put back on
    the embedding after every sync: vllm_engine._retie_embeddings). Dynamic NTK RoPE without an alpha (InternLM3) as the default RoPE it is up to
    max_position_embeddings, the run's limit (hf_rope_config.dynamic_ntk_as_default), so that vLLM never rescales it.
    Other config.json pass unchanged."""
    config = without_dynamic_ntk(dict(config))
    if config.get("model_type") == "internlm3":  # InternLM3: Llama (InternLM3Config's qkv_bias: attention_bias)
        return {**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "head_dim": config.get("head_dim") or HF_DEFAULTS["internlm3"]["head_dim"],
                "attention_bias": bool(config.get("qkv_bias", config.get("attention_bias", False)))}
    if config.get("model_type") == "youtu":  # Youtu-LLM: DeepSeek-V3's module with every layer dense (no experts)
        return {**config, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
                "first_k_dense_replace": int(config["num_hidden_layers"]), "num_nextn_predict_layers": 0,
                **{k: config.get(k, v) for k, v in HF_DEFAULTS["youtu"].items()}}
    if config.get("model_type") == "iquestcoder":  # IQuest-Coder: Llama under its own model_type (vLLM: Llama's), its
        # head_dim 128 unless config.json says (Llama's default would be hidden_size / heads)
        return {**config, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "head_dim": config.get("head_dim") or HF_DEFAULTS["iquestcoder"]["head_dim"]}
    if config.get("model_type") == "exaone":  # both spellings: Llama's config class reads the one, vLLM's module the other
        from mindspeed_rl.models.hf_config import EXAONE_ALIASES

        llama = {EXAONE_ALIASES.get(k, k): v for k, v in config.items()}
        if llama.get("rope_theta") is None and not llama.get("rope_parameters"):  # ExaoneConfig's theta, not Llama's
            llama["rope_theta"] = HF_DEFAULTS["exaone"]["rope_theta"]
        return {**llama, "model_type": "llama", "architectures": ["ExaoneForCausalLM"],
                **{release: llama[name] for release, name in EXAONE_ALIASES.items() if name in llama}}
    if config.get("model_type") == "lfm2":  # the MLP width as transformers computes it, given as it is: vLLM rounds it
        # to block_multiple_of even without block_ffn_dim_multiplier, where transformers does not
        from mindspeed_rl.models.hf_lfm2_config import lfm2_config

        width = lfm2_config(config)["intermediate_size"]
        config.pop("block_ff_dim", None)  # (transformers' Lfm2Config reads it over intermediate_size)
        return {"block_dim": config["hidden_size"], "conv_dim": config["hidden_size"], **config,
                "intermediate_size": width, "block_auto_adjust_ff_dim": False}
    if config.get("model_type") == "hy_v3":  # Hy3: the keys vLLM's HYV3ForCausalLM reads and transformers' config lacks
        from mindspeed_rl.models.hf_moe_config import first_dense_layers, hy_v3_config

        hy = hy_v3_config(config)
        return {**config, "first_k_dense_replace": first_dense_layers(hy), "expert_hidden_dim": hy["moe_intermediate_size"],
                "router_scaling_factor": hy["router_scaling_factor"], "qk_norm": True, "route_norm": True}
    if config.get("model_type") == "sarvam_moe":  # Sarvam MoE: under GLM-4.5's config class (vLLM's transformers has
        # no SarvamMoEConfig; the releases bring theirs as remote code), with the keys of Ling's module vLLM runs it with
        from mindspeed_rl.models.hf_moe_config import expert_count, sarvam_moe_config

        hf = sarvam_moe_config(config)
        experts, shared = expert_count(hf), int(hf.get("num_shared_experts") or hf.get("n_shared_experts") or 0)
        bias = bool(hf.get("use_qkv_bias") or hf.get("attention_bias"))
        return {**hf, "model_type": "glm4_moe", "architectures": ["SarvamMoEForCausalLM"], "num_experts": experts,
                "n_routed_experts": experts, "num_shared_experts": shared, "n_shared_experts": shared,
                "moe_shared_expert_intermediate_size": hf["moe_intermediate_size"], "score_function": "sigmoid",
                "moe_router_enable_expert_bias": True, "router_dtype": "fp32", "use_rmsnorm": True, "use_bias": False,
                "use_qkv_bias": bias, "attention_bias": bias, "embedding_dropout": 0.0}
    if config.get("model_type") == "afmoe":  # AFMoE: the routing keys vLLM's AfmoeForCausalLM reads and transformers'
        # config lacks, as transformers routes (hf_moe_config.afmoe_config refuses any other)
        return {"score_func": "sigmoid", "route_norm": True, "n_group": 1, "topk_group": 1, **config}
    if config.get("model_type") == "cohere2" and config.get("sliding_window"):
        return {**config, "sliding_window": int(config["sliding_window"]) - 1}
    if (config.get("model_type") != "granitemoehybrid" or mamba_kinds(config)
            or config.get("position_embedding_type") != "rope"):
        return config
    dense = names_type(config) == "granitemoehybrid_dense"
    config = {k: v for k, v in config.items() if not k.startswith("mamba_") and k not in (
        "layer_types", "layers_block_type", "position_embedding_type", "time_step_limit")}
    # GraniteMoeHybridConfig's default where config.json leaves it out (GraniteMoeSharedConfig's is 0: no shared MLP)
    config.setdefault("shared_intermediate_size", HF_DEFAULTS["granitemoehybrid"]["shared_intermediate_size"])
    if dense:
        config.update(model_type="granite", architectures=["GraniteForCausalLM"],
                      intermediate_size=int(config["shared_intermediate_size"]))
    else:
        config.update(model_type="granitemoeshared", architectures=["GraniteMoeSharedForCausalLM"])
    return config


def without_dynamic_ntk(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with a dynamic NTK RoPE (rope type dynamic with a factor, no alpha) written as the default RoPE at
    its theta, in either spelling (transformers 5's rope_parameters, 4.x's rope_scaling + rope_theta)."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key)
        if isinstance(rope, Mapping) and rope.get("rope_type", rope.get("type")) == "dynamic" and not rope.get("alpha"):
            if key == "rope_scaling":
                config[key] = None
            else:
                kept = {k: v for k, v in rope.items() if k not in ("type", "factor", "original_max_position_embeddings")}
                config[key] = {**kept, "rope_type": "default"}
    return config


def mamba_kinds(config: Mapping[str, Any]) -> bool:
    """Whether a granitemoehybrid config.json has Mamba-2 layers (layer_types mamba; transformers 5: linear_attention;
    none given: transformers' default, all Mamba-2)."""
    kinds = config.get("layer_types") or config.get("layers_block_type")
    return kinds is None or any(k in ("mamba", "linear_attention") for k in kinds)
