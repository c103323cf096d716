"""One door to every verifier: `compute_score` for one response, `score_batch` for the reward worker.

A verifier is `fn(response: str, label: str) -> float`. VERIFIERS names the built-in ones; any
name containing ":" is a user function (`module.path:function` or `/path/file.py:function`,
see user_function.py). The config lists them as in the seed (MindSpeed-LLM ray_gpt):

    algorithm:
      verifier_function: ["acc", "format"]
      verifier_weight: [0.5, 0.5]

score = sum_k weight_k * verifier_k(response, label) - missing_eos_penalty * [cut at max length]

In `score_batch` a verifier that raises, returns a non-number or runs past `timeout_s` gives 0
for that response and is counted in the metrics (reward/<name>/failed, reward/<name>/timed_out);
it never stops the run. `compute_score` is the bare dispatch: it lets errors through.
"""

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mindspeed_rl.rewards.gsm8k import gsm8k_score, hash_answer_format_score
from mindspeed_rl.rewards.math_boxed import acc_score, math_score, preload as preload_math_verify
from mindspeed_rl.rewards.think_format import format_score
from mindspeed_rl.rewards.timeouts import (
    HelperProcessError,
    VerifierTimeout,
    alarm_available,
    alarm_scope,
    call_in_helper_process,
    call_with_alarm,
)
from mindspeed_rl.rewards import tiny_task
from mindspeed_rl.rewards.user_function import is_user_spec, load_user_function
from mindspeed_rl.utils.errors import UserInputError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0  # per verifier call; math-verify's own default
HELPER_START_S = 30.0  # allowance for the helper process to start (imports) on a loaded machine

VERIFIERS: dict[str, Callable[[str, str], float]] = {
    "gsm8k": gsm8k_score,  # final number, "#### N" or the last number
    "hash_format": hash_answer_format_score,  # the response ends with "#### N": 1 / 0
    "math": math_score,  # \boxed{} answer equivalent to the label (math-verify): 1 / 0
    "acc": acc_score,  # the seed's boxed accuracy: +1 correct, -0.5 wrong, -1 no \boxed
    "format": format_score,  # <think>...</think><answer>...</answer>: 1 / 0
    tiny_task.TASK_NAME: tiny_task.compute_score,  # the built-in tiny task: per-position partial credit
}


# Built-in verifiers whose library is imported on first use (math-verify: seconds), with what loads it.
PRELOAD: dict[str, Callable[[], None]] = {"math": preload_math_verify, "acc": preload_math_verify}


def preload_verifiers(names: Sequence[str]) -> None:
    """Import the libraries of the named built-in verifiers now, outside any verifier's timeout."""
    for name in names:
        PRELOAD.get(name, lambda: None)()


def resolve_verifier(name: str) -> Callable[..., float]:
    """The verifier function for a built-in name or a user spec.

    Raises:
        UserInputError: unknown name (the message lists the valid ones), or a bad user spec.
    """
    if name in VERIFIERS:
        return VERIFIERS[name]
    if is_user_spec(name):
        return load_user_function(name)
    raise UserInputError(
        f"unknown verifier {name!r} in verifier_function; valid: {', '.join(sorted(VERIFIERS))}, "
        "or a user function 'module.path:function' or '/path/file.py:function'"
    )


def compute_score(name: str, response: str, label: str) -> float:
    """Score one response with one verifier (no timeout, errors propagate).

    Args:
        name: "gsm8k", "math", "acc", "format", another key of VERIFIERS, or a user spec.
        response: the decoded response text.
        label: the ground truth as stored in the dataset (e.g. "...#### 72" or "72").

    Returns:
        The verifier's score as a float.
    """
    return float(resolve_verifier(name)(response, label))


def validate_verifiers(names: Sequence[str], weights: Sequence[float] | None = None) -> None:
    """Check the config's verifier_function / verifier_weight at start-up, before any worker runs.

    Loads every user function (so a typo fails now, not at the first reward).

    Raises:
        UserInputError: empty or duplicated names, unknown names, bad user specs, or weights that
            are not one number per verifier.
    """
    if isinstance(names, str) or not names:
        raise UserInputError(f"verifier_function must be a non-empty list of verifier names, got {names!r}")
    duplicated = sorted({n for n in names if list(names).count(n) > 1})
    if duplicated:
        raise UserInputError(f"verifier_function lists {duplicated} more than once; list each verifier once")
    for name in names:
        resolve_verifier(name)
    if weights is not None:
        if isinstance(weights, str) or len(weights) != len(names):
            raise UserInputError(
                f"verifier_weight {weights!r} must have one number per verifier_function entry ({len(names)})"
            )
        for weight in weights:
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise UserInputError(f"verifier_weight {weights!r} must hold finite numbers, got {weight!r}")


def metric_name(name: str) -> str:
    """Short name for metrics: the built-in name, or the function name of a user spec."""
    return name.rpartition(":")[2] if is_user_spec(name) else name


@dataclass
class VerifierOutcome:
    """What one verifier made of a batch: one value per response (0 where it failed)."""

    values: list[float] = field(default_factory=list)
    failed: int = 0
    timed_out: int = 0
    first_error: str | None = None


