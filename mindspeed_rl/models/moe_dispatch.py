"""megatron's allgather token dispatcher without host syncs when every expert is local (EP 1).

Why: the dispatcher sorts the routed (token, expert) pairs by expert with data-dependent ops, three
host syncs per MoE layer: `local_map.sum(0).cpu()` for the token counts, and two `masked_select`s
(the pairs' token ids and their routing probs), whose output length the device must report before
the host can go on. On one H200 a 16-expert, 8-layer model decoded at 25.9 host syncs per token
(docs/accelerators.md) against 1.9 for a dense model: the GPU waits for the CPU at every MoE layer.

What: with dropless top-k routing every token has exactly k experts, so the number of routed pairs
is known ahead (tokens x k), and `torch.nonzero_static` finds them at a fixed size, in the order
megatron's `masked_select` gives (expert-major, tokens ascending). The token counts stay on the
device: `GroupedExperts` (models/grouped_experts.py) takes its group offsets from them on the
device, so a MoE layer with both runs without a host sync; megatron's `SequentialMLP` still reads
them once (`tolist`). The permutation, the probs and the counts are megatron's own, element for
element, so outputs and gradients are bit for bit those of megatron's dispatcher (tests).

Where it does not apply the dispatcher is megatron's unchanged: expert parallelism (a rank's share
of the pairs is data dependent), capacity factors (dropped tokens), fused permutation (Transformer
Engine's), or a `nonzero_static` the device lacks (one warning, then megatron's from there on).
Both megatron-core lines are covered: 0.12's `token_permutation`, 0.16's `dispatch_postprocess`.
"""
from __future__ import annotations

import logging

import torch

from mindspeed_rl.platform import get_platform
from mindspeed_rl.platform.base import compile_error_summary  # `Type: first line` of any error

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.tensor_parallel import gather_from_sequence_parallel_region  # noqa: E402
from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher  # noqa: E402

log = logging.getLogger(__name__)

_STATE = {"failed": None}  # the error that turned the static permutation off in this process
_HAS_POSTPROCESS = hasattr(MoEAllGatherTokenDispatcher, "dispatch_postprocess")  # megatron-core >= 0.13


def applies(dispatcher) -> bool:
    """Whether the static permutation holds for this dispatcher's config (module docstring)."""
    c = dispatcher.config
    return (dispatcher.ep_size == 1 and c.moe_expert_capacity_factor is None
            and not getattr(c, "moe_pad_expert_input_to_capacity", False)
            and not getattr(c, "moe_permute_fusion", False))


def static_permute(hidden: torch.Tensor, local_map: torch.Tensor, local_probs: torch.Tensor, topk: int):
    """megatron's `permute` + probs `masked_select` of the allgather dispatcher at a size known ahead.

    Args:
        hidden: (N, H) tokens; local_map: (N, E) bool, exactly `topk` per row; local_probs: (N, E).
    Returns:
        (permuted (N*topk, H), sorted token ids (N*topk,), permuted probs (N*topk,), counts (E,) long),
        all on hidden's device; pairs in megatron's order (expert-major, tokens ascending).
    """
    n = local_map.shape[0]
    flat = local_map.T.reshape(-1)  # (E*N,) expert-major, as megatron's masked_select reads it
    pairs = torch.nonzero_static(flat, size=n * topk).squeeze(1)  # (N*k,) positions of the routed pairs
    sorted_ids = pairs % n
    probs = local_probs.T.reshape(-1).index_select(0, pairs)
    return hidden.index_select(0, sorted_ids), sorted_ids, probs, local_map.sum(dim=0).long()


class StaticAllGatherDispatcher(MoEAllGatherTokenDispatcher):
    """megatron's allgather dispatcher with the local permutation of `static_permute` (module docstring)."""

    def _permute_local(self, hidden_states: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor):
        self.hidden_shape_before_permute = hidden_states.shape
        lo, hi = self.local_expert_indices[0], self.local_expert_indices[-1] + 1
        self.local_map = routing_map[:, lo:hi].contiguous()
        local_probs = probs[:, lo:hi].contiguous()
        permuted, self.reversed_local_input_permutation_mapping, self.local_probs, counts = static_permute(
            hidden_states, self.local_map, local_probs, self.router_topk)
        return permuted, counts, self.local_probs

    def _static(self) -> bool:
        return _STATE["failed"] is None and applies(self)

    def _failed(self, err: Exception) -> None:
        _STATE["failed"] = err
        log.warning("MoE dispatch: torch.nonzero_static failed (%s); tokens are permuted with megatron's "
                    "masked_select (a host sync per MoE layer) from here on.", compile_error_summary(err))

    if _HAS_POSTPROCESS:  # megatron-core 0.16: dispatch_preprocess -> token_dispatch -> dispatch_postprocess
        def dispatch_postprocess(self, hidden_states, probs):
            if self._static():
                try:
                    out = self._permute_local(hidden_states, self.routing_map, probs)
                    self.routing_map = None
                    return out
                except (RuntimeError, NotImplementedError) as err:  # no nonzero_static on this device
                    self._failed(err)
            return super().dispatch_postprocess(hidden_states, probs)
    else:  # megatron-core 0.12: one token_permutation
        def token_permutation(self, hidden_states, probs, routing_map):
            if not self._static():
                return super().token_permutation(hidden_states, probs, routing_map)
            shape = hidden_states.shape
            flat = hidden_states.view(-1, shape[-1])
            original = (probs, routing_map)
            if self.tp_size > 1:  # EP is 1 here: the expert-TP group's tokens, as megatron gathers them
                with torch.no_grad():
                    routing_map = gather_from_sequence_parallel_region(routing_map, group=self.tp_ep_group)
                probs = gather_from_sequence_parallel_region(probs, group=self.tp_ep_group)
                flat = gather_from_sequence_parallel_region(flat, group=self.tp_ep_group, use_global_buffer=True)
            try:
                out = self._permute_local(flat, routing_map, probs)
            except (RuntimeError, NotImplementedError) as err:
                self._failed(err)
                return super().token_permutation(hidden_states, *original)
            self.hidden_shape = shape
            return out


def install(model) -> int:
    """Turn every allgather dispatcher of `model` (a module or a list of chunks) whose config allows
    it into a StaticAllGatherDispatcher. Returns how many were turned."""
    count = 0
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        for module in chunk.modules():
            dispatcher = getattr(module, "token_dispatcher", None)
            if type(dispatcher) is MoEAllGatherTokenDispatcher and applies(dispatcher):
                dispatcher.__class__ = StaticAllGatherDispatcher
                count += 1
    return count


def failed() -> Exception | None:
    """The error that turned the static permutation off in this process, if any."""
    return _STATE["failed"]
