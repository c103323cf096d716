"""format verifier: <think>...</think><answer>...</answer>, by hand, and linear on adversarial text."""

import time

import pytest

from mindspeed_rl.rewards import compute_score, format_score


@pytest.mark.parametrize(
    "response, score",
    [
        ("<think>reason</think><answer>42</answer>", 1.0),
        ("\n <think>a\nb</think>\n\n<answer>\n42\n</answer>\n", 1.0),  # whitespace around and between
        ("<think></think><answer></answer>", 1.0),
        ("<answer>42</answer>", 0.0),
        ("<think>reason</think>42", 0.0),
        ("<think>reason</think> text <answer>42</answer>", 0.0),  # text between the blocks
        ("<think>reason</think><answer>42</answer> more", 0.0),
        ("<think>reason</think><answer>42</answer>\nmore", 0.0),  # the seed's MULTILINE accepted this
        ("<think></answer>", 0.0),
        ("", 0.0),
    ],
)
def test_format_by_hand(response, score):
    assert format_score(response) == score
    assert compute_score("format", response, "ignored") == score


def test_adversarial_text_is_linear():
    text = "<think>" + "</think> <answer>" * 50_000 + "x"  # quadratic for the lazy regex
    start = time.perf_counter()
    assert format_score(text) == 0.0
    assert format_score(text + "</answer>") == 1.0
    assert time.perf_counter() - start < 1.0
