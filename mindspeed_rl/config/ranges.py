"""The valid range of every numeric config key whose meaning has one, as data, and the check.

    RANGES["PPOConfig.clip_ratio"] == "[0, 1)"      # interval notation; inf for no bound

A value outside its range is one sentence naming the yaml key, the value, the range and what the
key means (validate.py collects them with the other problems). Keys listed in CHECKED_ELSEWHERE
have a rule that depends on another key (temperature with do_sample, top_p, ...) in validate.py;
NO_RANGE lists the numeric keys any value is valid for. A unit test checks that every numeric
schema field is in exactly one of the three, so a new numeric key cannot skip the question.
"""
from __future__ import annotations

import dataclasses
import math
import re

from mindspeed_rl.config import schema

RANGES = {
    # model architecture
    "ModelArch.num_layers": "[1, inf)",
    "ModelArch.hidden_size": "[1, inf)",
    "ModelArch.ffn_hidden_size": "[1, inf)",
    "ModelArch.num_attention_heads": "[1, inf)",
    "ModelArch.num_query_groups": "[1, inf)",
    "ModelArch.q_lora_rank": "[1, inf)",
    "ModelArch.kv_lora_rank": "[1, inf)",
    "ModelArch.qk_head_dim": "[1, inf)",
    "ModelArch.qk_pos_emb_head_dim": "[1, inf)",
    "ModelArch.v_head_dim": "[1, inf)",
    "ModelArch.linear_num_key_heads": "[1, inf)",  # Qwen3.5's Gated DeltaNet sizes
    "ModelArch.linear_num_value_heads": "[1, inf)",
    "ModelArch.linear_key_head_dim": "[1, inf)",
    "ModelArch.linear_value_head_dim": "[1, inf)",
    "ModelArch.linear_conv_kernel_dim": "[1, inf)",
    "ModelArch.mamba_num_heads": "[1, inf)",  # Granite 4.0-H's Mamba-2 sizes
    "ModelArch.mamba_head_dim": "[1, inf)",
    "ModelArch.mamba_num_groups": "[1, inf)",
    "ModelArch.mamba_state_dim": "[1, inf)",
    "ModelArch.mamba_conv_kernel": "[1, inf)",
    "ModelArch.mamba_chunk_size": "[1, inf)",
    "ModelArch.short_conv_kernel": "[1, inf)",  # LFM2's conv_L_cache
    "ModelArch.kv_channels": "[1, inf)",
    "ModelArch.sliding_kv_channels": "[1, inf)",  # Gemma 4's sliding layers' sizes
    "ModelArch.sliding_num_query_groups": "[1, inf)",
    "ModelArch.rope_proportion": "(0, 1]",
    "ModelArch.per_layer_input_size": "[1, inf)",  # Gemma 4 E2B / E4B's per-layer inputs
    "ModelArch.per_layer_input_vocab_size": "[1, inf)",
    "ModelArch.num_kv_shared_layers": "[0, inf)",
    "ModelArch.padded_vocab_size": "[1, inf)",
    "ModelArch.make_vocab_size_divisible_by": "[1, inf)",
    "ModelArch.max_position_embeddings": "[1, inf)",
    "ModelArch.rotary_base": "(0, inf)",
    "ModelArch.rope_local_base_freq": "(0, inf)",
    "ModelArch.attn_logit_softcapping": "(0, inf)",
    "ModelArch.output_logit_softcapping": "(0, inf)",
    "ModelArch.activation_func_clamp_value": "(0, inf)",  # gpt-oss's swiglu_limit (7)
    "ModelArch.clip_qkv": "(0, inf)",  # OLMo's q / k / v clamp (null: none)
    "ModelArch.rotary_percent": "(0, 1]",
    "ModelArch.softmax_scale": "(0, inf)",
    "ModelArch.rope_scaling_factor": "(0, inf)",
    "ModelArch.low_freq_factor": "(0, inf)",
    "ModelArch.high_freq_factor": "(0, inf)",
    "ModelArch.original_max_position_embeddings": "[1, inf)",
    "ModelArch.rope_attention_factor": "(0, inf)",
    "ModelArch.sliding_window": "[1, inf)",
    "ModelArch.embedding_multiplier_scale": "(0, inf)",
    "ModelArch.residual_multiplier": "(0, inf)",
    "ModelArch.output_multiplier_scale": "(0, inf)",
    **{f"ModelArch.{k}": "(0, inf)" for k in ("attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
                                               "ssm_out_multiplier", "key_multiplier", "mlp_gate_multiplier",
                                               "mlp_down_multiplier")},
    "ModelArch.rope_scaling_beta_fast": "(0, inf)",
    "ModelArch.rope_scaling_beta_slow": "(0, inf)",
    "ModelArch.rope_scaling_mscale": "(0, inf)",
    "ModelArch.rope_scaling_mscale_all_dim": "(0, inf)",
    "ModelArch.norm_epsilon": "(0, 1)",
    "ModelArch.attention_dropout": "[0, 1)",
    "ModelArch.hidden_dropout": "[0, 1)",
    "ModelArch.init_method_std": "(0, inf)",
    "ModelArch.num_experts": "[1, inf)",
    "ModelArch.moe_router_topk": "[1, inf)",
    "ModelArch.moe_ffn_hidden_size": "[1, inf)",
    "ModelArch.moe_shared_expert_intermediate_size": "[1, inf)",
    "ModelArch.moe_aux_loss_coeff": "[0, inf)",
    "ModelArch.moe_router_bias_update_rate": "[0, inf)",
    "ModelArch.moe_router_num_groups": "[1, inf)",
    "ModelArch.moe_router_group_topk": "[1, inf)",
    "ModelArch.moe_router_topk_scaling_factor": "(0, inf)",
    # per role
    "RoleConfig.num_gpus_for_train": "[0, inf)",
    "RoleConfig.num_gpus_for_infer": "[0, inf)",
    "ParallelConfig.tensor_model_parallel_size": "[1, inf)",
    "ParallelConfig.pipeline_model_parallel_size": "[1, inf)",
    "ParallelConfig.expert_model_parallel_size": "[1, inf)",
    "ParallelConfig.expert_tensor_parallel_size": "[1, inf)",
    "ParallelConfig.virtual_pipeline_model_parallel_size": "[1, inf)",
    "ParallelConfig.num_layers_per_virtual_pipeline_stage": "[1, inf)",
    "ParallelConfig.recompute_num_layers": "[1, inf)",
    "ParallelConfig.context_parallel_size": "[1, inf)",
    "OptimConfig.lr": "[0, 1]",
    "OptimConfig.min_lr": "[0, 1]",
    "OptimConfig.lr_warmup_fraction": "[0, 1]",
    "OptimConfig.weight_decay": "[0, inf)",
    "OptimConfig.clip_grad": "[0, inf)",
    "OptimConfig.adam_beta1": "[0, 1)",
    "OptimConfig.adam_beta2": "[0, 1)",
    "OptimConfig.adam_eps": "(0, 1)",
    "OptimConfig.initial_loss_scale": "(0, inf)",
    "RolloutConfig.num_samples_per_step": "[1, inf)",
    "RolloutConfig.max_tokens_to_oom": "[1, inf)",
    "PPOConfig.ppo_mini_batch_size": "[1, inf)",
    "PPOConfig.clip_ratio": "[0, 1)",
    "PPOConfig.clip_ratio_low": "[0, 1)",
    "PPOConfig.clip_ratio_high": "[0, inf)",
    "PPOConfig.entropy_coeff": "[0, inf)",
    "PPOConfig.kl_loss_coef": "[0, inf)",
    # run and data
    "RunConfig.seq_length": "[2, inf)",
    "RunConfig.test_freq": "[0, inf)",
    "RunConfig.log_interval": "[1, inf)",
    "RunConfig.worker_timeout_s": "(0, inf)",
    "RunConfig.worker_start_timeout_s": "(0, inf)",
    "DataConfig.max_prompt_length": "[1, inf)",
    # algorithm
    "AlgorithmConfig.gamma": "[0, 1]",
    "AlgorithmConfig.lam": "[0, 1]",
    "AlgorithmConfig.missing_eos_penalty": "[0, inf)",
    "AlgorithmConfig.verifier_timeout_s": "(0, inf)",
    "AlgorithmConfig.max_num_gen_batches": "[1, inf)",
    "AlgorithmConfig.overlong_buffer_len": "[0, inf)",
    "AlgorithmConfig.overlong_penalty_factor": "[0, inf)",
    "KLCtrlConfig.kl_coef": "[0, inf)",
    "KLCtrlConfig.target_kl": "(0, inf)",
    "KLCtrlConfig.horizon": "[1, inf)",
}

