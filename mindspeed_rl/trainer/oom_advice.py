"""What to change when a worker runs out of device memory, by the method it ran out in.

A CUDA / NPU out-of-memory error reaches the driver as the allocator's message and a traceback deep
in megatron. The worker group (distributed/worker_group.py) turns it into one sentence: role, rank,
node, method, what the allocator tried and had, and this module's advice, the config keys that
bound the memory of that phase, with their current values:

    actor_rollout rank 0 on 10.0.0.5 ran out of device memory in update_actor: CUDA out of memory.
    Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.20 GiB is free;
    lower actor_rollout_ref.actor_rollout.micro_batch_size (now 8), set ...recompute_granularity: full,
    or raise ...tensor_model_parallel_size (now 1) (log: ...)
"""
from __future__ import annotations

from mindspeed_rl.config.schema import Config, RoleConfig
from mindspeed_rl.config.validate import role_path

_LOG_PROB_METHODS = ("compute_log_prob", "compute_ref_log_prob", "compute_rm_score")
_GENERATE_METHODS = ("generate_sequences", "generate_probe")
_SYNC_METHODS = ("update_weights", "export_weights_for_rollout", "sync_rollout_weights")


def _role(cfg: Config, group_role: str) -> RoleConfig:
    """The RoleConfig of a worker group's role name (the split's generation group is the actor's)."""
    return {"actor_rollout": cfg.actor, "rollout": cfg.actor, "ref": cfg.ref, "reward": cfg.reward}[group_role]


def device_oom_advice(cfg: Config, group_role: str, method: str) -> str:
    """The keys to change when `method` of the `group_role` workers ran out of device memory."""
    role = _role(cfg, group_role)
    p, par, r = role_path(role), role.parallel, role.rollout
    shard = (f"raise {p}.tensor_model_parallel_size (now {par.tensor_model_parallel_size}) or "
             f"pipeline_model_parallel_size (now {par.pipeline_model_parallel_size})")
    if method == "__init__":
        return f"the model does not fit: {shard}" + ("" if role.bf16 else f", or set {p}.bf16: true")
    if method in _GENERATE_METHODS:
        advice = (f"lower {p}.num_samples_per_step (now {r.num_samples_per_step}, sequences per generation batch), "
                  f"max_tokens_to_oom (now {r.max_tokens_to_oom}) or max_new_tokens (now {r.max_new_tokens})")
        if r.rollout_engine == "vllm":
            advice += (f"; the vLLM engine keeps {p}.gpu_memory_utilization (now {r.gpu_memory_utilization}) of the "
                       "device for its weights and KV cache: lower it when training needs the room")
        return advice
    if method in _LOG_PROB_METHODS:
        advice = f"lower {p}.micro_batch_size (now {role.micro_batch_size})"
        if role.role == "ref" and not role.param_offload:
            advice += f", or set {p}.param_offload: true (the reference waits in host memory between uses)"
        return advice
    if method == "update_actor":
        recompute = ("" if par.recompute_granularity == "full"
                     else f", set {p}.recompute_granularity: full (activations recomputed in the backward)")
        return f"lower {p}.micro_batch_size (now {role.micro_batch_size}){recompute}, or {shard}"
    if method in _SYNC_METHODS:
        advice = "the weight sync needs room for one bucket of weights beside the rollout engine"
        if r.rollout_engine == "vllm":
            advice += f": lower {p}.gpu_memory_utilization (now {r.gpu_memory_utilization})"
        return advice
    return f"lower {p}.micro_batch_size (now {role.micro_batch_size}) or {shard}"
