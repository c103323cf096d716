"""DAPO's two data-side pieces (arXiv:2503.14476); its clip-higher and token-mean loss live in
policy_loss.py and aggregation.py.

    filter_groups      dynamic sampling: a group whose responses all scored the same has zero
                       group-normalised advantage and so no gradient; drop it and sample more.
    overlong_penalty   soft overlong punishment: 0 up to max_len - buffer, then a linear ramp
                       down to -penalty_factor at max_len.

Same rules as verl (recipe/dapo and reward_manager/dapo.py), including verl's choice to keep a
group of a single response (it is "all equal" trivially, but dropping every group when
n_samples_per_prompt = 1 would empty the batch).
"""

import torch

from mindspeed_rl.algorithms.advantages import group_ids


def filter_groups(scores: torch.Tensor, group_index) -> torch.Tensor:
    """Which responses to keep for dynamic sampling: those whose group has differing scores.

    Args:
        scores: (B,) the metric to filter on (usually the sequence score, or accuracy).
        group_index: (B,) prompt ids (tensor, numpy array or list).

    Returns:
        (B,) bool tensor: True where the response's group has max > min, or a single response.
    """
    inverse, num_groups = group_ids(group_index, scores.shape[0])
    inverse = inverse.to(scores.device)
    s = scores.detach().double()
    high = torch.full((num_groups,), -torch.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, inverse, s, "amax")
    low = torch.full((num_groups,), torch.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, inverse, s, "amin")
    size = torch.zeros(num_groups, dtype=torch.long, device=s.device).index_add_(0, inverse, torch.ones_like(inverse))
    keep = (high > low) | (size == 1)
    return keep[inverse]


def overlong_penalty(
    response_length: torch.Tensor, max_response_length: int, buffer_length: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """Soft length penalty to add to the scores of responses that approach the length limit.

        expected = max_response_length - buffer_length
        penalty  = min(-(length - expected) / buffer_length * penalty_factor, 0)

    Args:
        response_length: (B,) number of generated tokens per response.
        max_response_length: the generation limit.
        buffer_length: length of the ramp, 0 < buffer_length <= max_response_length.
        penalty_factor: penalty reached at max_response_length (as a positive number).

    Returns:
        (B,) float penalties, <= 0.

    Raises:
        ValueError: buffer_length outside (0, max_response_length].
    """
    if not 0 < buffer_length <= max_response_length:
        raise ValueError(
            f"overlong buffer length must be in (0, max_response_length={max_response_length}], got {buffer_length}"
        )
    expected = max_response_length - buffer_length
    exceed = response_length.to(torch.float32) - expected
    return torch.clamp(-exceed / buffer_length * penalty_factor, max=0.0)
