"""Outcome advantages for the GRPO family: one scalar score per response, broadcast over its tokens.

`compute_advantages(estimator, scores, group_index, response_mask, **options)` is the public entry;
ESTIMATORS maps each name to its function. Group statistics are taken over the responses that
share a `group_index` (the n samples of one prompt) and are computed in float64, so they are the
exact values that verl's per-sample loops approximate in float32.

Estimators (s_i the score of response i, g its group of size n, mean_g / std_g over that group):
    group_norm, grpo      A_i = (s_i - mean_g) / (std_g + eps)          GRPO, arXiv:2402.03300
                          std unbiased (n - 1), eps = 1e-6; n = 1 -> mean 0, std 1
                          norm_adv_by_std=False: A_i = s_i - mean_g      Dr.GRPO, arXiv:2503.20783
                          advantage_whiten=True: then whiten A over the batch (the seed's ray_gpt)
    rloo                  A_i = n / (n - 1) * (s_i - mean_g)             arXiv:2402.14740; n = 1 -> s_i
    reinforce_plus_plus   returns G_t = sum_k gamma^(k-t) r_k, whitened over the batch   arXiv:2501.03262
    reinforce_plus_plus_baseline   A_i = s_i - mean_g, whitened over the batch's tokens

All advantages are (B, T), constant over a response's tokens (except reinforce_plus_plus with
gamma < 1) and exactly 0 on padding. The formulas are verl's (verl/trainer/ppo/core_algos.py).

Where other systems differ:
    TRL GRPOTrainer: (s - mean) / (std + 1e-4), and at least 2 samples per prompt.
    OpenRLHF group_norm: (s - mean) / (std + 1e-9).
    The seed (MindSpeed-LLM ray_gpt): (s - mean) / (std + 1e-8), then masked batch whitening
        unless algorithm.advantage_whiten is false; here whitening is `advantage_whiten=True` and
        eps is verl's 1e-6 (a relative difference of about 1e-6 / std_g).
    verl keeps a singleton group's score as A = s / (1 + eps) under GRPO; so do we.
"""

import inspect
from collections.abc import Callable, Sequence

import torch

from mindspeed_rl.algorithms.masked import masked_whiten

GROUP_NORM_EPS = 1e-6


# ---- group bookkeeping


def group_ids(group_index: torch.Tensor | Sequence, batch_size: int) -> tuple[torch.Tensor, int]:
    """Map arbitrary prompt ids to dense group numbers 0..G-1.

    Args:
        group_index: (B,) tensor, numpy array or list of hashable ids (ints, uuid strings, ...).
        batch_size: B, checked against the length of `group_index`.

    Returns:
        (inverse, G): inverse is a (B,) int64 tensor on the CPU, G the number of groups.
    """
    if isinstance(group_index, torch.Tensor):
        if group_index.dim() != 1 or group_index.shape[0] != batch_size:
            raise ValueError(f"group_index must have shape ({batch_size},), got {tuple(group_index.shape)}")
        _, inverse = torch.unique(group_index.cpu(), return_inverse=True)
        return inverse.long(), int(inverse.max()) + 1 if batch_size else 0
    ids = list(group_index)
    if len(ids) != batch_size:
        raise ValueError(f"group_index must have {batch_size} entries, got {len(ids)}")
    dense: dict = {}
    inverse = torch.tensor([dense.setdefault(i, len(dense)) for i in ids], dtype=torch.long)
    return inverse, len(dense)


