"""The reward of bench/grpo_step.py, shared verbatim by both trainers (pure Python, stdlib only).

Prompts are the tiny task's ("7x3=", label "777"); the response is scored by the parity of its
characters: the share of characters whose code point has the same parity as the prompt's digit.
Digits themselves have the parity of their value, so "777..." scores 1.0 for "7x3=".

    score = #{c in response : ord(c) % 2 == digit % 2} / len(response)      (0.0 for an empty response)

Why this reward: the benchmark's vocabulary is large (bench/grpo_step.py) so a random-init model
rarely stops early and every response runs the full max_new_tokens on both sides; a
tiny-task exact-match reward would then be ~0 for everyone. Parity scores ~0.5 from the first
step with a real spread inside each group (non-zero advantages), is learnable (read the digit,
pick a half of the vocabulary), and costs microseconds.

Our trainer loads it as `verifier_function: ["<this file>:compute_score"]`; TRL's side wraps it
in its reward-function signature (bench/_trl_side.py).
"""


def compute_score(response: str, label: str) -> float:
    """Parity share of a response against the tiny task's label.

    Args:
        response: the decoded response (special tokens already skipped).
        label: the tiny task's answer, e.g. "777" (its first character is the digit).

    Returns:
        A float in [0, 1].
    """
    if not response or not label:
        return 0.0
    want = int(label.strip()[0]) % 2
    return sum(1 for c in response if ord(c) % 2 == want) / len(response)