# numeric keys with a rule that involves another key, in validate.py
CHECKED_ELSEWHERE = {
    "RoleConfig.micro_batch_size", "RolloutConfig.n_samples_per_prompt", "RolloutConfig.temperature",
    "RolloutConfig.top_p", "RolloutConfig.top_k", "RolloutConfig.max_new_tokens", "PPOConfig.ppo_epochs",
    "PPOConfig.clip_ratio_c", "RunConfig.global_batch_size", "RunConfig.train_iters", "RunConfig.save_interval",
    "RunConfig.keep_last_n", "RunConfig.max_skipped_updates",
    # rollout_engine: vllm and TIS (vllm_checks.check_vllm / validate._check_ppo): checked only when that engine / mode is on
    "RolloutConfig.infer_tensor_parallel_size", "RolloutConfig.gpu_memory_utilization",
    "RolloutConfig.vllm_kv_cache_gb", "RolloutConfig.sync_check_tolerance", "RolloutConfig.sync_check_interval",
    "PPOConfig.tis_cap",
}
# numeric keys any value of their type is valid for
NO_RANGE = {
    "RunConfig.seed",  # any integer seeds the generators
    "AlgorithmConfig.reward_model_weight",  # a negative weight turns a reward model into a penalty on purpose
    "ModelArch.glu_linear_offset",  # added to the up projection (gpt-oss: 1); any value is a valid MLP
}

