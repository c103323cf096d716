"""The reward role's rule-verifier scorer: decode responses, run the verifiers, return (B,) scores.

It runs in a Ray actor on CPU (resource_pool.reward: [] means "verifiers only"), with
max_concurrency=1 so verifier calls happen on the actor's main thread, where rewards/ can stop a
runaway verifier with a signal timer (see rewards/timeouts.py). A reward model, when configured,
adds its (B,) scores to these with its own worker group.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.rewards import score_batch, validate_verifiers


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
