"""compute_advantages: every estimator against numbers worked out by hand (in the comments)."""

import math

import numpy as np
import pytest
import torch

from mindspeed_rl.algorithms import compute_advantages

EPS = 1e-6


def lengths_mask(lengths, T):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()


def per_row(adv, mask):
    """The advantage of each row (constant over its tokens), after checking it is constant and 0 on padding."""
    assert torch.all(adv[mask == 0] == 0)
    out = []
    for row, m in zip(adv, mask):
        real = row[m.bool()]
        if real.numel():
            assert torch.allclose(real, real[0].expand_as(real))
        out.append(real[0].item() if real.numel() else 0.0)
    return out


# groups: {1, 2, 3} (mean 2, unbiased std 1), {0, 4} (mean 2, std sqrt(8)), {5} alone
SCORES = torch.tensor([1.0, 2.0, 3.0, 0.0, 4.0, 5.0])
GROUPS = torch.tensor([10, 10, 10, 20, 20, 30])
MASK = lengths_mask([3, 1, 2, 3, 0, 2], 3)  # row 4 is an empty response


def test_grpo_group_norm_by_hand():
    adv, returns = compute_advantages("grpo", SCORES, GROUPS, MASK)
    expected = [
        -1 / (1 + EPS), 0.0, 1 / (1 + EPS),  # (s - 2) / (1 + eps)
        -2 / (math.sqrt(8) + EPS),  # (0 - 2) / (sqrt(8) + eps) = -0.70710653
        0.0,  # row 4 is fully masked: no token carries its +0.7071 advantage
        5 / (1 + EPS),  # a group of one: mean 0, std 1 (verl)
    ]
    assert per_row(adv, MASK) == pytest.approx(expected, abs=1e-6)
    assert torch.equal(adv, returns)
    assert adv.shape == MASK.shape and adv.dtype == torch.float32


def test_group_norm_is_grpo_and_ids_may_be_strings_or_numpy():
    reference, _ = compute_advantages("grpo", SCORES, GROUPS, MASK)
    as_strings = ["a", "a", "a", "b", "b", "c"]
    assert torch.equal(compute_advantages("group_norm", SCORES, as_strings, MASK)[0], reference)
    assert torch.equal(compute_advantages("grpo", SCORES, np.array([7, 7, 7, 1, 1, 0]), MASK)[0], reference)


def test_dr_grpo_drops_the_std():
    adv, _ = compute_advantages("grpo", SCORES, GROUPS, MASK, norm_adv_by_std=False)
    assert per_row(adv, MASK) == pytest.approx([-1, 0, 1, -2, 0, 5], abs=1e-6)


def test_all_equal_scores_give_zero_advantage():
    scores = torch.tensor([0.5, 0.5, 0.5, 1.0, 1.0])
    mask = torch.ones(5, 4)
    for estimator in ("grpo", "rloo"):
        adv, _ = compute_advantages(estimator, scores, [0, 0, 0, 1, 1], mask)
        assert torch.all(adv == 0), estimator
    adv, _ = compute_advantages("grpo", scores, [0, 0, 0, 1, 1], mask, norm_adv_by_std=False)
    assert torch.all(adv == 0)


def test_token_level_scores_are_summed_per_sequence():
    token_scores = torch.zeros(6, 3)
    token_scores[:, 0] = SCORES - 1
    token_scores[:, 1] = 1.0  # row sums equal SCORES
    a, _ = compute_advantages("grpo", token_scores, GROUPS, MASK)
    b, _ = compute_advantages("grpo", SCORES, GROUPS, MASK)
    assert torch.allclose(a, b, atol=1e-7)


def test_advantage_whiten_like_the_seed():
    # two groups {1, 0}: A = +-0.5 / (sqrt(0.5) + eps) = +-a. Tokens: +a +a -a -a +a -a (mean 0),
    # unbiased var = 6 a^2 / 5, so whitened = +-a / sqrt(1.2 a^2 + 1e-8) = +-sqrt(5/6) (to 1e-8)
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = lengths_mask([2, 2, 1, 1], 2)
    adv, _ = compute_advantages("grpo", scores, [0, 0, 1, 1], mask, advantage_whiten=True)
    r = math.sqrt(5 / 6)
    assert per_row(adv, mask) == pytest.approx([r, -r, r, -r], abs=1e-6)