def run_verifiers(
    names: Sequence[str], responses: Sequence[str], labels: Sequence[str], timeout_s: float
) -> dict[str, VerifierOutcome]:
    """Every verifier on every response, each call bounded by `timeout_s`; never raises for a response.

    Must run in a main thread (see timeouts.py); `score_batch` moves it to the helper process otherwise.
    """
    outcomes = {}
    preload_verifiers(names)  # a fresh helper process imports math-verify here, not inside the first call's alarm
    with alarm_scope():
        for name in names:
            fn, outcome = resolve_verifier(name), VerifierOutcome()
            for response, label in zip(responses, labels):
                value, error = 0.0, None
                try:
                    value = float(call_with_alarm(fn, (response, label), timeout_s))
                    if not math.isfinite(value):
                        value, error = 0.0, f"returned {value}"
                except VerifierTimeout:
                    outcome.timed_out += 1
                except (Exception, SystemExit) as err:  # a user function calling sys.exit must not end the run
                    error = f"{type(err).__name__}: {err}"
                if error is not None:
                    outcome.failed += 1
                    outcome.first_error = outcome.first_error or error
                outcome.values.append(value)
            outcomes[name] = outcome
    return outcomes


def score_batch(
    responses: Sequence[str],
    labels: Sequence[str],
    verifier_names: Sequence[str],
    verifier_weights: Sequence[float] | None = None,
    finished_with_eos: Sequence[bool] | None = None,
    missing_eos_penalty: float = 0.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> tuple[list[float], dict[str, float]]:
    """Scores for a batch of decoded responses: weighted verifiers minus the missing-EOS penalty.

    Called from a main thread (the reward worker's actor method), verifiers run in-process under
    a SIGALRM timer; from any other thread the batch runs in a helper process (timeouts.py).

    Args:
        responses: B decoded responses.
        labels: B ground truths, as stored in the dataset.
        verifier_names: keys of VERIFIERS or user specs (validate them first with `validate_verifiers`).
        verifier_weights: one weight per verifier; None weighs each 1.0.
        finished_with_eos: B flags, False for a response cut at the length limit; None skips the penalty.
        missing_eos_penalty: subtracted from the score of every response cut at the length limit.
        timeout_s: limit for each single verifier call.

    Returns:
        (scores, metrics): B floats; metrics with, per verifier, reward/<name>/mean (over the batch,
        failures as 0), reward/<name>/failed and reward/<name>/timed_out (counts), plus
        reward/missing_eos (count) and reward/score/mean.
    """
    batch = len(responses)
    weights = [1.0] * len(verifier_names) if verifier_weights is None else list(verifier_weights)
    if len(labels) != batch or len(weights) != len(verifier_names):
        raise ValueError(
            f"score_batch got {batch} responses, {len(labels)} labels, "
            f"{len(verifier_names)} verifiers and {len(weights)} weights"
        )
    if finished_with_eos is not None and len(finished_with_eos) != batch:
        raise ValueError(f"finished_with_eos has {len(finished_with_eos)} entries for {batch} responses")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")

    args = (list(verifier_names), list(responses), list(labels), timeout_s)
    if alarm_available():
        outcomes = run_verifiers(*args)
    else:
        deadline = HELPER_START_S + batch * len(verifier_names) * (timeout_s + 0.1)
        try:
            outcomes = call_in_helper_process(run_verifiers, args, deadline)
        except VerifierTimeout:
            logger.warning("reward helper process missed its %.0f s deadline; the whole batch scores 0", deadline)
            outcomes = {n: VerifierOutcome([0.0] * batch, 0, batch) for n in verifier_names}
        except HelperProcessError as err:
            logger.warning("%s; the whole batch scores 0", err)
            outcomes = {n: VerifierOutcome([0.0] * batch, batch, 0, str(err)) for n in verifier_names}

    scores = [0.0] * batch
    metrics: dict[str, float] = {}
    for name, weight in zip(verifier_names, weights):
        outcome, key = outcomes[name], metric_name(name)
        scores = [s + weight * v for s, v in zip(scores, outcome.values)]
        metrics[f"reward/{key}/mean"] = sum(outcome.values) / max(batch, 1)
        metrics[f"reward/{key}/failed"] = float(outcome.failed)
        metrics[f"reward/{key}/timed_out"] = float(outcome.timed_out)
        if outcome.failed or outcome.timed_out:
            logger.warning(
                "verifier %s: %d of %d responses failed, %d timed out (limit %.1f s); first error: %s",
                name, outcome.failed, batch, outcome.timed_out, timeout_s, outcome.first_error,
            )
    missing_eos = 0
    if finished_with_eos is not None:
        for i, finished in enumerate(finished_with_eos):
            if not finished:
                scores[i] -= missing_eos_penalty
                missing_eos += 1
    metrics["reward/missing_eos"] = float(missing_eos)
    metrics["reward/score/mean"] = sum(scores) / max(batch, 1)
    return scores, metrics
