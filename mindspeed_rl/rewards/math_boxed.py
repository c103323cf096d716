r"""Math verifiers: the response's last \boxed{...} answer, checked against the label with math-verify.

    math   1.0 if the boxed answer is equivalent to the label (math-verify: 0.5 == \frac{1}{2},
           x+1 == 1+x, 1,000 == 1000 ...), else 0.0 (also when nothing is boxed).
    acc    the seed's (MindSpeed-LLM ray_gpt) convention: +1.0 correct, -0.5 wrong, -1.0 when the
           response has no boxed answer at all.

The label is the dataset's ground truth: bare LaTeX ("\frac{1}{2}"), a number, or text with "$"
or \boxed; a bare label is wrapped in \boxed{} so that math-verify parses all of it.

math-verify's own signal.alarm timeouts are switched off (parsing_timeout=None,
timeout_seconds=None): they would clobber the per-call timer of scoring.py, which bounds the
whole verifier call instead (so math-verify's one-time warning that its timeout is off is
filtered out of its loggers). The seed used Qwen-Math's `math_equal` in a subprocess per
answer; math-verify accepts the same equivalences and runs in-process.
"""

import importlib
import logging

_BOX_COMMANDS = ("\\boxed", "\\fbox")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeout is off; here that is intended."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def last_boxed(text: str) -> str | None:
    r"""Content of the last \boxed{...} (or \fbox{...}, or "\boxed 5") in `text`, or None.

    Braces are matched, so \boxed{\frac{1}{2}} gives "\frac{1}{2}". An unclosed brace gives None.
    """
    start, command = max((text.rfind(command), command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start + len(command) :]
    if rest.startswith(" "):  # "\boxed 5$": the answer runs to the next "$" or whitespace
        answer = rest.lstrip(" ").split("$", 1)[0].split()[:1]
        return answer[0] if answer else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


def preload() -> None:
    """Import math-verify (its LaTeX parser loads sympy and an ANTLR grammar: 2-5 s on a 2-core host).
    Not at module import, so that the driver's config check and every process that imports the rewards
    package without scoring math do not pay it; the rule-reward scorer calls this before its first batch,
    so the first verifier call is not charged for the import against its timeout."""
    importlib.import_module("math_verify")


def _as_latex(label: str) -> str:
    label = label.strip()
    return label if ("$" in label or "\\boxed" in label) else "\\boxed{" + label + "}"


def _squash(text: str) -> str:
    return "".join(text.split())


def is_equivalent(answer: str, label: str) -> bool:
    """True when the extracted `answer` and the gold `label` are the same value for math-verify."""
    if _squash(answer) == _squash(label):  # identical text: skip sympy (the common correct case)
        return True
    from math_verify import parse, verify  # preload() imported it already when a scorer runs

    gold = parse(_as_latex(label), parsing_timeout=None)
    predicted = parse("\\boxed{" + answer + "}", parsing_timeout=None)
    if not gold or not predicted:
        return False
    return bool(verify(gold, predicted, timeout_seconds=None))


def math_score(response: str, label: str) -> float:
    r"""1.0 if the last \boxed{} answer of `response` is equivalent to `label`, else 0.0."""
    answer = last_boxed(response)
    return float(answer is not None and is_equivalent(answer, label))


def acc_score(response: str, label: str) -> float:
    r"""The seed's `acc`: +1.0 correct boxed answer, -0.5 wrong one, -1.0 no \boxed answer."""
    answer = last_boxed(response)
    if answer is None:
        return -1.0
    return 1.0 if is_equivalent(answer, label) else -0.5
