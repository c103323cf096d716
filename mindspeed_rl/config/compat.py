"""Where each key of a MindSpeed-LLM / Megatron-LM style config goes: compatibility by construction.

The vocabulary is data: megatron_vocab.json holds every argument name of Megatron-LM's
megatron/training/arguments.py (core_v0.12.1), of MindSpeed-LLM's training arguments (2.3.0,
which pairs with Megatron core_r0.12.1) and of MindSpeed's (v2.3.0_core_r0.12.1, whose switches
MindSpeed-LLM's scripts pass too), with repository, tag, commit and files; regenerate it with
scripts/extract_arg_vocab.py. Each name a yaml uses is routed (route()) to one of:

- "schema":      a key of our typed schema (schema.py); it does what its docs say;
- "alias":       MindSpeed-LLM's or Megatron-LM's other spelling of a schema key (ALIASES), or a
                 key that sets one from others (DERIVED: first_k_dense_replace, n_shared_experts,
                 seq_aux); config/loader.py renames them;
- "mindspeed":   a MindSpeed feature switch (MINDSPEED_SWITCHES): forwarded to MindSpeed on NPU
                 (platform/npu.py), reported once as ignored elsewhere;
- "unsupported": a switch that would change the model or the math in a way this framework does not
                 implement (MoE, context parallelism, ...): accepted while off, an error when on;
- "no_effect":   the rest of the vocabulary: accepted so existing configs parse, reported once
                 with the reason (NO_EFFECT_KEYS has specific ones; the others get a general one).
A name outside all of these is an error with a "did you mean" suggestion (config/loader.py).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

# The names live with the code that forwards them (platform/base.py): one list.
from mindspeed_rl.platform.base import MINDSPEED_SWITCHES  # noqa: E402

VOCAB_FILE = Path(__file__).with_name("megatron_vocab.json")

# Specific reasons for keys whose "no effect" deserves a word (they include ray_gpt's own keys).
NO_EFFECT_KEYS = {
    "use_mcore_models": "models are always megatron-core GPTModel",
    "distributed_backend": "the platform picks hccl, nccl or gloo",
    "no_shared_storage": "every node reads its own paths (checked before spawning)",
    "no_load_optim": "RL runs start from weights only; resume restores the optimizer",
    "no_load_rng": "RL runs start from weights only; resume restores rng states",
    "is_instruction_dataset": "the prompt dataset format is detected from data_path",
    "variable_seq_lengths": "sequences always have variable lengths here",
    "finetune": "load: always starts from the checkpoint's weights",
    "split": "only the training split is used; validation comes from val_data_path",
    "pad_to_multiple_of": "batches are padded to the longest sequence",
    "has_labels": "labels travel with every prompt that has them",
    "no_masked_softmax_fusion": "a CUDA/NPU kernel choice",
    "attention_softmax_in_fp32": "softmax is computed in fp32",
    "no_gradient_accumulation_fusion": "a CUDA kernel choice",
    "masked_softmax_fusion": "a CUDA/NPU kernel choice",
    "bias_gelu_fusion": "a CUDA/NPU kernel choice",
    "bias_dropout_fusion": "a CUDA/NPU kernel choice",
    "gradient_accumulation_fusion": "a CUDA kernel choice",
    "no_bias_swiglu_fusion": "a CUDA/NPU kernel choice",
    "no_rope_fusion": "a CUDA/NPU kernel choice",
    "cliprange_value": "PPO critic only",
    "critic_mini_batch_size": "PPO critic only",
    "critic_update_epochs": "PPO critic only",
    "eval_interval": "use training.test_freq",
    "eval_iters": "validation runs over the whole val_data_path",
    "log_throughput": "throughput is always logged",
    "sequence_parallel_size": "not supported",
    "use_rotary_position_embeddings": "position_embedding_type: rope is the only (and default) choice",
    "apply_rope_fusion": "a CUDA/NPU kernel choice",
    "bias_swiglu_fusion": "a CUDA/NPU kernel choice",
    "cross_entropy_loss_fusion": "a CUDA/NPU kernel choice",
    "use_cpu_initialization": "weights are created where the platform puts them",
    "transformer_impl": "the platform picks the layer implementation (local on CPU/NPU, transformer_engine on CUDA)",
    "micro_batch_size_per_gpu": "use micro_batch_size",
    # router precision: the router computes in the model's dtype here (fp32 in fp32 models). Measured on
    # a tiny GLM-4.5 in bf16, megatron's fp32 router logits did not bring the log-probs closer to
    # transformers' (mean difference 0.0121 against 0.0087, one routing flip)
    "moe_router_dtype": "the router computes in the model's dtype (fp32 in fp32 models)",
    "router_gating_in_fp32": "the router computes in the model's dtype (fp32 in fp32 models)",
    "topk_softmax_in_fp32": "the router computes in the model's dtype (fp32 in fp32 models)",
    "moe_revert_type_after_topk": "the router computes in the model's dtype (fp32 in fp32 models)",
    "num_layer_list": "pipeline stages get num_layers / pipeline_model_parallel_size layers each",
}
GENERAL_REASON = "a {source} argument of its own training loop; this framework's GRPO loop does not read it"

# name -> (values that mean "off", why it cannot be on here)
UNSUPPORTED = {
    "moe_expert_capacity_factor": ((None,), "token dropping (expert capacity) is not implemented; tokens are never dropped"),
    "rotary_seq_len_interpolation_factor": ((None, 1), "RoPE position interpolation is not implemented; see rope_scaling_type"),
    "use_alibi_mask": ((None, False), "ALiBi positions are not implemented"),
    "mtp_num_layers": ((None, 0), "multi-token prediction layers are not implemented"),
    # MindSpeed-LLM's model switches (2.3.0)
    "moe_device_level_aux_loss_coeff": ((None, 0), "DeepSeek-V2's device-level balance loss is not implemented"),
    "moe_comm_aux_loss_coeff": ((None, 0), "DeepSeek-V2's communication balance loss is not implemented"),
    "add_dense_bias": ((None, False), "a bias on the attention output projection alone is not implemented"),
    "embed_layernorm": ((None, False), "a LayerNorm after the word embeddings is not implemented"),
    "no_post_layer_norm": ((None, False), "a model without the final norm is not implemented"),
    "shared_expert_gate_output_dimension": ((None, 1), "a shared-expert gate with more than one output is not implemented"),
    "full_attention_interval": ((None, 0), "Qwen3-Next's linear-attention layers are not implemented"),
    "fix_router": ((None, False), "a fixed router (MindSpeed-LLM's load-balancing test switch) is not implemented"),
    "moe_z_loss_coeff": ((None, 0), "the router z-loss is not implemented"),
    "moe_input_jitter_eps": ((None, 0), "router input jitter (noise in the routing) is not implemented"),
    "apply_residual_connection_post_layernorm": ((None, False), "residuals taken after the layernorm are not implemented"),
    "fp32_residual_connection": ((None, False), "fp32 residuals in a bf16 / fp16 model are not implemented"),
    "scale_emb": ((None,), "MiniCPM's embedding / depth / width scalings are not implemented"),
    "dim_model_base": ((None,), "MiniCPM's embedding / depth / width scalings are not implemented"),
    "scale_depth": ((None,), "MiniCPM's embedding / depth / width scalings are not implemented"),
    "noop_layers": ((None,), "no-op layers are not implemented"),
    "cla_share_factor": ((None, 1), "cross-layer attention (K / V shared between layers) is not implemented"),
    "share_kvstates": ((None, False), "cross-layer attention (K / V shared between layers) is not implemented"),
    "interleave_sliding_window": ((None,), "MindSpeed-LLM's interleaved sliding window is spelled sliding_window + "
                                  "window_attn_skip_freq here (or comes from config.json)"),
    # Megatron-LM's YaRN of multi-latent attention (its MLA always rotates with YaRN, factor 1 = plain RoPE)
    "rotary_scaling_factor": ((None, 1, 1.0), "multi-latent attention's YaRN is spelled rope_scaling_type: yarn + "
                              "rope_scaling_factor here (or comes from config.json)"),
    "mscale": ((None, 1, 1.0), "YaRN's mscale is spelled rope_scaling_mscale here (or comes from config.json)"),
    "mscale_all_dim": ((None, 0, 0.0), "YaRN's mscale_all_dim is spelled rope_scaling_mscale_all_dim here (or comes "
                       "from config.json)"),
}

# MindSpeed-LLM's own spellings of keys the schema has under Megatron-LM's name (2.3.0 keeps most of them
# as deprecated aliases), and Megatron-LM's names the schema spells another way. The yaml may use
# either; the loader renames them (config/loader.py), and a section giving both with different values
# is refused.
ALIASES = {
    "moe_intermediate_size": "moe_ffn_hidden_size",
    "n_group": "moe_router_num_groups",
    "topk_group": "moe_router_group_topk",
    # MindSpeed-LLM 2.3.0 copies topk_group here (a slip in its deprecated_args.py); the meaning is HF's
    "routed_scaling_factor": "moe_router_topk_scaling_factor",
    "beta_fast": "rope_scaling_beta_fast",
    "beta_slow": "rope_scaling_beta_slow",
    "rope_scaling_original_max_position_embeddings": "original_max_position_embeddings",
    "use_glm_rope": "rotary_interleaved",  # GLM's partial RoPE: pairs (2i, 2i + 1) of the rotary_percent dims
    "partial_rotary_factor": "rotary_percent",
    "query_pre_attn_scalar": "softmax_scale",  # Gemma 2 / 3: scores scaled by query_pre_attn_scalar^-1/2
    "use_rope_scaling": "rope_scaling_type",  # Megatron-LM: Llama 3.1's scaling (rope_scaling_factor, default 8)
    "add_bias_linear": "disable_bias_linear",  # Megatron-LM's dest of --disable-bias-linear, inverted
    "multi_head_latent_attention": "multi_latent_attention",  # MindSpeed-LLM's names of MLA's keys
    "qk_nope_head_dim": "qk_head_dim",
    "qk_rope_head_dim": "qk_pos_emb_head_dim",
}
# How an alias's value becomes the target's; None means "unset" (a store_true switch left false,
# MindSpeed-LLM's 0.0 for "no partial rotary"). Aliases not listed keep their value.
ALIAS_VALUES = {
    "use_glm_rope": lambda v: True if v else None,
    "partial_rotary_factor": lambda v: v if v else None,
    "query_pre_attn_scalar": lambda v: float(v) ** -0.5 if v else None,
    "use_rope_scaling": lambda v: "llama3" if v else None,
    "add_bias_linear": lambda v: None if v is None else not v,
}
# MindSpeed-LLM keys that set a schema key from other keys as well (resolved once the sections are
# merged, loader._derived_aliases): first_k_dense_replace (+ moe_layer_freq, num_layers) -> the
# moe_layer_freq list; n_shared_experts (x the expert width) -> moe_shared_expert_intermediate_size;
# seq_aux -> moe_router_load_balancing_type: seq_aux_loss.
DERIVED = {
    "first_k_dense_replace": "moe_layer_freq",
    "n_shared_experts": "moe_shared_expert_intermediate_size",
    "seq_aux": "moe_router_load_balancing_type",
}


@functools.lru_cache(maxsize=1)
def vocabulary() -> dict:
    """The data file: {"sources": [...], "names": {name: [source, ...]}}."""
    with open(VOCAB_FILE, encoding="utf-8") as f:
        return json.load(f)


def normalize_key(key: str) -> str:
    """ray_gpt configs mix `max-tokens-to-oom` and `max_tokens_to_oom`; both mean the same."""
    return key.replace("-", "_")


def route(key: str) -> str | None:
    """schema / alias / mindspeed / unsupported / no_effect for a known name, None for an unknown one."""
    from mindspeed_rl.config.schema import all_flat_keys

    key = normalize_key(key)
    if key in all_flat_keys():
        return "schema"
    if key in ALIASES or key in DERIVED:
        return "alias"
    if key in MINDSPEED_SWITCHES:
        return "mindspeed"
    if key in UNSUPPORTED:
        return "unsupported"
    if key in NO_EFFECT_KEYS or key in vocabulary()["names"]:
        return "no_effect"
    return None


def unsupported_problem(key: str, value) -> str | None:
    """A sentence when an unsupported switch is on; None while it is off."""
    off, why = UNSUPPORTED[normalize_key(key)]
    if value in off and not (isinstance(value, bool) and value is True):  # True == 1 in Python
        return None
    return f"is {value!r}, but {why}; remove it or set it to {off[-1]!r}"


def no_effect_reason(key: str) -> str:
    key = normalize_key(key)
    if key in NO_EFFECT_KEYS:
        return NO_EFFECT_KEYS[key]
    sources = vocabulary()["names"].get(key, [])
    return GENERAL_REASON.format(source=" / ".join(
        {"megatron-lm": "Megatron-LM", "mindspeed-llm": "MindSpeed-LLM", "mindspeed": "MindSpeed"}.get(s, s)
        for s in sources) or "Megatron-LM")


def suggestion_pool() -> set[str]:
    """Names a typo is matched against: ours first in spirit, the vocabulary too."""
    from mindspeed_rl.config.schema import all_flat_keys

    return all_flat_keys() | set(MINDSPEED_SWITCHES) | set(vocabulary()["names"])
