"""What the GRPO trainer needs from each role (NeMo-RL-style interfaces; no base classes).

The trainer (single controller, trainer/grpo.py) holds no model: it calls these methods on the
role groups, which fan the work out to their Ray workers (distributed/worker_group.py) and gather
the results. Batches are dicts keyed by mindspeed_rl/data/keys.py. Tests drive the trainer with
small in-process fakes of these protocols.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch

Batch = dict[str, Any]


class Pending(Protocol):
    """A result being computed (e.g. Ray object refs); get() waits with a timeout naming the work."""

    def get(self) -> Any: ...


class ActorRollout(Protocol):
    def sync_rollout_weights(self) -> None:
        """Push the training weights to the rollout engine (no-op when it shares the model)."""

    def generate_sequences(self, prompts: Batch, n: int, greedy: bool = False) -> Batch:
        """Sample n responses per prompt.

        Args:
            prompts: prompts (Bp, P) left-padded, prompt_mask, labels, source, ...
        Returns:
            B = Bp * n rows, the n samples of a prompt adjacent: input_ids (B, S), attention_mask,
            position_ids, responses (B, T), response_mask (B, T), rollout_log_probs (B, T),
            finish_reason list[str], group_index (B,), plus the prompt keys repeated n times.
        """

    def compute_log_prob(self, batch: Batch) -> torch.Tensor:
        """(B, T) log-probs of the responses under the current actor (at the rollout temperature)."""

    def update_actor(self, batch: Batch) -> dict[str, float]:
        """ppo_epochs x mini-batches of the clipped policy loss (+ KL loss, entropy bonus).

        batch carries advantages (B, T), old_log_probs (B, T) or none (exactly on-policy: the
        actor uses its own detached log-probs), ref_log_probs (B, T) when the KL loss is on.
        Returns mean stats: actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl, actor/kl_loss,
        actor/entropy, actor/grad_norm, actor/lr.
        """

    def save_checkpoint(self, path: str, step: int) -> None: ...


class Reference(Protocol):
    def compute_ref_log_prob_async(self, batch: Batch) -> Pending:
        """Start computing (B, T) reference log-probs; the trainer scores meanwhile."""


class Reward(Protocol):
    def compute_scores(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """(B,) sequence scores and reward metrics (e.g. verifier failures)."""
