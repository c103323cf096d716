"""Reduce a (B, T) per-token loss to the scalar that is back-propagated.

The choice matters (DAPO, arXiv:2503.14476; Dr.GRPO, arXiv:2503.20783): averaging per sequence
first gives every response the same weight however long it is, which under-weights the tokens
of long answers; a token mean weights every token the same.

    token-mean                sum(L * m) / sum(m)                              DAPO, verl default
    seq-mean-token-mean       mean over non-empty rows of sum_t(L m) / sum_t(m)   original GRPO
    seq-mean-token-sum        mean over non-empty rows of sum_t(L m)
    seq-mean-token-sum-norm   sum(L * m) / C, C a constant (default T)         Dr.GRPO

`denominator` replaces the default divisor (sum(m), the number of non-empty rows, or T). The
actor passes global counts here when it splits a mini-batch into micro-batches, so that the sum
of the micro-batch losses equals the loss of the whole mini-batch.

Departures from verl's agg_loss: a divisor of 0 (all padding) gives a loss of 0 instead of NaN,
the per-row token mean divides by the exact count (verl adds 1e-8), and NaN/inf on padding is
ignored in every mode (verl: in token-mean only).
"""

from collections.abc import Callable

import torch


def _divide(total: torch.Tensor, divisor) -> torch.Tensor:
    # divisors are counts of tokens or rows: only 0 is clamped, which turns an all-padding 0 / 0 into 0
    divisor = torch.as_tensor(divisor, dtype=total.dtype, device=total.device)
    return total / divisor.clamp(min=1)


def _masked(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # where() first: NaN or inf on padding (e.g. from a -inf log-prob) must not reach the sum
    return torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat)) * mask


def _token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator) -> torch.Tensor:
    total = _masked(loss_mat, mask).sum()
    return _divide(total, mask.sum() if denominator is None else denominator)


def _seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, denominator) -> torch.Tensor:
    tokens = mask.sum(dim=-1)  # (B,)
    per_seq = _masked(loss_mat, mask).sum(dim=-1) / tokens.clamp(min=1)
    rows = (tokens > 0).sum()
    return _divide(per_seq.sum(), rows if denominator is None else denominator)


def _seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, denominator) -> torch.Tensor:
    per_seq = _masked(loss_mat, mask).sum(dim=-1)
    rows = (mask.sum(dim=-1) > 0).sum()
    return _divide(per_seq.sum(), rows if denominator is None else denominator)


def _seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, denominator) -> torch.Tensor:
    total = _masked(loss_mat, mask).sum()
    return _divide(total, mask.shape[-1] if denominator is None else denominator)


AGGREGATION_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor, object], torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    denominator: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Scalar loss from a per-token loss matrix.

    Args:
        loss_mat: (B, T) per-token loss; values on padding are ignored, even NaN or inf.
        mask: (B, T) 1 on tokens that count.
        mode: a key of AGGREGATION_MODES (formulas in the module docstring).
        denominator: overrides the divisor: tokens for token-mean, rows for the seq-mean modes,
            the constant C for seq-mean-token-sum-norm (default T = loss_mat.shape[-1]).

    Returns:
        0-dim tensor, differentiable with respect to `loss_mat`.

    Raises:
        ValueError: unknown mode.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(AGGREGATION_MODES)}")
    return AGGREGATION_MODES[mode](loss_mat, mask.to(loss_mat.dtype), denominator)
