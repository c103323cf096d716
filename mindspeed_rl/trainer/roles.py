"""The role groups behind the trainer's protocols (workers/interfaces.py): spawn them, wrap them.

    build_roles(cfg, plan, pools, needs_reference, groups) -> Roles(actor, reference, reward_model, groups)

Each facade turns a protocol call into worker-group calls (distributed/worker_group.py) on the DP
shards of a batch, so the trainer never sees Ray. Rule verifiers run in the driver process's main
thread (their signal-based timeout needs it), see workers/reward.py.

ray_gpt's train/infer split (num_gpus_for_infer > 0): the actor pool's ranks are two groups, the
training ranks (ActorRolloutWorker) and the generation ranks (workers/rollout.py RolloutWorker).
generate_sequences goes to the generation group, compute_log_prob / update_actor to the training
group; after every update the generation weights are stale and the next sync_rollout_weights (or
generate_sequences, e.g. validation right after an update) moves them through the Ray object
store. The sync's wall time is reported with the next update's stats as `timing/sync_weights`.

The vLLM engine (`rollout_engine: vllm`) holds its own copy of the weights, colocated in each
training rank or on the generation ranks of the split: after every update the next sync streams
the weights into it (`rollout/sync_peak_bytes`: the largest chunk held at once), and then checks
it (`verify_sync`; the first sync and every `sync_check_interval`-th): the engine generates on a
fixed probe, the training ranks score the same tokens, and a difference above the tolerance stops
the run with a sentence naming the step and the largest difference (rollout/sync_check.py; metrics
rollout/logp_diff_max / _mean). Frozen parameters (freeze_parameters) go to such an engine once: later syncs leave
out what it keeps (ActorFacade._leave_frozen_out; `rollout/sync_tensors`: tensors loaded by the busiest rank).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.data.batches import concat_rollouts


class _ShardedRole:
    """Calls a worker group method on the DP shards of a batch and gathers the outputs."""

    def __init__(self, group, layout):
        self.group, self.layout = group, layout

    def sharded(self, method, batch, *args, combine=None):
        """combine: joins the DP ranks' outputs (default: concatenated as they are)."""
        return self.group.run_sharded(method, batch, *args, layout=self.layout, combine=combine)


