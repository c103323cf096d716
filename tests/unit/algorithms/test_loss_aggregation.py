"""aggregate_loss: the four modes, the denominator override and empty masks, by hand."""

import pytest
import torch

from mindspeed_rl.algorithms import aggregate_loss

NAN = float("nan")
# real tokens: row 0 -> 1, 2; row 1 -> 4; row 2 empty. Padding holds junk (NaN, inf) that must not count.
LOSS = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, 5.0, float("inf"), 6.0], [7.0, 8.0, 9.0, 10.0]])
MASK = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 non-empty rows
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 4),  # 7 / T
    ],
)
def test_modes_by_hand(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "mode, denominator, expected",
    [("token-mean", 14, 0.5), ("seq-mean-token-mean", 4, 1.375), ("seq-mean-token-sum", 7, 1.0),
     ("seq-mean-token-sum-norm", 2, 3.5)],
)
def test_denominator_override(mode, denominator, expected):
    assert aggregate_loss(LOSS, MASK, mode, denominator=denominator).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_all_padding_gives_zero_not_nan(mode):
    loss = torch.ones(2, 3, requires_grad=True)
    out = aggregate_loss(loss, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.all(loss.grad == 0)


def test_gradient_of_token_mean():
    loss = torch.zeros(2, 2, requires_grad=True)
    aggregate_loss(loss, torch.tensor([[1.0, 1.0], [1.0, 0.0]])).backward()
    assert torch.allclose(loss.grad, torch.tensor([[1 / 3, 1 / 3], [1 / 3, 0.0]]))


def test_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="'token-sum'.*token-mean.*seq-mean-token-sum-norm"):
        aggregate_loss(LOSS, MASK, "token-sum")
