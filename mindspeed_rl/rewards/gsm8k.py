"""GSM8K verifier: 1.0 when the response's final number equals the gold answer, else 0.0.

The gold label is either the dataset's full answer ("... <<48/2=24>>24 ...\n#### 72") or just
the number ("72"); the part after the last "####" is used. In the response:
    strict     the last "#### N" (the dataset's own convention, which a trained model adopts);
    flexible   otherwise, the last number anywhere ("... so she sold $1,200.").
Numbers are compared as exact decimals after dropping "$", thousands separators and
whitespace, so "1,200" == "1200" == "1200.00" and "72." == "72".

Departures from verl's gsm8k.py: verl compares strings after the strict OR the flexible
extraction (one method per run) and keeps "1200.0" != "1200"; it also looks only at the last
300 characters (our patterns are linear, so there is no need). A thousands separator is only
recognised between groups of three digits, so the list "1,2,3" ends with 3, not 123.
"""

import re
from decimal import Decimal, InvalidOperation

# one number: optional sign and "$", digits with optional 3-digit comma groups, optional decimals
_NUMBER = r"-?(?:\$\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_FLEXIBLE = re.compile(_NUMBER)


def normalize_number(text: str) -> Decimal | None:
    """The exact value of a number written as in GSM8K ("$1,200.00", "72.", "-7"), or None."""
    cleaned = text.strip().replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_answer(response: str, method: str = "auto") -> str | None:
    """The final number a response commits to, as written, or None.

    Args:
        response: model output.
        method: "strict" (last "#### N"), "flexible" (last number anywhere) or "auto"
            (strict when the response has a "#### N", flexible otherwise).
    """
    if method in ("strict", "auto"):
        found = _STRICT.findall(response)
        if found or method == "strict":
            return found[-1] if found else None
    if method in ("flexible", "auto"):
        found = _FLEXIBLE.findall(response)
        return found[-1] if found else None
    raise ValueError(f"unknown gsm8k extraction method {method!r}; valid: auto, flexible, strict")


def gold_answer(label: str) -> str:
    """The gold number of a GSM8K label: the text after its last "####", or the label itself."""
    return label.rsplit("####", 1)[-1].strip()


def gsm8k_score(response: str, label: str) -> float:
    """1.0 if the response's final number (strict, else flexible) equals the gold number, else 0.0.

    Args:
        response: model output.
        label: "...#### 72" or "72".
    """
    predicted = extract_answer(response, "auto")
    if predicted is None:
        return 0.0
    gold = gold_answer(label)
    gold_value, predicted_value = normalize_number(gold), normalize_number(predicted)
    if gold_value is None:  # a non-numeric label: fall back to comparing the text
        return float(predicted.strip() == gold)
    return float(predicted_value is not None and predicted_value == gold_value)


def hash_answer_format_score(response: str, label: str) -> float:
    """1.0 when the response states its answer the GSM8K way, "#### N", and says nothing after it
    (trailing whitespace aside), else 0.0; correctness is gsm8k_score's job. A format reward for
    models that must first learn to answer in that form (the SmolLM2 example)."""
    matches = list(_STRICT.finditer(response))
    return float(bool(matches) and not response[matches[-1].end():].strip())