class ActorFacade(_ShardedRole):
    """The actor role; `rollout` is the generation group of the train/infer split, else None
    (colocated: the training ranks generate with their own model)."""

    def __init__(self, group, layout, rollout: Optional["RolloutFacade"] = None, colocated_copy: bool = False,
                 verify_sync: bool = False, sync_tolerance: float = 1e-4, sync_check_interval: int = 1,
                 moe: bool = False, frozen: bool = False):
        """
        Args:
            colocated_copy: the training ranks generate with an engine holding its own weights (vLLM):
                sync them after every update.
            verify_sync: check syncs with the probe (rollout/sync_check.py), at sync_tolerance: the first
                sync, then every sync_check_interval-th (1: every sync; 0: none).
            moe: the actor is an MoE model (the check allows near-tie routing: rollout/sync_check.py).
            frozen: the actor has frozen parameters (freeze_parameters): after the first sync, the frozen tensors
                every engine can do without are left out of later syncs (_leave_frozen_out).
        """
        super().__init__(group, layout)
        self.rollout = rollout
        self.colocated_copy = colocated_copy and rollout is None
        self.stale = self.colocated_copy  # the engine starts with dummy weights
        self.verify_sync, self.sync_tolerance, self.moe, self.frozen = verify_sync, sync_tolerance, moe, frozen
        self.sync_check_interval = int(sync_check_interval)  # 0: never
        self.syncs = 0  # weight syncs done by this facade (the check runs on the 1st, 1+k-th, 1+2k-th, ...)
        self.send_rollout_log_probs = False  # TIS on: the update weighs tokens by old / rollout probability
        self.ref_with_generation = False  # the actor workers hold the reference: ref log-probs come with the batch
        self.updates = 0  # update_actor calls (or the step resumed from): the next step is updates + 1
        self._pending_metrics: dict[str, float] = {}  # reported with the next update_actor's stats

    def sync_rollout_weights(self) -> None:
        """Split: send the training weights to the generation ranks if an update changed them.
        Colocated vLLM: stream them into each rank's engine. Colocated native: the engine shares
        the training model, so there is nothing to move. Then verify the sync when asked to."""
        if self.rollout is not None and self.rollout.stale:
            seconds = self.rollout.sync_from(self.group, with_stats=self.verify_sync)
            self._add_sync_metrics(seconds, self.rollout.last_sync_stats)
            target = self.rollout
        elif self.colocated_copy and self.stale:
            start = time.perf_counter()
            per_rank = self.group.run_all("sync_rollout_weights")
            self.stale = False
            self._add_sync_metrics(time.perf_counter() - start, per_rank)
            worker_s = [r["timing/sync_weights"] for r in per_rank or [] if isinstance(r, dict) and r]
            if worker_s:  # the slowest rank's own time; the rest of the driver's time is Ray
                self._pending_metrics["timing/sync_weights_worker"] = (
                    self._pending_metrics.get("timing/sync_weights_worker", 0.0) + max(worker_s))
            target = self
        else:
            return
        self.syncs += 1
        k = self.sync_check_interval
        if self.verify_sync and k > 0 and (self.syncs - 1) % k == 0:
            start = time.perf_counter()
            self._verify(target)
            # what the check costs (probe generation + training forward + Ray round trips)
            self._pending_metrics["timing/sync_check"] = (self._pending_metrics.get("timing/sync_check", 0.0)
                                                          + time.perf_counter() - start)
        if self.frozen and self.syncs == 1:
            self._leave_frozen_out(target)

    def _leave_frozen_out(self, target: "_ShardedRole") -> None:
        """After the first (full, checked) sync: the frozen HF tensors that every engine of `target` can do without
        (whole vLLM layers; any for the native engine) are neither gathered nor sent again. One set for every
        rank: the training ranks' gathers are collectives."""
        frozen = set().union(*[set(n) for n in self.group.run_all("frozen_hf_names")])
        per_rank = target.group.run_all("skippable_weights", frozen) if frozen else []
        skip = set.intersection(*[set(s) for s in per_rank]) if per_rank else set()
        self.group.run_all("set_rollout_skip", skip)
        if target is not self:
            target.group.run_all("set_rollout_skip", skip)
        print(f"weight sync: {len(skip)} of the {len(frozen)} frozen tensors are left out of later syncs (the engines "
              f"keep them)", flush=True)  # (the driver's console, as its other lines)

    def _add_sync_metrics(self, seconds: float, per_rank: list) -> None:
        self._pending_metrics["timing/sync_weights"] = self._pending_metrics.get("timing/sync_weights", 0.0) + seconds
        for key in ("rollout/sync_peak_bytes", "rollout/sync_tensors"):  # the busiest rank's
            values = [r[key] for r in per_rank or [] if isinstance(r, dict) and key in r]
            if values:
                self._pending_metrics[key] = max(values + [self._pending_metrics.get(key, 0.0)])

    def _verify(self, target: "_ShardedRole") -> None:
        """Every engine of `target` generates on the probe; the training ranks score those tokens."""
        from mindspeed_rl.rollout.sync_check import check_sync

        probes = target.group.run_all("generate_probe")
        batch = {k: torch.cat([p[k] for p in probes]) for k in (K.PROMPT_IDS, K.PROMPT_MASK, K.INPUT_IDS,
                                                                   K.ATTENTION_MASK, K.RESPONSES, K.RESPONSE_MASK,
                                                                   K.ROLLOUT_LOG_PROBS)}
        rows = len(batch[K.PROMPT_IDS])
        logp = self.sharded("compute_log_prob", model_inputs(_pad_rows(batch, self.layout.dp_size)))[:rows]
        where = "the generation ranks' engines" if target is not self else "the actor ranks' rollout engines"
        self._pending_metrics.update(check_sync(logp, batch[K.ROLLOUT_LOG_PROBS], batch[K.RESPONSE_MASK],
                                                self.sync_tolerance, self.updates + 1, where, moe=self.moe))

    def generate_sequences(self, prompts, n, greedy=False):
        role = self
        if self.rollout is not None or self.colocated_copy:
            self.sync_rollout_weights()
        if self.rollout is not None:
            role = self.rollout
        # a last validation batch may not split over the DP ranks: pad with copies of its last
        # prompt, then drop what they generated
        rows = len(prompts[K.PROMPT_IDS])
        padded = _pad_rows(prompts, role.layout.dp_size)
        # the reference held by the actor workers scores the samples in the same call (training only)
        extra = (True,) if self.ref_with_generation and not greedy and role is self else ()
        # each DP rank pads to its own longest prompt and response: join them at the widest
        out = role.sharded("generate_sequences", padded, n, greedy, *extra, combine=concat_rollouts)
        return out if padded is prompts else _take_rows(out, rows * n)

    def compute_log_prob(self, batch):
        inputs = model_inputs(batch)
        if K.ROUTED_EXPERTS in batch:  # MoE routing replay: the rollout's experts go with the tokens
            inputs[K.ROUTED_EXPERTS] = batch[K.ROUTED_EXPERTS]
        logp = self.sharded("compute_log_prob", inputs)
        if K.ROLLOUT_LOG_PROBS in batch:  # the sampler's log-probs vs the trainer's, same weights
            self._pending_metrics.update(logp_diff_metrics(logp, batch[K.ROLLOUT_LOG_PROBS], batch[K.RESPONSE_MASK]))
        return logp

    def update_actor(self, batch):
        keys = (K.PROMPT_IDS, K.INPUT_IDS, K.ATTENTION_MASK, K.RESPONSE_MASK, K.ADVANTAGES, K.OLD_LOG_PROBS,
                K.REF_LOG_PROBS, K.ROUTED_EXPERTS) + ((K.ROLLOUT_LOG_PROBS,) if self.send_rollout_log_probs else ())
        per_rank = self.sharded("update_actor", {k: batch[k] for k in keys if k in batch})
        self.updates += 1
        self.stale = self.colocated_copy
        if self.rollout is not None:
            self.rollout.stale = True
        stats = {k: sum(v) / len(v) for k, v in per_rank.items()}  # each key: one value per DP group
        stats.update(self._pending_metrics)
        self._pending_metrics = {}
        return stats

    def save_checkpoint(self, path, step, trainer_state=None, keep_last_n=0, config_hash=""):
        state = dict(trainer_state or {})
        if self.rollout is not None:  # the generation ranks' call counter seeds their sampling: resume needs it
            state["rollout"] = self.rollout.sampling_state()
        return self.group.run_all("save_checkpoint", path, step, state, keep_last_n, config_hash)[0]

    def load_checkpoint(self, path):
        if self.rollout is not None:
            self.rollout.stale = True
        self.stale = self.colocated_copy
        out = self.group.run_all("load_checkpoint", path)[0]
        self.updates = int(out.get("step", self.updates)) if isinstance(out, dict) else self.updates
        if self.rollout is not None:
            from mindspeed_rl.models.checkpoint import read_trainer_state

            saved = read_trainer_state(path).get("rollout")
            if saved:  # checkpoints from before the counter was saved resume with a fresh one
                self.rollout.load_sampling_state(saved)
        return out

    def save_hf(self, path):
        return self.group.run_all("save_hf", path)[0]


