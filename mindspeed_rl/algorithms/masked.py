"""Masked statistics over padded (B, T) tensors, and the entropy of a categorical from its logits.

Every loss and advantage in this package averages only over real response tokens; these helpers
are the one place that says how. They follow verl (verl/utils/torch_functional.py): the mean
divides by `mask.sum() + 1e-8` (so an all-padding mask gives 0, not NaN), the variance is
unbiased (N - 1) by default, whitening uses `rsqrt(var + 1e-8)`.

Departures: `masked_var(unbiased=True)` needs at least two selected elements and raises a
ValueError saying so (verl raises too, with a different message). OpenRLHF's whiten uses the
same formula with `rsqrt(var + 1e-8)`; TRL's `whiten` uses the unbiased variance as well.
"""

import torch

MEAN_EPS = 1e-8  # keeps an all-padding mean at 0 instead of 0 / 0
WHITEN_EPS = 1e-8  # added to the variance before rsqrt in masked_whiten


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is non-zero.

    Args:
        values: any shape, e.g. (B, T).
        mask: same shape as `values`; bool or 0/1 numbers.
        dim: dimension to reduce; None reduces everything.

    Returns:
        The sum, `values` reduced over `dim`. Padding that holds NaN or inf does not leak in,
        because masked positions are replaced by 0 before multiplying.
    """
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))
    return (kept * mask).sum() if dim is None else (kept * mask).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is non-zero.

    mean = sum(values * mask) / (sum(mask) + 1e-8)

    Args:
        values: any shape, e.g. (B, T).
        mask: same shape as `values`.
        dim: dimension to reduce; None reduces everything.

    Returns:
        The mean, reduced over `dim`; 0 where the mask selects nothing.
    """
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / (count + MEAN_EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` over all positions where `mask` is non-zero (a scalar).

    var = masked_mean((values - mean)^2) * N / (N - 1)   with N = sum(mask) when unbiased

    Args:
        values: any shape, e.g. (B, T).
        mask: same shape as `values`.
        unbiased: apply Bessel's correction N / (N - 1).

    Returns:
        0-dim tensor.

    Raises:
        ValueError: unbiased and fewer than two elements are selected (N - 1 would be 0).
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count < 2:
            raise ValueError(
                f"masked_var(unbiased=True) needs at least 2 unmasked elements, got {int(count)}; "
                "use a larger batch or unbiased=False"
            )
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise `values` to zero mean and unit variance using statistics over the mask only.

    out = (values - mean) * rsqrt(var + 1e-8)      (+ mean again when shift_mean=False)

    The unbiased variance is used. Positions outside the mask are transformed too (they are not
    zeroed here); callers multiply by the mask afterwards.

    Args:
        values: any shape, e.g. (B, T).
        mask: same shape as `values`, at least two elements selected.
        shift_mean: False keeps the original mean (only the scale changes).

    Returns:
        Tensor shaped like `values`.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution softmax(logits) along the last dimension.

    H = logsumexp(z) - sum(softmax(z) * z)      (equal to -sum(p log p), without computing log p)

    Args:
        logits: (..., V) unnormalised log-probabilities, e.g. (B, T, V).

    Returns:
        (...) entropy in nats, e.g. (B, T).
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