# fields the loader fills from another key when unset (loader._derive)
DERIVED_FROM = {"PPOConfig": {"clip_ratio_low": "clip_ratio", "clip_ratio_high": "clip_ratio"}}

_INTERVAL = re.compile(r"^([\[(])\s*(-?[\w.]+)\s*,\s*(-?[\w.]+)\s*([\])])$")


def parse_interval(text: str) -> tuple[float, bool, float, bool]:
    """'[0, 1)' -> (0.0, True, 1.0, False): low, low included, high, high included."""
    m = _INTERVAL.match(text)
    if not m:
        raise ValueError(f"bad interval {text!r}")
    return float(m.group(2)), m.group(1) == "[", float(m.group(3)), m.group(4) == "]"


def describe(text: str) -> str:
    """'[1, inf)' -> '>= 1', '(0, 1]' -> 'in (0, 1]'."""
    lo, lo_in, hi, hi_in = parse_interval(text)
    if math.isinf(hi):
        return f"{'>=' if lo_in else '>'} {lo:g}"
    return f"in {text}"


def in_range(value: float, text: str) -> bool:
    lo, lo_in, hi, hi_in = parse_interval(text)
    if isinstance(value, float) and math.isnan(value):
        return False
    above = value >= lo if lo_in else value > lo
    below = value <= hi if hi_in else value < hi
    return above and below


def range_problems(obj, path: str) -> list[str]:
    """One sentence per field of dataclass `obj` outside its range; `path` is the yaml section."""
    problems = []
    cls = type(obj).__name__
    for f in dataclasses.fields(obj):
        if f.name in DERIVED_FROM.get(cls, {}) and getattr(obj, f.name) == getattr(obj, DERIVED_FROM[cls][f.name]):
            continue  # the loader copied the parent key's value: its problem is reported once, there
        rule = RANGES.get(f"{cls}.{f.name}")
        value = getattr(obj, f.name)
        if rule is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not in_range(value, rule):
            problems.append(f"`{path}.{f.name}: {value}` must be {describe(rule)}; it is the {f.metadata.get('doc', f.name)}.")
    return problems


def numeric_fields() -> set[str]:
    """'Class.field' for every int/float field of the schema's dataclasses."""
    import typing

    out = set()
    for cls in (schema.ModelArch, schema.RoleConfig, schema.ParallelConfig, schema.OptimConfig, schema.RolloutConfig,
                schema.PPOConfig, schema.RunConfig, schema.DataConfig, schema.AlgorithmConfig, schema.KLCtrlConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
            if args[0] in (int, float):
                out.add(f"{cls.__name__}.{f.name}")
    return out
