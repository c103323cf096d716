"""Truncated importance sampling (TIS): correct the policy loss for a sampler that is not the
trainer's forward (vLLM in bf16, other kernels), as verl / Yao et al. 2025 ("Your efficient RL
framework secretly brings you off-policy RL training") do.

The tokens were drawn from pi_rollout (the engine's log-probs), but the policy loss treats them as
drawn from pi_old (the trainer's forward at the same weights). Each token's loss is weighted by
    token level:     w_t = min(exp(old_t - rollout_t), cap)
    sequence level:  w   = min(exp(sum_t mask_t * (old_t - rollout_t)), cap)   (same w for all tokens of a row)
The weights are constants (no gradient). cap bounds the variance (verl's default is 2).
The log-ratio is clamped to +-20 before exp, as in policy_loss.

Departure from verl: the sequence-level sum is over response tokens only (mask), and a row with
no response tokens gets weight 1 (it contributes nothing to the loss anyway).
"""

import torch

TIS_MODES = ("off", "token", "sequence")
LOG_RATIO_CLAMP = 20.0


def tis_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                mode: str = "token", cap: float = 2.0) -> torch.Tensor:
    """Importance weights pi_old / pi_rollout, truncated at cap, detached.

    Args:
        old_log_prob: (B, T) log-probs of the sampled tokens under the trainer's forward.
        rollout_log_prob: (B, T) log-probs the rollout engine reported for the same tokens.
        response_mask: (B, T) 1 on response tokens.
        mode: "token" (a weight per token), "sequence" (one per row, broadcast over T) or "off" (ones).
        cap: upper bound of a weight, > 0.

    Returns:
        (B, T) float weights, 0 on padding (mode "off": 1 on response tokens, 0 on padding).

    Raises:
        ValueError for an unknown mode or cap <= 0.
    """
    if mode not in TIS_MODES:
        raise ValueError(f"unknown TIS mode {mode!r}; use one of {', '.join(TIS_MODES)}")
    if not cap > 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    mask = response_mask.to(old_log_prob.dtype)
    if mode == "off":
        return mask.clone()
    log_ratio = (old_log_prob.detach() - rollout_log_prob.detach()) * mask  # (B, T)
    if mode == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(mask)  # (B, T), the row's total
    w = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).clamp(max=cap)
    return w * mask


def tis_stats(weights: torch.Tensor, response_mask: torch.Tensor, cap: float) -> dict[str, torch.Tensor]:
    """Mean weight and the fraction of tokens whose weight hit the cap (over response tokens)."""
    mask = response_mask.to(weights.dtype)
    n = mask.sum().clamp(min=1)
    return {"tis_weight_mean": (weights * mask).sum() / n,
            "tis_capped_frac": ((weights >= cap) & (mask > 0)).to(weights.dtype).sum() / n}
