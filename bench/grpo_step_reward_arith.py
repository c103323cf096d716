"""The reward of `bench/grpo_step.py --task arith`, shared verbatim by both trainers.

It is the SmolLM2 example's reward (configs/rlxf/grpo_trainer_smollm2_135m.yaml: verifiers gsm8k and
hash_format, weights 1.0 and 0.5), written as one function so TRL's side can call the same code:

    score = gsm8k_score(response, label) + 0.5 * hash_answer_format_score(response, label)

The two verifiers are loaded from mindspeed_rl/rewards/gsm8k.py by file path (it needs only the
standard library), so TRL's venv does not need our package installed.
"""
import importlib.util
import os

_GSM8K = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mindspeed_rl", "rewards",
                      "gsm8k.py")
_spec = importlib.util.spec_from_file_location("_bench_gsm8k", _GSM8K)
_gsm8k = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gsm8k)

FORMAT_WEIGHT = 0.5


def compute_score(response: str, label: str) -> float:
    """The right number (the last "#### N", else the last number) scores 1.0; ending with "#### N"
    adds 0.5.

    Args:
        response: the decoded response (special tokens already skipped).
        label: the answer, e.g. "15".

    Returns:
        0.0, 0.5, 1.0 or 1.5.
    """
    return _gsm8k.gsm8k_score(response, label) + FORMAT_WEIGHT * _gsm8k.hash_answer_format_score(response, label)