class ReferenceFacade(_ShardedRole):
    def compute_ref_log_prob_async(self, batch):
        pending = self.group.run_sharded_async("compute_ref_log_prob", model_inputs(batch), layout=self.layout)
        return _Get(pending)


class ActorReferenceFacade(_ShardedRole):
    """The reference held inside the actor workers (workers/actor.py reference_in_actor). Its
    log-probs normally arrive with the generated batch (ActorFacade.ref_with_generation); a batch
    without them (DAPO's merged batch) is sent to the actor group's compute_ref_log_prob."""

    def compute_ref_log_prob_async(self, batch):
        if K.REF_LOG_PROBS in batch:
            return _Ready(batch[K.REF_LOG_PROBS])
        return _Get(self.group.run_sharded_async("compute_ref_log_prob", model_inputs(batch), layout=self.layout))


class RolloutFacade(_ShardedRole):
    """The generation-only group of the train/infer split, and the weight hand-over to it."""

    def __init__(self, group, layout, sync_timeout_s: float = 1800.0):
        super().__init__(group, layout)
        self.sync_timeout_s = sync_timeout_s
        self.stale = True  # the generation ranks start with no weights
        self.last_sync_s = 0.0
        self.last_sync_stats: list = []

    def sampling_state(self) -> dict:
        """The generation ranks' sampling counter (the same on every rank: each call reaches them all)."""
        states = self.group.run_all("sampling_state")
        if any(s != states[0] for s in states):
            raise RuntimeError(f"generation ranks disagree on their sampling state: {states}")
        return states[0]

    def load_sampling_state(self, state: dict) -> None:
        self.group.run_all("load_sampling_state", state)

    def sync_from(self, train_group, with_stats: bool = False) -> float:
        """Training ranks put their HF-named weights in the object store; every generation rank
        loads them. Returns the wall time in seconds (with_stats: last_sync_stats per rank)."""
        start = time.perf_counter()
        per_rank = train_group.run_all("export_weights_for_rollout", timeout_s=self.sync_timeout_s)
        refs = [ref for rank_refs in per_rank for ref in rank_refs]  # stage by stage, in rank order
        if with_stats:
            self.last_sync_stats = self.group.run_all("update_weights", refs, self.sync_timeout_s, True,
                                                      timeout_s=self.sync_timeout_s)
        else:
            self.group.run_all("update_weights", refs, self.sync_timeout_s, timeout_s=self.sync_timeout_s)
        del refs, per_rank  # the object store frees the buckets once no reference is left
        self.stale = False
        self.last_sync_s = time.perf_counter() - start
        return self.last_sync_s


