"""score_batch: weights, missing-EOS penalty, metrics, failures that never stop a batch; validate_verifiers."""

import textwrap
import time

import pytest

from mindspeed_rl.rewards import VERIFIERS, score_batch, validate_verifiers
from mindspeed_rl.utils.errors import UserInputError

RESPONSES = [
    r"<think>6*12</think><answer>\boxed{72}</answer>",  # acc +1, format 1
    r"<think>hm</think><answer>\boxed{71}</answer>",  # acc -0.5, format 1
    "72",  # acc -1 (no box), format 0
    "",  # empty response: acc -1, format 0
]
LABELS = ["72", "72", "72", "72"]


def test_seed_config_acc_and_format_by_hand():
    # verifier_function: ["acc", "format"], verifier_weight: [0.5, 0.5]
    scores, metrics = score_batch(RESPONSES, LABELS, ["acc", "format"], [0.5, 0.5])
    assert scores == pytest.approx([1.0, 0.25, -0.5, -0.5])
    assert metrics["reward/acc/mean"] == pytest.approx((1 - 0.5 - 1 - 1) / 4)
    assert metrics["reward/format/mean"] == pytest.approx(0.5)
    assert metrics["reward/acc/failed"] == 0 and metrics["reward/format/timed_out"] == 0
    assert metrics["reward/score/mean"] == pytest.approx(0.0625)


def test_missing_eos_penalty_and_default_weights():
    scores, metrics = score_batch(RESPONSES, LABELS, ["gsm8k"], None, [True, False, True, False], 0.5)
    # gsm8k: 72 -> 1, 71 -> 0, 72 -> 1, empty -> 0; cut responses lose 0.5
    assert scores == pytest.approx([1.0, -0.5, 1.0, -0.5])
    assert metrics["reward/missing_eos"] == 2


def test_failing_user_function_scores_zero_and_is_counted(tmp_path):
    path = tmp_path / "flaky.py"
    path.write_text(textwrap.dedent(
        """
        import sys
        def flaky(response, label):
            if response == "raise":
                raise KeyError("no such field")
            if response == "nan":
                return float("nan")
            if response == "text":
                return "high"
            if response == "exit":
                sys.exit(1)
            return 2.0
        """
    ))
    responses = ["ok", "raise", "nan", "text", "exit", "ok"]
    scores, metrics = score_batch(responses, ["l"] * 6, [f"{path}:flaky", "format"])
    assert scores == [2.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    assert metrics["reward/flaky/failed"] == 4
    assert metrics["reward/flaky/timed_out"] == 0
    assert metrics["reward/flaky/mean"] == pytest.approx(4 / 6)


def test_empty_batch():
    assert score_batch([], [], ["gsm8k"]) == ([], {
        "reward/gsm8k/mean": 0.0, "reward/gsm8k/failed": 0.0, "reward/gsm8k/timed_out": 0.0,
        "reward/missing_eos": 0.0, "reward/score/mean": 0.0,
    })


def test_256_short_responses_are_fast():
    responses = [f"<think>x</think><answer>#### {i}</answer>" for i in range(256)]
    start = time.perf_counter()
    scores, _ = score_batch(responses, [str(i) for i in range(256)], ["gsm8k", "format"])
    assert time.perf_counter() - start < 1.0  # about 5 ms: the timer costs microseconds per call
    assert scores == [2.0] * 256


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="2 responses, 1 labels"):
        score_batch(["a", "b"], ["a"], ["gsm8k"])
    with pytest.raises(ValueError, match="finished_with_eos"):
        score_batch(["a"], ["a"], ["gsm8k"], finished_with_eos=[True, False])


def test_validate_verifiers():
    validate_verifiers(["acc", "format"], [0.5, 0.5])
    validate_verifiers(list(VERIFIERS))
    with pytest.raises(UserInputError, match="unknown verifier 'accuracy'"):
        validate_verifiers(["accuracy"])
    with pytest.raises(UserInputError, match="non-empty list"):
        validate_verifiers([])
    with pytest.raises(UserInputError, match="non-empty list"):
        validate_verifiers("acc")
    with pytest.raises(UserInputError, match="more than once"):
        validate_verifiers(["acc", "acc"])
    with pytest.raises(UserInputError, match="one number per verifier_function entry"):
        validate_verifiers(["acc", "format"], [1.0])
    with pytest.raises(UserInputError, match="finite numbers"):
        validate_verifiers(["acc"], ["1"])
