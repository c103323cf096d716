"""Format verifier: 1.0 when a response is `<think>...</think>` then `<answer>...</answer>`, else 0.0.

The R1-style pattern `^<think>.*?</think>\\s*<answer>.*?</answer>$` (DOTALL), as the seed's
`format` verifier (MindSpeed-LLM ray_gpt) and open-r1 use it, with surrounding whitespace
allowed. It is checked without the regex: starts with <think>, ends with </answer>, and
"</think>" + whitespace + "<answer>" occurs in between. That is the same language, but linear
time (the lazy regex is quadratic on adversarial text).

Departure: the seed compiled the pattern with re.MULTILINE, so `$` also matched before any
newline and text after "</answer>\\n" was accepted; here the response must end with </answer>.
A prompt template that already ends with "<think>" needs the response to repeat it.
"""

import re

_THINK_THEN_ANSWER = re.compile(r"</think>\s*<answer>")


def format_score(response: str, label: str | None = None) -> float:
    """1.0 for `<think>...</think><answer>...</answer>` (whitespace allowed between and around), else 0.0.

    Args:
        response: model output.
        label: unused (every verifier takes (response, label)).
    """
    text = response.strip()
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return 0.0
    middle = text[len("<think>") : len(text) - len("</answer>")]
    return float(_THINK_THEN_ANSWER.search(middle) is not None)