class RewardModelFacade(_ShardedRole):
    def compute_rm_score_async(self, batch):
        inputs = {k: batch[k] for k in (K.INPUT_IDS, K.ATTENTION_MASK)}
        return _Get(self.group.run_sharded_async("compute_rm_score", inputs, layout=self.layout))


def _pad_rows(batch: dict, multiple: int) -> dict:
    """batch with its last row repeated until the row count is a multiple (batch itself if it is)."""
    rows = len(batch[K.PROMPT_IDS])
    extra = -rows % multiple
    if not extra:
        return batch
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and len(value) == rows:
            out[key] = torch.cat([value, value[-1:].expand(extra, *value.shape[1:])])
        elif isinstance(value, list) and len(value) == rows:
            out[key] = value + value[-1:] * extra
        else:
            out[key] = value
    return out


def _take_rows(batch: dict, rows: int) -> dict:
    return {k: v[:rows] if isinstance(v, (torch.Tensor, list)) and len(v) >= rows else v for k, v in batch.items()}


def logp_diff_metrics(train_logp, rollout_logp, mask) -> dict[str, float]:
    """|trainer log-prob - sampler log-prob| over response tokens: max and mean (B, T inputs).
    Near 0 (numerics only) when the generating weights are the training weights."""
    valid = mask.bool()
    if not valid.any():
        return {}
    diff = (train_logp.float() - rollout_logp.float()).abs()[valid]
    return {"rollout/logp_diff_max": float(diff.max()), "rollout/logp_diff_mean": float(diff.mean())}


class _Get:
    def __init__(self, pending):
        self.pending = pending

    def get(self):
        return self.pending.result()


class _Ready:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def model_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in (K.PROMPT_IDS, K.INPUT_IDS, K.ATTENTION_MASK, K.RESPONSES, K.RESPONSE_MASK)}


@dataclass
class Roles:
    actor: ActorFacade
    reference: Optional[Any]  # ReferenceFacade, or ActorReferenceFacade when the actor holds it
    groups: list = field(default_factory=list)  # every WorkerGroup spawned, for shutdown
    world_size: int = 1  # devices of the actor (perf/throughput is per device)
    reward_model: Optional[RewardModelFacade] = None  # resource_pool.reward non-empty


