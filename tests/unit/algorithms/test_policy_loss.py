"""policy_loss: clipped surrogate, clip-higher, dual clip and statistics, worked by hand."""

import math

import pytest
import torch

from mindspeed_rl.algorithms import policy_loss

# five real tokens with ratios r = 1, 1.5, 0.5, 0.1, 4 and advantages 1, 1, -1, -1, -1;
# a sixth, padding token with an absurd ratio and advantage that must not count.
RATIOS = [1.0, 1.5, 0.5, 0.1, 4.0]
OLD = torch.zeros(1, 6)
LOGP = torch.tensor([[math.log(r) for r in RATIOS] + [50.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 1e6]])
MASK = torch.tensor([[1.0, 1, 1, 1, 1, 0]])


def test_clip_higher_with_dual_clip_by_hand():
    # low 0.2, high 0.28: clamp range [0.8, 1.28]; c = 3
    #   r=1,   A=+1: max(-1, -1)         = -1
    #   r=1.5, A=+1: max(-1.5, -1.28)    = -1.28  (clipped)
    #   r=0.5, A=-1: max(0.5, 0.8)       =  0.8   (clipped)
    #   r=0.1, A=-1: max(0.1, 0.8)       =  0.8   (clipped)
    #   r=4,   A=-1: max(4, 1.28) = 4, dual clip min(4, 3) = 3  (lower-clipped)
    loss, stats = policy_loss(LOGP, OLD, ADV, MASK, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    assert loss.item() == pytest.approx((-1 - 1.28 + 0.8 + 0.8 + 3) / 5, abs=1e-6)  # 0.464
    assert stats["pg_clipfrac"].item() == pytest.approx(3 / 5)
    assert stats["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    # ppo_kl = mean(-log r) = -ln(1 * 1.5 * 0.5 * 0.1 * 4) / 5 = -ln(0.3) / 5
    assert stats["ppo_kl"].item() == pytest.approx(-math.log(0.3) / 5, abs=1e-6)


def test_without_dual_clip_the_exploded_ratio_counts_fully():
    loss, stats = policy_loss(LOGP, OLD, ADV, MASK, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss.item() == pytest.approx((-1 - 1.28 + 0.8 + 0.8 + 4) / 5, abs=1e-6)  # 0.664
    assert stats["pg_clipfrac_lower"].item() == 0.0


def test_symmetric_clip_and_seq_mean_aggregation():
    # default 0.2 / 0.2: token 2 becomes max(-1.5, -1.2) = -1.2; one row, so seq-mean-token-mean = token-mean
    loss, _ = policy_loss(LOGP, OLD, ADV, MASK, loss_agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx((-1 - 1.2 + 0.8 + 0.8 + 4) / 5, abs=1e-6)


def test_loss_denominator_for_micro_batches():
    # this micro-batch holds 5 of the mini-batch's 20 tokens: sum of token losses / 20
    loss, _ = policy_loss(LOGP, OLD, ADV, MASK, 0.2, 0.28, 3.0, loss_denominator=20)
    assert loss.item() == pytest.approx((-1 - 1.28 + 0.8 + 0.8 + 3) / 20, abs=1e-6)


def test_gradient_flows_only_through_unclipped_tokens():
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = policy_loss(logp, OLD, ADV, MASK, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    loss.backward()
    # d/dlogp of -A r is -A r; only token 0 (r = 1, A = 1) is unclipped: -1 / 5 tokens
    assert logp.grad[0].tolist() == pytest.approx([-0.2, 0, 0, 0, 0, 0], abs=1e-7)


def test_extreme_ratios_stay_finite():
    # log-ratio +-1000 is clamped to +-20 before exp
    logp = torch.tensor([[1000.0, -1000.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, 1.0]])
    loss, stats = policy_loss(logp, torch.zeros(1, 2), adv, torch.ones(1, 2))
    assert torch.isfinite(loss) and loss.item() == pytest.approx((math.exp(20) - 0.8) / 2, rel=1e-5)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert stats["ppo_kl"].item() == pytest.approx(0.0)  # (-20 + 20) / 2


def test_fully_masked_batch_gives_zero_loss():
    loss, stats = policy_loss(LOGP, OLD, ADV, torch.zeros(1, 6))
    assert loss.item() == 0.0 and stats["pg_clipfrac"].item() == 0.0


def test_dual_clip_bound_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(LOGP, OLD, ADV, MASK, clip_ratio_c=1.0)
