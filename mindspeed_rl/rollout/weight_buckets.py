"""HF-named weights out of a live sharded megatron model, in buckets through the Ray object store.

    named = gathered_hf_tensors(model, args)     # (HF name, full tensor), TP shards merged
    refs = export_hf_buckets(model, args)        # DP rank 0 puts ~BUCKET_MB buckets in the object store
    pairs = fetch_buckets(refs, timeout_s, who)  # the receiving side, one bucket in memory at a time

Frozen parameters (freeze_parameters) never change: after the first sync, the HF tensors the receiving engine can do
without (RolloutSkip: all of an engine layer's tensors frozen) are neither gathered nor sent again.

Shared by the actor (colocated vLLM sync, split export) and the generation-only ranks; it lives
below workers/ so that the roles do not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Optional

import torch

BUCKET_MB = 256.0  # weights per object-store entry: a few entries per billion parameters


# ---------------------------------------------------------------------------------------------
# training side: a live sharded model -> HF-named full tensors


@dataclass
class RolloutSkip:
    """What a rank's syncs leave out: `skip`, HF names the engine keeps from an earlier sync (frozen parameters
    only; set the same on every rank by the trainer: trainer/roles.py), and `hf_names`, each frozen megatron
    tensor's HF names, recorded by a full sync (`record`). A megatron tensor all of whose HF names are skipped is
    not even gathered."""

    skip: frozenset = frozenset()
    hf_names: dict = field(default_factory=dict)  # frozen megatron name -> its HF names
    record: bool = False  # the next sync records hf_names (a full sync: skip must be empty)

    def frozen_hf_names(self) -> set:
        return {n for names in self.hf_names.values() for n in names}


def frozen_names(model) -> set:
    """Global megatron names of this rank's frozen parameters (requires_grad off: models/freeze.py)."""
    from mindspeed_rl.models.chunks import as_chunks
    from mindspeed_rl.models.hf_bridge.loader import global_param_name

    out = set()
    for chunk in as_chunks(model):
        chunk = getattr(chunk, "module", chunk)
        for local, tensor in chunk.state_dict(keep_vars=True).items():
            if isinstance(tensor, torch.nn.Parameter) and not tensor.requires_grad:
                out.add(global_param_name(chunk, local)[0])
    return out


