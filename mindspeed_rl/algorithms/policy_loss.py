"""The clipped surrogate policy loss of PPO / GRPO / DAPO, with optional dual clip.

Per token, with r = pi / pi_old and A the advantage (PPO, arXiv:1707.06347):
    r      = exp(clamp(log_prob - old_log_prob, -20, 20))
    L_clip = max(-A * r, -A * clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
DAPO's "clip-higher" (arXiv:2503.14476) is clip_ratio_high > clip_ratio_low. Dual clip
(arXiv:1912.09729) bounds the loss of negative-advantage tokens whose ratio exploded:
    L = min(L_clip, -A * c)   where A < 0,   c = clip_ratio_c > 1
The loss is then reduced by `aggregate_loss`. Formulas and statistics are verl's
compute_policy_loss_vanilla.

Departures: verl always applies dual clip (c = 3 by default); here it is off unless
clip_ratio_c is given, matching the seed (ray_gpt) and TRL. TRL and the seed do not clamp the
log-ratio before exp.
"""

import torch

from mindspeed_rl.algorithms.aggregation import aggregate_loss
from mindspeed_rl.algorithms.masked import masked_mean

LOG_RATIO_CLAMP = 20.0  # exp(+-20) keeps the ratio finite in float32 even for wild log-probs


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    loss_denominator: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss (to minimise) and its clipping statistics.

    Args:
        log_prob: (B, T) log-probs of the sampled tokens under the policy being trained.
        old_log_prob: (B, T) log-probs under the policy that sampled them.
        advantages: (B, T).
        response_mask: (B, T) 1 on tokens that count.
        clip_ratio_low: epsilon below 1 (ratio floor 1 - low).
        clip_ratio_high: epsilon above 1 (ratio ceiling 1 + high).
        clip_ratio_c: dual-clip bound c > 1 for A < 0; None disables dual clip.
        loss_agg_mode: see `aggregate_loss`.
        loss_denominator: `aggregate_loss`'s denominator, e.g. the token count of the whole
            mini-batch when this is one micro-batch of it.

    Returns:
        (loss, stats): loss a 0-dim tensor; stats of detached 0-dim tensors:
            pg_clipfrac        fraction of tokens where the clipped term was the larger one
            ppo_kl             masked mean of old_log_prob - log_prob (the k1 KL to pi_old)
            pg_clipfrac_lower  fraction of tokens where dual clip bound the loss (0 without it)

    Raises:
        ValueError: clip_ratio_c given and not > 1.
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1 for dual-clip PPO, got {clip_ratio_c}")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    clipfrac = masked_mean((clipped > unclipped).to(mask.dtype), mask)

    if clip_ratio_c is None:
        clipfrac_lower = torch.zeros((), dtype=mask.dtype, device=mask.device)
    else:
        bound = -advantages * clip_ratio_c
        negative = advantages < 0
        clipfrac_lower = masked_mean(((losses > bound) & negative).to(mask.dtype), mask)
        losses = torch.where(negative, torch.minimum(losses, bound), losses)

    loss = aggregate_loss(losses, mask, loss_agg_mode, loss_denominator)
    stats = {
        "pg_clipfrac": clipfrac.detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
        "pg_clipfrac_lower": clipfrac_lower.detach(),
    }
    return loss, stats
