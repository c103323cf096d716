"""The role groups behind the trainer's protocols (workers/interfaces.py): spawn them, wrap them.

    build_roles(cfg, plan, pools, settings) -> Roles(actor, reference, groups)

Each facade turns a protocol call into worker-group calls (distributed/worker_group.py) on the DP
shards of a batch, so the trainer never sees Ray. Rule verifiers run in the driver process's main
thread (their signal-based timeout needs it), see workers/reward.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from mindspeed_rl.data import keys as K


class _ShardedRole:
    """Calls a worker group method on the DP shards of a batch and gathers the outputs."""

    def __init__(self, group, layout):
        self.group, self.layout = group, layout

    def sharded(self, method, batch, *args):
        return self.group.run_sharded(method, batch, *args, layout=self.layout)


class ActorFacade(_ShardedRole):
    def sync_rollout_weights(self) -> None:
        """Colocated: the engine shares the training model, so there is nothing to move."""

    def generate_sequences(self, prompts, n, greedy=False):
        return self.sharded("generate_sequences", prompts, n, greedy)

    def compute_log_prob(self, batch):
        return self.sharded("compute_log_prob", model_inputs(batch))

    def update_actor(self, batch):
        keys = (K.PROMPT_IDS, K.INPUT_IDS, K.ATTENTION_MASK, K.RESPONSE_MASK, K.ADVANTAGES, K.OLD_LOG_PROBS,
                K.REF_LOG_PROBS)
        per_rank = self.sharded("update_actor", {k: batch[k] for k in keys if k in batch})
        return {k: sum(v) / len(v) for k, v in per_rank.items()}  # each key: one value per DP group

    def save_checkpoint(self, path, step, trainer_state=None, keep_last_n=0, config_hash=""):
        return self.group.run_all("save_checkpoint", path, step, trainer_state, keep_last_n, config_hash)[0]

    def load_checkpoint(self, path):
        return self.group.run_all("load_checkpoint", path)[0]

    def save_hf(self, path):
        return self.group.run_all("save_hf", path)[0]


class ReferenceFacade(_ShardedRole):
    def compute_ref_log_prob_async(self, batch):
        pending = self.group.run_sharded_async("compute_ref_log_prob", model_inputs(batch), layout=self.layout)
        return _Get(pending)


class _Get:
    def __init__(self, pending):
        self.pending = pending

    def get(self):
        return self.pending.result()


def model_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in (K.PROMPT_IDS, K.INPUT_IDS, K.ATTENTION_MASK, K.RESPONSES, K.RESPONSE_MASK)}


@dataclass
class Roles:
    actor: ActorFacade
    reference: Optional[ReferenceFacade]
    groups: list = field(default_factory=list)  # every WorkerGroup spawned, for shutdown
    world_size: int = 1  # devices of the actor (perf/throughput is per device)


def build_roles(cfg, plan, pools, needs_reference: bool, groups: list) -> Roles:
    """Spawn the role groups on their pools. Appends each group to `groups` as soon as it exists,
    so the caller can shut down what was spawned when a later role fails."""
    from mindspeed_rl.distributed.worker_group import DPLayout, WorkerGroup
    from mindspeed_rl.workers.actor import ActorRolloutWorker, ReferenceWorker

    placement = {p.role: p for p in plan}
    actor_group = WorkerGroup("actor_rollout", ActorRolloutWorker, pools["actor_rollout"],
                              placement["actor_rollout"], args=(cfg,))
    groups.append(actor_group)
    actor = ActorFacade(actor_group, DPLayout.from_rank_info(actor_group.run_all("rank_info")))
    reference = None
    if needs_reference:
        ref_group = WorkerGroup("ref", ReferenceWorker, pools["ref"], placement["ref"], args=(cfg,))
        groups.append(ref_group)
        reference = ReferenceFacade(ref_group, DPLayout.from_rank_info(ref_group.run_all("rank_info")))
    return Roles(actor, reference, groups, actor_group.world_size)


def needs_reference(settings: Any) -> bool:
    return bool(settings.use_kl_loss or (settings.use_kl_in_reward and settings.kl_coef > 0))
