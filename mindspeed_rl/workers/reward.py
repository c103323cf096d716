"""The reward role: rule verifiers and/or a reward model, one (B,) score per sequence.

    reward = Reward(rules=RuleRewardScorer(tok, ["gsm8k"], [1.0]), reward_model=rm_facade, reward_model_weight=1.0)
    scores, metrics = reward.compute_scores(batch)

score = sum_i verifier_weight[i] * verifier_i       (when `reward.verifier`)
      + reward_model_weight * rm_score               (when `resource_pool.reward`)
      - missing_eos_penalty                           (responses cut at the length limit)

The rule verifiers run in the driver's main thread, where rewards/ can stop a runaway verifier
with a signal timer (rewards/timeouts.py); the reward model's forward is started on its worker
group first, so the two overlap. Departure from MindSpeed-LLM's ray_gpt, which gave each sample
either the verifier's score or the reward model's (by a per-sample "categories" column, else the
verifier for all, so a reward model next to `verifier: true` never scored): here both are
weighted and added.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.rewards import preload_verifiers, score_batch, validate_verifiers


class RuleRewardScorer:
    """Scores a rollout batch with weighted rule verifiers.

    Args:
        tokenizer: decodes response ids (special tokens skipped).
        verifier_names / verifier_weights: algorithm.verifier_function / verifier_weight.
        missing_eos_penalty: subtracted from responses cut at the length limit.
        timeout_s: per-verifier-call limit; a call past it scores 0 and is counted.
    """

    def __init__(self, tokenizer, verifier_names: Sequence[str], verifier_weights: Optional[Sequence[float]] = None,
                 missing_eos_penalty: float = 0.0, timeout_s: float = 10.0):
        validate_verifiers(list(verifier_names), None if verifier_weights is None else list(verifier_weights))
        preload_verifiers(list(verifier_names))  # at start-up, not in the first step's reward time
        self.tokenizer = tokenizer
        self.names, self.weights = list(verifier_names), verifier_weights
        self.missing_eos_penalty, self.timeout_s = missing_eos_penalty, timeout_s

    def decode(self, batch: dict) -> list[str]:
        responses, mask = batch[K.RESPONSES], batch[K.RESPONSE_MASK].bool()
        return [self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(responses, mask)]

    def compute_scores(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """(B,) float32 scores and reward metrics (per-verifier means, failures, timeouts)."""
        texts = self.decode(batch)
        finished = None
        if K.FINISH_REASON in batch:
            finished = [r == "eos" for r in batch[K.FINISH_REASON]]
        scores, metrics = score_batch(texts, list(batch[K.LABELS]), self.names, self.weights, finished,
                                      self.missing_eos_penalty, self.timeout_s)
        return torch.tensor(scores, dtype=torch.float32), metrics


class RewardModelScores(Protocol):
    """The reward-model role as the reward needs it (trainer/roles.py RewardModelFacade)."""

    def compute_rm_score_async(self, batch: dict) -> Any:
        """Start scoring; the returned object's get() gives (B,) float scores (with a timeout)."""


def combine_scores(rule_scores: Optional[torch.Tensor], rm_scores: Optional[torch.Tensor],
                   reward_model_weight: float) -> torch.Tensor:
    """(B,) float32: rule_scores + reward_model_weight * rm_scores; either part may be None (not both)."""
    if rule_scores is None and rm_scores is None:
        raise ValueError("combine_scores needs rule scores, reward-model scores or both")
    out = torch.zeros_like((rule_scores if rule_scores is not None else rm_scores), dtype=torch.float32)
    if rule_scores is not None:
        out = out + rule_scores.float()
    if rm_scores is not None:
        if rule_scores is not None and rm_scores.shape != rule_scores.shape:
            raise ValueError(f"reward model gave scores of shape {tuple(rm_scores.shape)} for "
                             f"{tuple(rule_scores.shape)} rule scores")
        out = out + reward_model_weight * rm_scores.float()
    return out


class Reward:
    """Rule verifiers (in this thread) and a reward model (on its group), combined per sequence.

    Args:
        rules: the verifier scorer, or None when `reward.verifier` is false.
        reward_model: the reward-model role, or None when `resource_pool.reward` is empty.
        reward_model_weight: algorithm.reward_model_weight.
        missing_eos_penalty: algorithm.missing_eos_penalty; the rule scorer applies it itself, so
            it is applied here only when there are no rules.
    """

    def __init__(self, rules: Optional[RuleRewardScorer], reward_model: Optional[RewardModelScores] = None,
                 reward_model_weight: float = 1.0, missing_eos_penalty: float = 0.0):
        if rules is None and reward_model is None:
            raise ValueError("a Reward needs rule verifiers, a reward model or both")
        self.rules, self.reward_model, self.reward_model_weight = rules, reward_model, reward_model_weight
        self.missing_eos_penalty = missing_eos_penalty

    def compute_scores(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        """(B,) float32 scores and metrics: the verifiers' (reward/<name>/...) and, with a reward
        model, reward/rm_score/mean, /max, /min of its raw scores."""
        pending = self.reward_model.compute_rm_score_async(batch) if self.reward_model is not None else None
        rule_scores, metrics = (None, {}) if self.rules is None else self.rules.compute_scores(batch)
        rm_scores = None
        if pending is not None:
            rm_scores = pending.get().float()  # (B,)
            metrics = dict(metrics)
            metrics["reward/rm_score/mean"] = float(rm_scores.mean())
            metrics["reward/rm_score/max"] = float(rm_scores.max())
            metrics["reward/rm_score/min"] = float(rm_scores.min())
        scores = combine_scores(rule_scores, rm_scores, self.reward_model_weight)
        if self.rules is None and K.FINISH_REASON in batch:
            cut = torch.tensor([r != "eos" for r in batch[K.FINISH_REASON]])
            scores = scores - self.missing_eos_penalty * cut.float()
            metrics["reward/missing_eos"] = float(cut.sum())
        return scores, metrics
