"""Per-step MoE router metrics: expert load and the load-balancing (aux) loss, from forward hooks.

    with ExpertLoadMeter(model) as meter:      # no-op for a dense model
        ... training forwards ...
    stats = meter.stats()                      # {"moe/aux_loss": ..., "moe/expert_tokens_min": ...}

Why hooks and not megatron's aux-loss tracker: the tracker only records when the aux loss is part of
the objective (moe_aux_loss_coeff > 0) and its API differs between megatron-core 0.12 and 0.16; RL
runs often train with the coefficient at 0 and still want to see routing collapse. The hook reads
each router's input (tokens, h) and output routing map (tokens, E) and computes, per layer call,
megatron's switch load-balancing loss  E / (k T^2) * sum_e (sum_t p_te) * n_e  (1.0 when balanced;
p = softmax over all experts, n_e = tokens routed to e, T tokens, top-k). Token counts are summed
over the data-parallel ranks (and the TP ranks' sequence shards under sequence parallelism).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _routers(model) -> list[torch.nn.Module]:
    """The routers of a model, or of every chunk of a virtual-pipeline chunk list."""
    from megatron.core.transformer.moe.router import TopKRouter

    from mindspeed_rl.models.chunks import as_chunks, unwrap

    return [m for chunk in as_chunks(model) for m in unwrap(chunk).modules() if isinstance(m, TopKRouter)]


class ExpertLoadMeter:
    """Accumulates tokens per expert (per MoE layer of this rank's chunks) and the aux loss while entered."""

    def __init__(self, model):
        self.routers = _routers(model)
        self.counts: dict[int, torch.Tensor] = {}  # layer index in this chunk -> (E,) tokens
        self.aux: list[torch.Tensor] = []
        self._handles = []

    def __enter__(self) -> "ExpertLoadMeter":
        for i, router in enumerate(self.routers):
            self._handles.append(router.register_forward_hook(self._hook(i, router)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, layer: int, router: torch.nn.Module):
        def hook(module, inputs, output):
            with torch.no_grad():
                hidden = inputs[0].reshape(-1, inputs[0].shape[-1])  # (T, h)
                routing_map = output[1]  # (T, E) bool
                counts = routing_map.reshape(hidden.shape[0], -1).sum(0).float()  # (E,)
                scores = torch.softmax(F.linear(hidden.float(), router.weight.float()), dim=-1)  # (T, E)
                T, E, k = hidden.shape[0], scores.shape[1], router.topk
                if T:
                    self.aux.append(E / (k * T * T) * (scores.sum(0) * counts).sum())
                self.counts[layer] = self.counts.get(layer, 0) + counts
        return hook

    def stats(self) -> dict[str, float]:
        """{} for a dense model; else moe/aux_loss (mean over layers and forwards, this rank's tokens),
        moe/expert_tokens_min / _max (over layers and experts, tokens of the step over DP ranks)."""
        if not self.routers or not self.counts:
            return {}
        from megatron.core import parallel_state as ps

        counts = torch.stack([self.counts[i] for i in sorted(self.counts)])  # (layers, E)
        torch.distributed.all_reduce(counts, group=ps.get_data_parallel_group())
        if getattr(self.routers[0].config, "sequence_parallel", False):
            torch.distributed.all_reduce(counts, group=ps.get_tensor_model_parallel_group())
        aux = torch.stack(self.aux).mean() if self.aux else torch.zeros(())
        return {"moe/aux_loss": float(aux), "moe/expert_tokens_min": float(counts.min()),
                "moe/expert_tokens_max": float(counts.max())}
