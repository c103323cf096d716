"""tis_weights: truncated importance sampling weights, worked by hand."""

import math

import pytest
import torch

from mindspeed_rl.algorithms import tis_stats, tis_weights

# row 0: old - rollout = ln 2, ln 0.5, ln 4 (capped at 3), padding with an absurd gap
# row 1: old - rollout = ln 1.5, ln 1.5, padding x 2
OLD = torch.tensor([[math.log(2.0), math.log(0.5), math.log(4.0), 30.0],
                    [math.log(1.5), math.log(1.5), 0.0, -30.0]])
ROLL = torch.zeros(2, 4)
MASK = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])


def test_token_level_by_hand():
    w = tis_weights(OLD, ROLL, MASK, "token", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 3.0, 0.0], [1.5, 1.5, 0.0, 0.0]]))


def test_sequence_level_by_hand():
    # row 0: exp(ln 2 + ln 0.5 + ln 4) = 4 -> capped at 3; row 1: 1.5 * 1.5 = 2.25
    w = tis_weights(OLD, ROLL, MASK, "sequence", cap=3.0)
    torch.testing.assert_close(w, torch.tensor([[3.0, 3.0, 3.0, 0.0], [2.25, 2.25, 0.0, 0.0]]))


def test_off_is_the_mask_and_weights_carry_no_gradient():
    assert tis_weights(OLD, ROLL, MASK, "off").tolist() == MASK.tolist()
    old = OLD.clone().requires_grad_(True)
    assert not tis_weights(old, ROLL, MASK, "token").requires_grad


def test_stats_and_bad_arguments():
    w = tis_weights(OLD, ROLL, MASK, "token", cap=3.0)
    s = tis_stats(w, MASK, cap=3.0)
    assert s["tis_weight_mean"].item() == pytest.approx((2 + 0.5 + 3 + 1.5 + 1.5) / 5)
    assert s["tis_capped_frac"].item() == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="unknown TIS mode"):
        tis_weights(OLD, ROLL, MASK, "row")
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(OLD, ROLL, MASK, "token", cap=0.0)