def group_mean_std(scores: torch.Tensor, group_index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response statistics of its group: mean, unbiased std, and size, in float64.

    A group of one response gets mean 0 and std 1 (verl's convention), so that GRPO leaves its
    score unchanged (up to eps) instead of dividing 0 by 0.

    Args:
        scores: (B,) sequence scores.
        group_index: (B,) prompt ids, see `group_ids`.

    Returns:
        (mean, std, size), each (B,) float64 on `scores.device`: the statistics of each response's group.
    """
    inverse, num_groups = group_ids(group_index, scores.shape[0])
    inverse = inverse.to(scores.device)
    s = scores.detach().double()
    size = torch.zeros(num_groups, dtype=torch.float64, device=s.device).index_add_(0, inverse, torch.ones_like(s))
    total = torch.zeros_like(size).index_add_(0, inverse, s)
    mean = total / size
    sq_dev = torch.zeros_like(size).index_add_(0, inverse, (s - mean[inverse]) ** 2)
    std = torch.sqrt(sq_dev / (size - 1).clamp(min=1))
    single = size == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inverse], std[inverse], size[inverse]


def sequence_scores(scores: torch.Tensor) -> torch.Tensor:
    """(B,) scores as given, or the sum over tokens of (B, T) token-level rewards (verl's convention)."""
    if scores.dim() == 2:
        return scores.sum(dim=-1)
    if scores.dim() != 1:
        raise ValueError(f"scores must be (B,) or (B, T), got shape {tuple(scores.shape)}")
    return scores


def token_level_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each (B,) sequence score on the last real token of its response; (B, T) out.

    A fully masked row gets no reward at all (there is no token to carry it).
    """
    mask = response_mask.bool()
    length = mask.sum(dim=-1)  # (B,)
    last = (length - 1).clamp(min=0)
    out = torch.zeros(mask.shape, dtype=_float_dtype(scores), device=scores.device)
    out.scatter_(1, last.unsqueeze(1), scores.to(out.dtype).unsqueeze(1))
    return out * mask


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.is_floating_point() else torch.float32


def _broadcast(per_sequence: torch.Tensor, response_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B,) -> (B, T): the same value on every real token, 0 on padding."""
    return per_sequence.to(dtype).unsqueeze(-1) * response_mask.to(dtype)


# ---- estimators: (scores, group_index, response_mask, **options) -> (advantages, returns)


def group_norm_advantages(
    scores: torch.Tensor,
    group_index,
    response_mask: torch.Tensor,
    eps: float = GROUP_NORM_EPS,
    norm_adv_by_std: bool = True,
    advantage_whiten: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: A_i = (s_i - mean_g) / (std_g + eps), broadcast over the response.

    Args:
        scores: (B,) sequence scores, or (B, T) token-level rewards (summed per sequence).
        group_index: (B,) prompt ids.
        response_mask: (B, T) 1 on response tokens.
        eps: added to the unbiased group std.
        norm_adv_by_std: False gives Dr.GRPO's A_i = s_i - mean_g.
        advantage_whiten: whiten the (B, T) advantages over all unmasked tokens of the batch
            afterwards, (A - mean) * rsqrt(var + 1e-8) with unbiased var, as the seed's ray_gpt does.

    Returns:
        (advantages, returns): both (B, T), equal (there is no critic), 0 on padding.
    """
    s = sequence_scores(scores)
    dtype = _float_dtype(s)
    mean, std, _ = group_mean_std(s, group_index)
    adv = s.double() - mean
    if norm_adv_by_std:
        adv = adv / (std + eps)
    adv = _broadcast(adv, response_mask, dtype)
    if advantage_whiten:
        adv = masked_whiten(adv, response_mask) * response_mask.to(dtype)
    return adv, adv


def rloo_advantages(
    scores: torch.Tensor, group_index, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: A_i = s_i - mean of the other n - 1 scores = n / (n - 1) * (s_i - mean_g).

    A group of one has no other sample to compare with; its score is used as is (verl).

    Args / Returns: as `group_norm_advantages` (without options).
    """
    s = sequence_scores(scores)
    mean, _, size = group_mean_std(s, group_index)
    scale = torch.where(size > 1, size / (size - 1).clamp(min=1), torch.ones_like(size))
    adv = _broadcast(scale * (s.double() - mean), response_mask, _float_dtype(s))
    return adv, adv


def reinforce_plus_plus_advantages(
    scores: torch.Tensor, group_index, response_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns of token-level rewards, whitened over the whole batch.

        G_t = r_t + gamma * G_{t+1}   (restarting after the end of each response)
        A = masked_whiten(G, mask) * mask

    With (B,) scores the reward sits on the last response token, so G_t = gamma^(L-1-t) * s.
    Groups are not used.

    Args:
        scores: (B,) sequence scores or (B, T) token-level rewards (e.g. from `kl_in_reward`).
        group_index: ignored (accepted for a uniform signature).
        response_mask: (B, T), at least two response tokens in the batch.
        gamma: discount factor.

    Returns:
        (advantages, returns): (B, T) whitened advantages (0 on padding) and the raw returns G.
    """
    mask = response_mask.to(_float_dtype(scores))
    rewards = scores.to(mask.dtype) if scores.dim() == 2 else token_level_scores(scores, response_mask)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]  # nothing flows back from padding into the response
    adv = masked_whiten(returns, mask) * mask
    return adv, returns


def reinforce_plus_plus_baseline_advantages(
    scores: torch.Tensor, group_index, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with the group mean as baseline: A = whiten(s_i - mean_g) over the batch's tokens.

    The whitening statistics are token-weighted (each response counts once per token), as in verl.

    Args / Returns: as `group_norm_advantages` (without options); needs two response tokens.
    """
    s = sequence_scores(scores)
    mean, _, _ = group_mean_std(s, group_index)
    mask = response_mask.to(_float_dtype(s))
    centred = _broadcast(s.double() - mean, response_mask, mask.dtype)
    adv = masked_whiten(centred, mask) * mask
    return adv, adv


ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "group_norm": group_norm_advantages,
    "grpo": group_norm_advantages,
    "rloo": rloo_advantages,
    "reinforce_plus_plus": reinforce_plus_plus_advantages,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantages,
}


def compute_advantages(
    estimator: str,
    scores: torch.Tensor,
    group_index,
    response_mask: torch.Tensor,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns for one batch of scored responses.

    Args:
        estimator: a key of ESTIMATORS (group_norm / grpo, rloo, reinforce_plus_plus,
            reinforce_plus_plus_baseline).
        scores: (B,) one score per response, or (B, T) token-level rewards.
        group_index: (B,) prompt id of each response (tensor, numpy array or list).
        response_mask: (B, T) 1 on generated tokens, 0 on padding.
        **options: estimator options (group_norm: eps, norm_adv_by_std, advantage_whiten;
            reinforce_plus_plus: gamma).

    Returns:
        (advantages, returns), both (B, T) and 0 on padding. No gradient flows through them.

    Raises:
        ValueError: unknown estimator or option, or shapes that do not match.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {', '.join(sorted(ESTIMATORS))}")
    fn = ESTIMATORS[estimator]
    allowed = set(list(inspect.signature(fn).parameters)[3:])  # after scores, group_index, response_mask
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(
            f"advantage estimator {estimator!r} has no option(s) {sorted(unknown)}; "
            f"valid: {sorted(allowed) or 'none'}"
        )
    if response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"response_mask must be (B, T) with B = {scores.shape[0]}, got {tuple(response_mask.shape)}"
        )
    with torch.no_grad():
        return fn(scores, group_index, response_mask, **options)
