"""Rule-based rewards: verifiers that score a decoded response against its dataset label.

Pure Python (the standard library and math-verify): no ray, torch.distributed, megatron or config
objects, so the reward worker, the driver and the tests all use the same code.

    compute_score(name, response, label) -> float          one response, one verifier
    score_batch(responses, labels, names, weights, ...)    what the reward worker calls
    validate_verifiers(names, weights)                     start-up check of the config
    load_user_function("pkg.mod:fn" | "/path/f.py:fn")     a user's own verifier
"""

from mindspeed_rl.rewards.gsm8k import gsm8k_score
from mindspeed_rl.rewards.math_boxed import acc_score, last_boxed, math_score
from mindspeed_rl.rewards.scoring import (
    DEFAULT_TIMEOUT_S,
    VERIFIERS,
    compute_score,
    preload_verifiers,
    resolve_verifier,
    score_batch,
    validate_verifiers,
)
from mindspeed_rl.rewards.think_format import format_score
from mindspeed_rl.rewards.timeouts import VerifierTimeout
from mindspeed_rl.rewards.user_function import load_user_function

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "VERIFIERS",
    "VerifierTimeout",
    "acc_score",
    "compute_score",
    "format_score",
    "gsm8k_score",
    "last_boxed",
    "load_user_function",
    "math_score",
    "preload_verifiers",
    "resolve_verifier",
    "score_batch",
    "validate_verifiers",
]
