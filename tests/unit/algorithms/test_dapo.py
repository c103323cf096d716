"""DAPO pieces: dynamic-sampling group filter and the soft overlong penalty, by hand."""

import pytest
import torch

from mindspeed_rl.algorithms import filter_groups, overlong_penalty


def test_filter_groups_drops_all_equal_groups_keeps_singletons():
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 2.0, 2.0])
    groups = ["a", "a", "a", "b", "b", "c", "d", "d"]  # a: all 1, b: mixed, c: alone, d: all 2
    keep = filter_groups(scores, groups)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, False, False, True, True, True, False, False]
    assert torch.equal(filter_groups(scores, torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])), keep)


def test_filter_groups_interleaved_and_empty():
    keep = filter_groups(torch.tensor([0.0, 1.0, 0.0, 0.0]), [1, 2, 1, 2])
    assert keep.tolist() == [False, True, False, True]
    assert filter_groups(torch.tensor([]), []).tolist() == []


def test_overlong_penalty_by_hand():
    # max 20, buffer 4: free up to 16 tokens, then -1/4 per token, -1 at 20
    lengths = torch.tensor([10, 16, 17, 18, 20])
    assert overlong_penalty(lengths, 20, 4).tolist() == pytest.approx([0, 0, -0.25, -0.5, -1.0])
    assert overlong_penalty(lengths, 20, 4, penalty_factor=0.5).tolist() == pytest.approx([0, 0, -0.125, -0.25, -0.5])


def test_overlong_buffer_must_fit():
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 20, 0)
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 20, 21)
