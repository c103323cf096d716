"""Per-token KL estimators between the policy and the reference model, and KL folded into the reward.

With x = log pi(a) - log pi_ref(a) for the sampled token a (J. Schulman, "Approximating KL
divergence", 2020, http://joschu.net/blog/kl-approx.html):
    k1 / kl          x                              unbiased, high variance, can be negative
    abs              |x|
    k2 / mse         0.5 * x^2
    k3 / low_var_kl  exp(-x) + x - 1                unbiased, >= 0, low variance (GRPO's KL loss)
k3 clamps -x to [-20, 20] before exp and the result to [-10, 10], as verl does, so that one
token with a wild ratio cannot dominate the loss.

Where other systems differ: TRL computes k3 without either clamp; OpenRLHF clamps every
estimator's output (k1 and k2 included) to [-10, 10] but not k3's input. verl's straight-through
variants ("k3+": k3's value with k2's gradient) are not provided.
"""

from collections.abc import Callable

import torch

from mindspeed_rl.algorithms.advantages import token_level_scores
from mindspeed_rl.algorithms.masked import masked_mean

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: large enough to be harmless, small enough not to overflow
K3_CLAMP = 10.0


def _k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return log_prob - ref_log_prob


def _abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - ref_log_prob).abs()


def _k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_prob - ref_log_prob).square()


def _k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    x = torch.clamp(ref_log_prob - log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(x) - x - 1, -K3_CLAMP, K3_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "kl": _k1,
    "abs": _abs,
    "k2": _k2,
    "mse": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
}


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the log-probs of the sampled tokens.

    Args:
        log_prob: (B, T) log pi(a_t) under the policy.
        ref_log_prob: (B, T) log pi_ref(a_t) under the reference model.
        kind: a key of KL_ESTIMATORS: k1/kl, abs, k2/mse, k3/low_var_kl (formulas in the module
            docstring).

    Returns:
        (B, T) estimates, differentiable with respect to `log_prob`; padding is not masked here.

    Raises:
        ValueError: unknown kind.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL penalty {kind!r}; valid: {', '.join(sorted(KL_ESTIMATORS))}")
    return KL_ESTIMATORS[kind](log_prob, ref_log_prob)


def kl_in_reward(
    scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    kind: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level rewards with the KL penalty folded in: r_t = score_t - beta * kl_t (PPO-style).

    Args:
        scores: (B,) sequence scores, placed on the last response token, or (B, T) token-level scores.
        log_prob: (B, T) log-probs of the policy that sampled (old_log_probs).
        ref_log_prob: (B, T) reference log-probs.
        response_mask: (B, T).
        beta: KL coefficient (a KL controller's `value`).
        kind: KL estimator, see `kl_penalty`.

    Returns:
        (rewards, mean_kl): rewards (B, T), 0 on padding; mean_kl a 0-dim tensor, the per-sequence
        token-mean KL averaged over the batch, which is what `AdaptiveKLController.update` expects.
    """
    mask = response_mask.to(log_prob.dtype)
    kl = kl_penalty(log_prob, ref_log_prob, kind) * mask  # (B, T)
    token_scores = scores.to(log_prob.dtype) if scores.dim() == 2 else token_level_scores(scores, response_mask)
    rewards = (token_scores - beta * kl) * mask
    mean_kl = masked_mean(kl, mask, dim=-1).mean()
    return rewards, mean_kl