def build_roles(cfg, plan, pools, needs_reference: bool, groups: list) -> Roles:
    """Spawn the role groups on their pools. Appends each group to `groups` as soon as it exists,
    so the caller can shut down what was spawned when a later role fails."""
    from mindspeed_rl.distributed.worker_group import DPLayout, WorkerGroup
    from mindspeed_rl.trainer.oom_advice import device_oom_advice
    from mindspeed_rl.workers.actor import ActorRolloutWorker, ReferenceWorker, reference_in_actor

    def spawn(role, cls, pool, where, *extra):
        group = WorkerGroup(role, cls, pool, where, args=(cfg, *extra), ready_timeout_s=cfg.run.worker_start_timeout_s,
                            call_timeout_s=cfg.run.worker_timeout_s,
                            oom_advice=functools.partial(device_oom_advice, cfg, role))
        groups.append(group)
        return group, DPLayout.from_rank_info(group.run_all("rank_info"))

    placement = {p.role: p for p in plan}
    actor_place = placement["actor_rollout"]
    rollout = None
    vllm = cfg.actor.rollout.rollout_engine == "vllm"
    if any(r.job == "generate" for r in actor_place.ranks):  # ray_gpt's train/infer split
        from mindspeed_rl.workers.rollout import RolloutWorker, generation_tp
        rollout = RolloutFacade(*spawn("rollout", RolloutWorker, pools["actor_rollout"],
                                       job_placement(actor_place, "generate", generation_tp(cfg))),
                                sync_timeout_s=cfg.run.worker_timeout_s)
        actor_place = job_placement(actor_place, "train")
    from mindspeed_rl.rollout.sync_check import tolerance
    ref_in_actor = needs_reference and reference_in_actor(cfg)
    actor = ActorFacade(*spawn("actor_rollout", ActorRolloutWorker, pools["actor_rollout"], actor_place, ref_in_actor),
                        rollout=rollout, colocated_copy=vllm, verify_sync=vllm,
                        sync_tolerance=tolerance(cfg.actor.params_dtype, cfg.actor.rollout.sync_check_tolerance),
                        sync_check_interval=cfg.actor.rollout.sync_check_interval,
                        moe=int(cfg.actor.arch.num_experts or 0) > 1, frozen=bool(cfg.actor.optim.freeze_parameters))
    actor.send_rollout_log_probs = cfg.actor.ppo.tis_mode != "off"
    reference = None
    if ref_in_actor:  # one process per device holds both models: no reference group to spawn
        actor.ref_with_generation = not cfg.algorithm.dynamic_sampling  # DAPO scores the merged batch later
        reference = ActorReferenceFacade(actor.group, actor.layout)
    elif needs_reference:
        reference = ReferenceFacade(*spawn("ref", ReferenceWorker, pools["ref"], placement["ref"]))
    reward_model = None
    if "reward" in placement:
        from mindspeed_rl.workers.reward_model import RewardModelWorker
        reward_model = RewardModelFacade(*spawn("reward", RewardModelWorker, pools["reward"], placement["reward"]))
    return Roles(actor, reference, groups, placement["actor_rollout"].world_size, reward_model)


def job_placement(placement, job: str, generation_tp: Optional[int] = None):
    """The ranks of `placement` doing `job` ("train" or "generate"), renumbered 0..n-1 on the same
    devices (bundles): one worker group, and one torch.distributed world, per side of the split.
    Generation ranks use generation_tp (default the actor's TP) and no pipeline (workers/rollout.py)."""
    ranks = [replace(r, rank=i) for i, r in enumerate(r for r in placement.ranks if r.job == job)]
    if job == "generate":
        tp = generation_tp or placement.tp
        return replace(placement, ranks=ranks, tp=tp, pp=1, dp=max(1, len(ranks) // tp))
    return replace(placement, ranks=ranks)


def needs_reference(settings: Any) -> bool:
    return bool(settings.use_kl_loss or (settings.use_kl_in_reward and settings.kl_coef > 0))
