"""The GRPO loop: a single controller that holds no model and calls the role groups.

One step reads like the algorithm (DESIGN.md, "One GRPO step"):

    prompts -> sync weights -> generate n per prompt -> score (reference log-probs meanwhile)
    -> old log-probs (skipped when exactly on-policy) -> KL in reward? -> advantages -> update

The math is the pure functions of mindspeed_rl.algorithms; the roles are the protocols of
mindspeed_rl.workers.interfaces, so this file is tested with in-process fakes. Departures from
verl's fit(): old log-probs are not recomputed when the update is exactly on-policy (one
mini-batch, one epoch: the ratio is 1 by construction and the actor detaches its own log-probs),
and DAPO dynamic sampling keeps generating until the batch is full or max_num_gen_batches is hit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from mindspeed_rl import algorithms as alg
from mindspeed_rl.data import keys as K
from mindspeed_rl.data.batches import concat_rollouts
from mindspeed_rl.trainer.metrics import MetricsLogger, Timer, batch_metrics
from mindspeed_rl.workers.interfaces import ActorRollout, Batch, Pending, Reference, Reward


@dataclass
class GRPOSettings:
    """The knobs the loop itself reads (flat, from the Config by `settings_from_config`)."""

    train_iters: int
    n_samples_per_prompt: int
    adv_estimator: str = "group_norm"
    norm_adv_by_std: bool = True
    advantage_whiten: bool = False
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl_type: str = "fixed"
    kl_coef: float = 0.0
    target_kl: float = 0.1
    horizon: int = 10000
    use_kl_loss: bool = False
    on_policy: bool = True  # one epoch, one mini-batch: old log-probs == current log-probs
    dynamic_sampling: bool = False
    max_num_gen_batches: int = 4
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 1.0
    max_new_tokens: int = 0
    test_freq: int = 0
    save_interval: int = 0
    save_final: bool = True  # a checkpoint at the last step
    max_skipped_updates: int = 3  # stop after this many skipped (non-finite) updates in a row; 0 = never
    num_devices: int = 1


def settings_from_config(cfg, num_devices: int) -> GRPOSettings:
    a, alg_cfg = cfg.actor, cfg.algorithm
    mini_batches = cfg.run.global_batch_size // a.ppo.ppo_mini_batch_size
    return GRPOSettings(
        train_iters=cfg.run.train_iters, n_samples_per_prompt=a.rollout.n_samples_per_prompt,
        adv_estimator=alg_cfg.adv_estimator, norm_adv_by_std=alg_cfg.norm_adv_by_std,
        advantage_whiten=alg_cfg.advantage_whiten, use_kl_in_reward=alg_cfg.use_kl_in_reward,
        kl_penalty=alg_cfg.kl_penalty, kl_ctrl_type=alg_cfg.kl_ctrl.type, kl_coef=alg_cfg.kl_ctrl.kl_coef,
        target_kl=alg_cfg.kl_ctrl.target_kl, horizon=alg_cfg.kl_ctrl.horizon, use_kl_loss=a.ppo.use_kl_loss,
        on_policy=a.ppo.ppo_epochs == 1 and mini_batches == 1 and not alg_cfg.dynamic_sampling
        and not _renormalised_rollout_log_probs(a.rollout),
        dynamic_sampling=alg_cfg.dynamic_sampling, max_num_gen_batches=alg_cfg.max_num_gen_batches,
        overlong_buffer_len=alg_cfg.overlong_buffer_len, overlong_penalty_factor=alg_cfg.overlong_penalty_factor,
        max_new_tokens=a.rollout.max_new_tokens, test_freq=cfg.run.test_freq, save_interval=cfg.run.save_interval,
        save_final=cfg.run.save_final,
        max_skipped_updates=cfg.run.max_skipped_updates, num_devices=num_devices)


def _renormalised_rollout_log_probs(rollout) -> bool:
    """vLLM with top-k / top-p reports log-probs renormalised over the kept tokens, not the
    trainer's log_softmax(logits / T): then the old log-probs (and KL in reward) must come from the
    training forward, so the step is treated as not exactly on-policy."""
    return rollout.rollout_engine == "vllm" and rollout.do_sample and (rollout.top_p < 1.0 or rollout.top_k > 0)


class TrainingHalted(RuntimeError):
    """The run stopped itself because continuing would waste the cluster (e.g. every update skipped)."""


class GRPOTrainer:
    def __init__(self, settings: GRPOSettings, actor: ActorRollout, reference: Optional[Reference],
                 reward: Reward, train_batches: Iterator[Batch], logger: MetricsLogger,
                 val_batches: Optional[Callable[[], Iterator[Batch]]] = None,
                 save: Optional[Callable[[int, dict], None]] = None,
                 stop_requested: Callable[[], Optional[str]] = lambda: None):
        """
        Args:
            save: save(step, trainer_state) writes a checkpoint (None = never save).
            stop_requested: returns a reason (e.g. "SIGTERM") once the run should save and stop.
        """
        self.s = settings
        self.actor, self.reference, self.reward = actor, reference, reward
        self.train_batches, self.val_batches = train_batches, val_batches
        self.logger = logger
        self.step_idx = 0
        self.save, self.stop_requested = save, stop_requested
        self.stopped_by: Optional[str] = None
        self.skipped_in_a_row = 0
        self.kl_ctrl = alg.build_kl_controller(settings.kl_ctrl_type, settings.kl_coef,
                                               settings.target_kl, settings.horizon)
        self.needs_ref = reference is not None and (settings.use_kl_loss or
                                                    (settings.use_kl_in_reward and settings.kl_coef > 0))

    # ------------------------------------------------------------------ the loop
    def fit(self) -> list[dict]:
        """Run steps up to train_iters. Saves every save_interval steps, at the last step (save_final), and when
        stop_requested() says so (then returns early with self.stopped_by set)."""
        history = []
        while self.step_idx < self.s.train_iters:
            self.step_idx += 1
            metrics = self.step(next(self.train_batches))
            if self.s.test_freq and self.val_batches and self.step_idx % self.s.test_freq == 0:
                metrics.update(self.validate())
            self.skipped_in_a_row = self.skipped_in_a_row + 1 if metrics.get("actor/update_skipped", 0) > 0 else 0
            metrics["actor/skipped_in_a_row"] = float(self.skipped_in_a_row)
            self.logger.log(self.step_idx, metrics)
            history.append(metrics)
            self._halt_if_stuck()
            self.stopped_by = self.stop_requested()
            last = self.step_idx == self.s.train_iters
            if self.save and ((last and self.s.save_final) or self.stopped_by or
                              (self.s.save_interval and self.step_idx % self.s.save_interval == 0)):
                self.save(self.step_idx, self.state_dict())
            if self.stopped_by:
                break
        return history

    def _halt_if_stuck(self) -> None:
        """Actor updates skipped for a non-finite loss/grad norm, max_skipped_updates in a row: halt."""
        n = self.s.max_skipped_updates
        if n and self.skipped_in_a_row >= n:
            first = self.step_idx - n + 1
            raise TrainingHalted(
                f"the actor update was skipped at {n} steps in a row (steps {first}-{self.step_idx}) because the "
                f"loss or gradient norm was not finite; lower the learning rate or check the data and reward, then "
                f"resume from the last checkpoint with training.resume=auto (or raise training.max_skipped_updates).")

    def state_dict(self) -> dict:
        """What the loop needs to continue exactly (the data position is the caller's)."""
        return {"step": self.step_idx, "kl_coef": self.kl_ctrl.value, "skipped_in_a_row": self.skipped_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.step_idx = int(state["step"])
        self.kl_ctrl.value = float(state.get("kl_coef", self.kl_ctrl.value))
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))

    def step(self, prompts: Batch) -> dict[str, float]:
        timer = Timer()
        with timer("step"):
            batch, reward_metrics, ref_pending = self._rollout_and_score(prompts, timer)
            with timer("old_log_prob"):
                if not self.s.on_policy:
                    batch[K.OLD_LOG_PROBS] = self.actor.compute_log_prob(batch)
            with timer("ref"):
                if self.needs_ref:
                    pending = ref_pending or self.reference.compute_ref_log_prob_async(batch)
                    batch[K.REF_LOG_PROBS] = pending.get()
            with timer("adv"):
                adv_metrics = self._advantages(batch)
            with timer("update_actor"):
                update_stats = self.actor.update_actor(batch)
        metrics = batch_metrics(batch)
        metrics.update(reward_metrics)
        metrics.update(adv_metrics)
        metrics.update(update_stats)
        metrics.update(timer.metrics())
        metrics.update(outside_workers(metrics))
        tokens = float(batch[K.ATTENTION_MASK].sum())
        metrics["perf/throughput"] = tokens / max(timer.elapsed["step"], 1e-9) / self.s.num_devices
        return metrics

    # ------------------------------------------------------------------ pieces
    def _rollout_and_score(self, prompts: Batch, timer: Timer) -> tuple[Batch, dict, Optional[Pending]]:
        """Generate and score; with dynamic sampling, regenerate until enough groups vary.

        Returns the batch, reward metrics, and the reference log-probs being computed (started
        before scoring so the two overlap), or None when they are still to be asked for.
        """
        wanted = prompts[K.PROMPT_IDS].shape[0] * self.s.n_samples_per_prompt
        kept, reward_metrics, rounds = [], {}, 0
        while True:
            rounds += 1
            with timer("gen"):
                self.actor.sync_rollout_weights()
                batch = self.actor.generate_sequences(prompts, n=self.s.n_samples_per_prompt)
                batch[K.GROUP_INDEX] = batch[K.GROUP_INDEX] + rounds * 1_000_000  # distinct across rounds
            ref_pending = None
            if self.needs_ref and not self.s.dynamic_sampling:  # overlaps scoring: they are independent
                ref_pending = self.reference.compute_ref_log_prob_async(batch)
            with timer("reward"):
                scores, reward_metrics = self.reward.compute_scores(batch)
                if self.s.overlong_buffer_len:
                    lengths = batch[K.RESPONSE_MASK].sum(-1)
                    scores = scores + alg.overlong_penalty(lengths, self.s.max_new_tokens,
                                                           self.s.overlong_buffer_len, self.s.overlong_penalty_factor)
                batch[K.SCORES] = scores.float()
            if not self.s.dynamic_sampling:
                return batch, reward_metrics, ref_pending
            keep = alg.filter_groups(batch[K.SCORES], batch[K.GROUP_INDEX])
            kept.append(_select(batch, keep))
            total = sum(len(b[K.SCORES]) for b in kept)
            if total >= wanted or rounds >= self.s.max_num_gen_batches:
                merged = concat_rollouts(kept)
                if total > wanted:
                    merged = _select(merged, torch.arange(total) < wanted)
                reward_metrics["dapo/gen_rounds"] = float(rounds)
                reward_metrics["dapo/kept_fraction"] = min(total, wanted) / wanted
                return merged, reward_metrics, None
            prompts = next(self.train_batches)

    def _advantages(self, batch: Batch) -> dict[str, float]:
        mask = batch[K.RESPONSE_MASK]
        scores, metrics = batch[K.SCORES], {}
        if self.s.use_kl_in_reward and self.needs_ref:
            logp = batch.get(K.OLD_LOG_PROBS, batch[K.ROLLOUT_LOG_PROBS])
            scores, mean_kl = alg.kl_in_reward(scores, logp, batch[K.REF_LOG_PROBS], mask,
                                               self.kl_ctrl.value, self.s.kl_penalty)
            metrics["actor/reward_kl_penalty"] = float(mean_kl)
            metrics["actor/reward_kl_penalty_coeff"] = self.kl_ctrl.value
            self.kl_ctrl.update(float(mean_kl), n_steps=len(batch[K.SCORES]))
        options = {}
        if self.s.adv_estimator in ("group_norm", "grpo"):
            options = {"norm_adv_by_std": self.s.norm_adv_by_std, "advantage_whiten": self.s.advantage_whiten}
        adv, returns = alg.compute_advantages(self.s.adv_estimator, scores, batch[K.GROUP_INDEX], mask, **options)
        batch[K.ADVANTAGES], batch[K.RETURNS] = adv, returns
        valid = mask.bool()
        metrics["grpo/advantages/mean"] = float(adv[valid].mean()) if valid.any() else 0.0
        metrics["grpo/advantages/max"] = float(adv[valid].max()) if valid.any() else 0.0
        metrics["grpo/advantages/min"] = float(adv[valid].min()) if valid.any() else 0.0
        # rows that teach nothing through the policy loss (e.g. a group that scored all alike); without
        # a KL loss or entropy bonus the update does not run them (models/train_step.rows_to_run)
        metrics["grpo/zero_advantage_frac"] = float(((adv == 0) | ~valid).all(-1).float().mean())
        return metrics

    def validate(self) -> dict[str, float]:
        scores = []
        for prompts in self.val_batches():
            batch = self.actor.generate_sequences(prompts, n=1, greedy=True)
            s, _ = self.reward.compute_scores(batch)
            scores.append(s.float())
        if not scores:
            return {}
        return {"val/score/mean": float(torch.cat(scores).mean())}