def gathered_hf_tensors(model: torch.nn.Module, args: Mapping[str, Any],
                        skip: Optional[RolloutSkip] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) of this rank's pipeline stage, TP shards merged; MoE experts merged
    over their expert-TP group and collected from every expert-parallel rank.

    Every rank of a TP group (and, with experts, of an EP group) must run the iteration to the end
    together (each parameter is an all-gather over the group); all of them get the same full
    tensors. At most one parameter's shards (one expert's, times EP) are held beyond the model.
    Vocabulary rows are kept up to padded_vocab_size, the tied output layer is left out (it is
    the embedding). `skip` (RolloutSkip): its HF names are left out, and recorded when asked.
    """
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.checkpoint import chunk_state_dict
    from mindspeed_rl.models.hf_bridge.mapping import EXPERT_KINDS, gated_mlp
    from mindspeed_rl.models.hf_bridge.sharding import is_moe, kind_of, mcore_to_hf
    from mindspeed_rl.models.hf_export import gather_tp

    tied = not args.get("untie_embeddings_and_output_weights", False)
    vocab = int(args["padded_vocab_size"])
    ep = ps.get_expert_model_parallel_world_size() if is_moe(args) else 1
    skip = skip or RolloutSkip()
    frozen = frozen_names(model) if skip.record else set()
    for name, tensor in chunk_state_dict(model).items():
        kind = kind_of(name, tied, gated_mlp(args))
        experts_elsewhere = kind in EXPERT_KINDS and ep > 1  # (an all-gather over EP: its ranks freeze other experts)
        known = skip.hf_names.get(name)
        if known and not experts_elsewhere and all(n in skip.skip for n in known):
            continue  # (the same on every rank of the TP group: frozen by global name, one skip set)
        full = gather_tp(tensor, kind)
        if not experts_elsewhere:
            named = mcore_to_hf(name, full, args, vocab)
            if skip.record and name in frozen:
                skip.hf_names[name] = tuple(named)
            yield from ((n, t) for n, t in named.items() if n not in skip.skip)
            continue
        parts = [torch.empty_like(full) for _ in range(ep)]
        torch.distributed.all_gather(parts, full.contiguous(), group=ps.get_expert_model_parallel_group())
        for r, part in enumerate(parts):
            named = mcore_to_hf(expert_on_rank(name, args, ep, r), part, args, vocab)
            yield from ((n, t) for n, t in named.items() if n not in skip.skip)


def expert_on_rank(name: str, args: Mapping[str, Any], ep: int, ep_rank: int) -> str:
    """The megatron name (global expert number) of the expert that EP rank `ep_rank` holds in the
    place where this rank holds `name` (megatron splits the experts contiguously over EP)."""
    import re

    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.hf_bridge.sharding import expert_range

    experts = int(args["num_experts"])
    match = re.search(r"local_experts\.(\d+)\.", name)
    local = int(match.group(1)) - expert_range(experts, ep, ps.get_expert_model_parallel_rank()).start
    return f"{name[:match.start(1)]}{expert_range(experts, ep, ep_rank)[local]}{name[match.end(1):]}"


def hf_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_mb: float) -> Iterator[dict[str, torch.Tensor]]:
    """Group (name, tensor) pairs into dicts of at least bucket_mb MiB (the last one may be smaller)."""
    bucket, size, limit = {}, 0, bucket_mb * 2 ** 20
    for name, tensor in named:
        bucket[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= limit:
            yield bucket
            bucket, size = {}, 0
    if bucket:
        yield bucket


def export_hf_buckets(model: torch.nn.Module, args: Mapping[str, Any], bucket_mb: float = BUCKET_MB,
                      skip: Optional[RolloutSkip] = None) -> list:
    """Put this stage's HF-named weights in the Ray object store; returns the object refs.

    DP rank 0 takes part (DP replicas hold the same weights): its TP ranks gather together and TP
    rank 0 puts the buckets ({HF name: tensor}, about bucket_mb each). An MoE model at EP > 1 keeps
    the other experts on other DP ranks: then every rank runs the gathers (each TP group its own,
    each EP group its experts) and still only that one rank puts buckets. Other ranks return [].
    `skip`: as gathered_hf_tensors'.
    """
    import ray
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.hf_bridge.sharding import is_moe

    experts_elsewhere = is_moe(args) and ps.get_expert_model_parallel_world_size() > 1
    sender = ps.get_data_parallel_rank() == 0 and ps.get_tensor_model_parallel_rank() == 0
    if ps.get_data_parallel_rank() != 0 and not experts_elsewhere:
        return []
    named = gathered_hf_tensors(model, args, skip)
    if not sender:
        for _ in named:  # take part in every all-gather; the sender puts the buckets
            pass
        return []
    # a copy per tensor: parameters are views into megatron's contiguous buffers, and pickling a
    # view would ship its whole buffer (the whole model) with every tensor
    compact = ((k, v.detach().to("cpu", copy=True)) for k, v in named)
    return [ray.put(bucket) for bucket in hf_buckets(compact, bucket_mb)]


def fetch_buckets(refs: list, timeout_s: float, who: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream the (HF name, tensor) pairs of object-store buckets, one bucket in memory at a time."""
    import ray
    from ray.exceptions import GetTimeoutError

    for i, ref in enumerate(refs):
        try:
            bucket = ray.get(ref, timeout=timeout_s)
        except GetTimeoutError:
            raise TimeoutError(f"{who}: weight bucket {i + 1} of {len(refs)} from the training ranks did not "
                               f"arrive within {timeout_s:g} s (is the training rank that owns it alive?)") from None
        yield from bucket.items()