def test_rloo_by_hand():
    # {1, 2, 3}: 3/2 * (s - 2) = -1.5, 0, 1.5 (= s minus the mean of the other two); {0, 4}: 2 * (s - 2)
    adv, _ = compute_advantages("rloo", SCORES, GROUPS, MASK)
    assert per_row(adv, MASK) == pytest.approx([-1.5, 0, 1.5, -4, 0, 5], abs=1e-6)  # alone: s itself


def test_reinforce_plus_plus_baseline_by_hand():
    # centred: {1, 0} -> +0.5, -0.5; {3} alone -> 3. Tokens (lengths 2, 1, 1): 0.5 0.5 -0.5 3,
    # mean 0.875, unbiased var 6.6875 / 3 = 2.2291667, std 1.4930394
    scores = torch.tensor([1.0, 0.0, 3.0])
    mask = lengths_mask([2, 1, 1], 2)
    adv, returns = compute_advantages("reinforce_plus_plus_baseline", scores, [0, 0, 1], mask)
    expected = torch.tensor([[-0.375, -0.375], [-1.375, 0], [2.125, 0]]) / 1.4930394
    assert torch.allclose(adv, expected * mask, atol=1e-6)
    assert torch.equal(adv, returns)


def test_reinforce_plus_plus_discounted_returns_by_hand():
    # gamma 0.5. Row 0 (3 tokens, score 2 on the last): G = 0.5, 1, 2. Row 1 (1 token, score 4): G = 4.
    # Tokens 0.5 1 2 4: mean 1.875, unbiased var 7.1875 / 3 = 2.3958333, std 1.5478480
    scores = torch.tensor([2.0, 4.0])
    mask = lengths_mask([3, 1], 3)
    adv, returns = compute_advantages("reinforce_plus_plus", scores, [0, 1], mask, gamma=0.5)
    assert torch.allclose(returns, torch.tensor([[0.5, 1.0, 2.0], [4.0, 0.0, 0.0]]))
    expected = torch.tensor([[-1.375, -0.875, 0.125], [2.125, 0, 0]]) / 1.5478480
    assert torch.allclose(adv, expected * mask, atol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "group_norm", "rloo", "reinforce_plus_plus_baseline"])
def test_all_singletons(estimator):
    # n_samples_per_prompt = 1: no group statistics at all
    scores = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.ones(3, 2)
    adv, _ = compute_advantages(estimator, scores, [0, 1, 2], mask)
    assert torch.isfinite(adv).all()
    if estimator in ("grpo", "group_norm"):
        assert per_row(adv, mask) == pytest.approx([1 / (1 + EPS), -2 / (1 + EPS), 0.5 / (1 + EPS)], abs=1e-6)
    if estimator == "rloo":
        assert per_row(adv, mask) == pytest.approx([1.0, -2.0, 0.5])


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_zero_on_padding_no_grad_and_empty_rows(estimator):
    scores = torch.tensor([1.0, 0.0, 2.0, 5.0], requires_grad=True)
    mask = lengths_mask([3, 0, 2, 1], 4)
    adv, returns = compute_advantages(estimator, scores, [0, 0, 0, 1], mask)
    assert torch.all(adv[mask == 0] == 0)
    assert torch.all(adv[1] == 0)  # empty response
    assert not adv.requires_grad and not returns.requires_grad


def test_unknown_estimator_and_option_are_named():
    with pytest.raises(ValueError, match="grpo.*rloo") as err:
        compute_advantages("ppo", SCORES, GROUPS, MASK)
    assert "'ppo'" in str(err.value)
    with pytest.raises(ValueError, match="gamma"):
        compute_advantages("rloo", SCORES, GROUPS, MASK, gamma=0.9)
    with pytest.raises(ValueError, match="group_index"):
        compute_advantages("grpo", SCORES, [0, 1], MASK)
    with pytest.raises(ValueError, match="response_mask"):
        compute_advantages("grpo", SCORES, GROUPS, torch.ones(5, 3))
