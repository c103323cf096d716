"""Verifier of the built-in tiny task (`tiny_repeat`): "7x3=" -> "777".

The prompt names a digit and a count; the answer is the digit written that many times. The score
gives partial credit per position, so the reward is dense from the first step: a random-init
model starts near 0.05 and GRPO alone takes it above 0.9 within a few hundred steps.

    score = (# positions i where response[i] == label[i]) / max(len(response), len(label))

Too long, too short and wrong digits all cost; only the exact answer scores 1.0.
Pure Python: no imports beyond the standard library.
"""

TASK_NAME = "tiny_repeat"
EOS_TEXT = "<eos>"  # the tiny tokenizer's end token, in case a response is decoded with it


def compute_score(response: str, label: str) -> float:
    """Partial-credit match of a response against the tiny task's answer.

    Args:
        response: the decoded response (text after an end token, if present, is ignored).
        label: the expected answer, e.g. "777".

    Returns:
        A float in [0, 1]; 1.0 only for the exact answer.
    """
    response = response.split(EOS_TEXT, 1)[0].strip()
    label = label.strip()
    longest = max(len(response), len(label))
    if longest == 0:
        return 1.0
    matches = sum(1 for got, want in zip(response, label) if got == want)
    return matches / longest
