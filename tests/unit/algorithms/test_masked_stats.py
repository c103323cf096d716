"""Masked statistics and entropy, by hand."""

import math

import pytest
import torch

from mindspeed_rl.algorithms import entropy_from_logits, masked_mean, masked_sum, masked_var, masked_whiten

# real values 1, 2, 3, 5: sum 11, mean 2.75, squared deviations 8.75
VALUES = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 5.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 1]])


def test_sum_and_mean_ignore_padding_even_nan():
    assert masked_sum(VALUES, MASK).item() == 11.0
    assert masked_mean(VALUES, MASK).item() == pytest.approx(2.75)
    assert masked_mean(VALUES, MASK, dim=-1).tolist() == pytest.approx([1.5, 4.0])
    assert masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0  # nothing selected: 0, not NaN


def test_var_unbiased_and_biased():
    clean = torch.nan_to_num(VALUES, nan=0.0, posinf=0.0)
    assert masked_var(clean, MASK).item() == pytest.approx(8.75 / 3)
    assert masked_var(clean, MASK, unbiased=False).item() == pytest.approx(8.75 / 4)
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(clean, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_whiten_by_hand():
    clean = torch.nan_to_num(VALUES, nan=0.0, posinf=0.0)
    out = masked_whiten(clean, MASK)
    std = math.sqrt(8.75 / 3 + 1e-8)
    assert out[MASK.bool()].tolist() == pytest.approx([(v - 2.75) / std for v in (1, 2, 3, 5)], abs=1e-6)
    kept = masked_whiten(clean, MASK, shift_mean=False)
    assert kept[MASK.bool()].tolist() == pytest.approx([(v - 2.75) / std + 2.75 for v in (1, 2, 3, 5)], abs=1e-6)
    # all equal: var 0, so (v - mean) * rsqrt(1e-8) = 0 exactly
    assert torch.all(masked_whiten(torch.full((2, 2), 3.0), torch.ones(2, 2)) == 0)


def test_entropy_by_hand():
    uniform = torch.zeros(2, 3, 4)
    assert torch.allclose(entropy_from_logits(uniform), torch.full((2, 3), math.log(4)))
    # p = 1/2, 1/4, 1/4: H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2, whatever constant shifts the logits
    logits = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.25)]) + 100.0
    assert entropy_from_logits(logits).item() == pytest.approx(1.5 * math.log(2), abs=1e-5)
    # (almost) one-hot: entropy ~ 0
    assert entropy_from_logits(torch.tensor([50.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)
