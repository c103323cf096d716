"""Runaway verifiers are stopped per call, in the main thread (SIGALRM) and off it (helper process)."""

import os
import signal
import textwrap
import threading
import time

import pytest

from mindspeed_rl.rewards import score_batch
from mindspeed_rl.rewards.timeouts import HelperProcessError, VerifierTimeout, call_in_helper_process

RUNAWAY = textwrap.dedent(
    r"""
    import re

    def regex(response, label):
        # catastrophic backtracking: 2^40 steps unless interrupted
        return float(re.match(r"(a+)+$", "a" * 40 + "b") is not None)

    def stubborn(response, label):
        # swallows ordinary exceptions, as sympy and math-verify do internally
        while True:
            try:
                sum(range(10_000))
            except Exception:
                pass

    def quick(response, label):
        return 1.0
    """
)


@pytest.fixture
def runaway(tmp_path):
    path = tmp_path / "runaway.py"
    path.write_text(RUNAWAY)
    return path


def test_runaway_regex_and_loop_are_stopped_in_the_main_thread(runaway):
    start = time.perf_counter()
    scores, metrics = score_batch(
        ["a", "b"], ["x", "y"], [f"{runaway}:regex", f"{runaway}:stubborn", f"{runaway}:quick"], timeout_s=0.2
    )
    assert time.perf_counter() - start < 3.0  # four calls of 0.2 s, not hours
    assert scores == [1.0, 1.0]  # only `quick` counted
    assert metrics["reward/regex/timed_out"] == 2 and metrics["reward/stubborn/timed_out"] == 2
    assert metrics["reward/regex/failed"] == 0 and metrics["reward/quick/timed_out"] == 0


def test_previous_alarm_handler_and_timer_are_restored(runaway):
    def handler(signum, frame):
        raise AssertionError("the borrowed timer fired too early")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        score_batch(["a"], ["x"], [f"{runaway}:regex"], timeout_s=0.1)
        assert signal.getsignal(signal.SIGALRM) is handler
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25.0 < left <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_off_the_main_thread_a_helper_process_scores(runaway):
    result = {}

    def work():
        result["out"] = score_batch(
            ["a", r"\boxed{72}"], ["x", "72"], [f"{runaway}:regex", "acc"], [1.0, 2.0], timeout_s=0.3
        )

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    scores, metrics = result["out"]
    assert scores == [-2.0, 2.0]  # acc: -1 without a box, +1 with the right one; regex timed out twice
    assert metrics["reward/regex/timed_out"] == 2


def test_helper_process_death_and_deadline_are_reported():
    with pytest.raises(HelperProcessError, match="exited with code 3"):
        call_in_helper_process(os._exit, (3,), deadline_s=30)
    with pytest.raises(VerifierTimeout):
        call_in_helper_process(time.sleep, (30,), deadline_s=0.5)
