"""kl_penalty and kl_in_reward against hand-worked values."""

import math

import pytest
import torch

from mindspeed_rl.algorithms import kl_in_reward, kl_penalty

# x = log_prob - ref = 0.5, -1, 30, -25
LOGP = torch.tensor([[-1.0, -2.0, 0.0, -30.0]])
REF = torch.tensor([[-1.5, -1.0, -30.0, -5.0]])


@pytest.mark.parametrize(
    "kinds, expected",
    [
        (("k1", "kl"), [0.5, -1.0, 30.0, -25.0]),
        (("abs",), [0.5, 1.0, 30.0, 25.0]),
        (("k2", "mse"), [0.125, 0.5, 450.0, 312.5]),  # 0.5 x^2
        # k3 with y = ref - logp = -0.5, 1, -30 -> -20, 25 -> 20:  e^y - y - 1, then clamped to [-10, 10]
        (("k3", "low_var_kl"), [math.exp(-0.5) - 0.5, math.e - 2, 10.0, 10.0]),
    ],
)
def test_kl_estimators_by_hand(kinds, expected):
    for kind in kinds:
        assert kl_penalty(LOGP, REF, kind)[0].tolist() == pytest.approx(expected, rel=1e-6), kind


def test_k3_is_exactly_zero_when_equal_and_non_negative():
    logp = torch.tensor([[-0.3, -2.0, -7.0]])
    assert torch.all(kl_penalty(logp, logp, "k3") == 0)
    assert torch.all(kl_penalty(logp, logp + torch.tensor([[0.1, -3.0, 5.0]]), "k3") >= 0)


def test_k3_gradient_is_finite_for_extreme_ratios():
    logp = torch.tensor([[-100.0, 0.0]], requires_grad=True)
    kl_penalty(logp, torch.tensor([[0.0, -100.0]]), "k3").sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_unknown_kind_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown KL penalty 'full'.*k3.*low_var_kl"):
        kl_penalty(LOGP, REF, "full")


def test_kl_in_reward_by_hand():
    # k1 per token: [[0.1, 0.2], [0.3, 9 (padding)]]; beta 0.5; scores 1 and 2 on the last real token
    ref = torch.zeros(2, 2)
    logp = torch.tensor([[0.1, 0.2], [0.3, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rewards, mean_kl = kl_in_reward(torch.tensor([1.0, 2.0]), logp, ref, mask, beta=0.5, kind="k1")
    assert torch.allclose(rewards, torch.tensor([[-0.05, 1.0 - 0.1], [2.0 - 0.15, 0.0]]))
    assert mean_kl.item() == pytest.approx((0.15 + 0.3) / 2)  # token mean per row, then batch mean


def test_kl_in_reward_accepts_token_level_scores_and_empty_rows():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    logp = torch.full((2, 2), 0.2)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    rewards, mean_kl = kl_in_reward(scores, logp, torch.zeros(2, 2), mask, beta=1.0)
    assert torch.allclose(rewards, torch.tensor([[-0.2, 0.8], [0.0, 0.0]]))
    assert mean_kl.item() == pytest.approx(0.1)  # rows: 0.2 and 0 (empty)
