"""Checks of a role's sequence parallel / virtual pipeline / recompute / context parallel settings,
before any Ray worker starts (validate.py calls `parallel_problems` for every active role).

One sentence per problem, naming the key, the values and the fix. The keys are Megatron's (and
MindSpeed-LLM's): sequence_parallel; virtual_pipeline_model_parallel_size or its other spelling
num_layers_per_virtual_pipeline_stage (one meaning: chunks per pipeline rank = num_layers / (PP x
layers per chunk)); recompute_granularity / recompute_method / recompute_num_layers (and
recompute_activations, Megatron's shorthand for selective); context_parallel_size.
"""
from __future__ import annotations

from mindspeed_rl.config.schema import RoleConfig

GRANULARITIES = ("full", "selective")
METHODS = ("uniform", "block")


def parallel_problems(role: RoleConfig, path: str, dp: int, n_samples: int, mini_batch: int) -> list[str]:
    """Problems of one role; dp / n_samples / mini_batch size the actor's micro-batch count."""
    out: list[str] = []
    p, layers = role.parallel, role.arch.num_layers
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    if p.sequence_parallel and tp == 1:
        out.append(f"`{path}.sequence_parallel: true` needs tensor_model_parallel_size > 1; set it to false.")
    vpp = _virtual_pipeline(role, path, out)
    if vpp > 1:
        if pp == 1:
            out.append(f"`{path}.virtual_pipeline_model_parallel_size: {vpp}` needs pipeline_model_parallel_size > 1 "
                       f"(chunks interleave over pipeline ranks); set PP > 1 or remove the virtual pipeline.")
        elif layers and layers % (pp * vpp):
            out.append(f"`{path}`: num_layers {layers} is not divisible by pipeline_model_parallel_size {pp} x "
                       f"virtual_pipeline_model_parallel_size {vpp} = {pp * vpp}; pick sizes whose product divides it.")
        if role.role == "reward":
            out.append("`reward.virtual_pipeline_model_parallel_size`: the reward model runs without a virtual "
                       "pipeline; remove it from the reward section.")
        if role.role == "actor_rollout" and pp > 1:
            micro = (mini_batch * n_samples) // max(1, dp * role.micro_batch_size)
            if micro % pp:
                out.append(f"`{path}`: the interleaved pipeline schedule runs micro-batches in groups of "
                           f"pipeline_model_parallel_size {pp}, but a mini-batch has {micro} per data-parallel rank "
                           f"(ppo_mini_batch_size {mini_batch} x n_samples_per_prompt {n_samples} / (DP {dp} x "
                           f"micro_batch_size {role.micro_batch_size})); make it a multiple of {pp}.")
    _recompute(role, path, pp * max(vpp, 1), out)
    if p.context_parallel_size > 1:
        out.append(f"`{path}.context_parallel_size: {p.context_parallel_size}`: context parallelism is not available "
                   f"here: megatron-core's CP attention needs Transformer Engine (CUDA), MindSpeed's ring attention "
                   f"(context_parallel_algo, forwarded on NPU) needs the NPU, and this framework's log-prob and loss "
                   f"code does not split sequences over CP ranks yet; set it to 1 (for long sequences use "
                   f"sequence_parallel with TP, and recompute).")
    return out


def _virtual_pipeline(role: RoleConfig, path: str, out: list[str]) -> int:
    """Chunks per pipeline rank from either key (1 = off); a disagreement is a problem."""
    p, layers, pp = role.parallel, role.arch.num_layers, role.parallel.pipeline_model_parallel_size
    vpp = p.virtual_pipeline_model_parallel_size or 1
    per = p.num_layers_per_virtual_pipeline_stage
    if per:
        if not layers or layers % (pp * per):
            out.append(f"`{path}.num_layers_per_virtual_pipeline_stage: {per}` x pipeline_model_parallel_size {pp} "
                       f"does not divide num_layers {layers}; pick layers per chunk that divide num_layers / PP.")
            return vpp
        from_layers = layers // (pp * per)
        if p.virtual_pipeline_model_parallel_size and from_layers != vpp:
            out.append(f"`{path}`: num_layers_per_virtual_pipeline_stage {per} means {from_layers} chunks per "
                       f"pipeline rank (num_layers {layers} / (PP {pp} x {per})), but "
                       f"virtual_pipeline_model_parallel_size is {vpp}; set only one of the two.")
        return from_layers
    return vpp


def _recompute(role: RoleConfig, path: str, chunks: int, out: list[str]) -> None:
    p, layers = role.parallel, role.arch.num_layers
    granularity = p.recompute_granularity or ("selective" if p.recompute_activations else None)
    if p.recompute_granularity is not None and p.recompute_granularity not in GRANULARITIES:
        out.append(f"`{path}.recompute_granularity: {p.recompute_granularity}` is not supported; use full, "
                   f"selective, or null for no recompute.")
        return
    if p.recompute_method is not None and p.recompute_method not in METHODS:
        out.append(f"`{path}.recompute_method: {p.recompute_method}` is not supported; use uniform or block.")
        return
    if granularity != "full":
        for key in ("recompute_method", "recompute_num_layers"):
            if getattr(p, key) is not None:
                out.append(f"`{path}.{key}: {getattr(p, key)}` applies only to recompute_granularity: full (it is "
                           f"{granularity}); remove it or set recompute_granularity: full.")
        return
    n = p.recompute_num_layers
    per_chunk = layers // chunks if layers and chunks and layers % chunks == 0 else None
    if n is None or per_chunk is None:
        return
    if n > per_chunk:
        out.append(f"`{path}.recompute_num_layers: {n}` is more than the {per_chunk} layers of one pipeline chunk "
                   f"(num_layers {layers} / {chunks} chunks); use 1 to {per_chunk}.")
    elif (p.recompute_method or "uniform") == "uniform" and per_chunk % n:
        out.append(f"`{path}.recompute_num_layers: {n}` does not divide the {per_chunk} layers of one pipeline "
                   f"chunk, as recompute_method: uniform needs (groups of {n} layers); use a divisor of {per_chunk} "
                   f"or recompute_method: block.")