def outside_workers(metrics: dict[str, float]) -> dict[str, float]:
    """timing/outside_workers: the step's wall time minus the work the workers timed themselves
    (timing/<phase>_worker, reported with the update's stats) and the driver's own scoring and
    advantages: what Ray calls, transfers and the driver's bookkeeping cost. A reference that
    reports no worker time (its own group, overlapped with scoring) counts with its wait. {} when
    no worker reported a time."""
    worker = {k: v for k, v in metrics.items() if k.startswith("timing/") and k.endswith("_worker")}
    if not worker:
        return {}
    inside = sum(worker.values()) + metrics.get("timing/reward", 0.0) + metrics.get("timing/adv", 0.0)
    if "timing/ref_worker" not in worker:
        inside += metrics.get("timing/ref", 0.0)
    return {"timing/outside_workers": metrics["timing/step"] - inside}


# ---------------------------------------------------------------------- batch helpers


def _select(batch: Batch, keep: torch.Tensor) -> Batch:
    """Rows of a batch where keep (B,) is True; tensors and lists alike."""
    idx = keep.nonzero().flatten().tolist()
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == keep.shape[0]:
            out[key] = value[keep]
        elif isinstance(value, list) and len(value) == keep.shape[0]:
            out[key] = [value[i] for i in idx]
        else:
            out[key] = value
    return out
