r"""math and acc verifiers: \boxed{} extraction and math-verify equivalence, by hand."""

import pytest

from mindspeed_rl.rewards import acc_score, compute_score, last_boxed, math_score


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{1} then \boxed{2}", "2"),  # the last one
        (r"\fbox{3}", "3"),
        (r"$\boxed 5$", "5"),
        (r"\boxed{unclosed", None),
        ("no box", None),
        ("", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    "response, label, score",
    [
        (r"The answer is \boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
        (r"\boxed{1+x}", "x+1", 1.0),
        (r"\boxed{1,000}", "1000", 1.0),
        (r"\boxed{72}", "$72$", 1.0),
        (r"\boxed{\sqrt{2}}", r"\sqrt 2", 1.0),
        (r"\boxed{73}", "72", 0.0),
        ("72", "72", 0.0),  # no \boxed: math needs one
        ("", "72", 0.0),
    ],
)
def test_math_score(response, label, score):
    assert math_score(response, label) == score
    assert compute_score("math", response, label) == score


@pytest.mark.parametrize(
    "response, label, score",
    [
        (r"<think>...</think><answer>\boxed{72}</answer>", "72", 1.0),
        (r"\boxed{71}", "72", -0.5),
        ("the answer is 72", "72", -1.0),
        ("", "72", -1.0),
    ],
)
def test_acc_keeps_the_seed_convention(response, label, score):
    assert acc_score(response, label) == score
    assert compute_score("acc", response, label) == score
