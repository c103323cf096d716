"""gsm8k verifier: extraction rules by hand, then the acceptance check on the GSM8K train slice."""

import json
from decimal import Decimal
from pathlib import Path

import pytest

from mindspeed_rl.rewards import compute_score, gsm8k_score
from mindspeed_rl.rewards.gsm8k import extract_answer, gold_answer, normalize_number

SLICE = Path(__file__).resolve().parents[2] / "data" / "gsm8k_slice" / "train.jsonl"


@pytest.mark.parametrize(
    "response, method, expected",
    [
        ("so the total is\n#### 72", "strict", "72"),
        ("#### 5 and later 6", "auto", "5"),  # the strict form wins over a later number
        ("#### 5 and later 6", "flexible", "6"),
        ("no hashes, she has 72 apples.", "strict", None),
        ("no hashes, she has 72 apples.", "auto", "72"),
        ("It costs $1,200.50 in total", "auto", "$1,200.50"),
        ("#### $1,200", "auto", "$1,200"),
        ("the list 1,2,3", "auto", "3"),  # commas only group thousands
        ("it dropped to -7 degrees", "auto", "-7"),
        ("", "auto", None),
        ("no digits here", "auto", None),
    ],
)
def test_extract_answer(response, method, expected):
    assert extract_answer(response, method) == expected


def test_normalisation_and_gold():
    assert normalize_number("$1,200.00") == Decimal(1200)
    assert normalize_number("72.") == normalize_number("72.0") == Decimal(72)
    assert normalize_number("abc") is None
    assert gold_answer("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    assert gold_answer("72") == "72"


@pytest.mark.parametrize(
    "response, label, score",
    [
        ("#### 72", "72", 1.0),
        ("The answer is 72.0", "#### 72", 1.0),
        ("#### 1200", "#### 1,200", 1.0),
        ("She needs $1,200.", "1200", 1.0),
        ("#### 71", "72", 0.0),
        ("#### 72 and then 73", "72", 1.0),
        ("", "72", 0.0),
        ("the answer is yes", "yes", 0.0),  # a non-numeric label compares text, and no number was given
        ("#### -7", "#### -7", 1.0),
    ],
)
def test_gsm8k_score_by_hand(response, label, score):
    assert gsm8k_score(response, label) == score
    assert compute_score("gsm8k", response, label) == score


def _slice():
    rows = [json.loads(line) for line in SLICE.read_text().splitlines()]
    assert len(rows) == 200
    return rows


def test_gold_answers_on_the_train_slice():
    """Gold answers score 1 in the strict and flexible forms, 0 when the number is changed."""
    for i, row in enumerate(_slice()):
        label = row["answer"]
        reasoning, gold = label.rsplit("####", 1)
        gold = gold.strip()
        value = normalize_number(gold)
        wrong = value + 1
        plain = f"{value:,}" if i % 2 else f"{value}"  # with and without thousands separators
        for lab in (label, gold):  # the dataset's full answer, or only the number
            assert gsm8k_score(label, lab) == 1.0, (i, "the dataset answer itself")
            assert gsm8k_score(f"{reasoning}#### {plain}", lab) == 1.0, (i, "strict")
            assert gsm8k_score(f"{reasoning}So the answer is ${plain}.", lab) == 1.0, (i, "flexible")
            assert gsm8k_score(f"{reasoning}#### {wrong}", lab) == 0.0, (i, "strict, changed")
            assert gsm8k_score(f"{reasoning}So the answer is {wrong}.", lab) == 0.0, (i, "flexible, changed")


@pytest.mark.parametrize("response,score", [
    ("#### 7", 1.0), ("3 + 4 = 7\n#### 7\n", 1.0), ("#### -2.5", 1.0),
    ("#### 7 because 3 + 4", 0.0),  # says something after the answer
    ("The answer is 7.", 0.0), ("####", 0.0), ("#### <number>", 0.0),
])
def test_hash_format_score_by_hand(response, score):
    from mindspeed_rl.rewards import VERIFIERS
    from mindspeed_rl.rewards.gsm8k import hash_answer_format_score

    assert hash_answer_format_score(response, "ignored") == score
    assert VERIFIERS["hash_format"] is hash_answer_format_score


def test_arith_task_files_are_what_the_script_writes(tmp_path):
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("make_arith_task", root / "scripts" / "make_arith_task.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out-dir", str(tmp_path)]) == 0
    for name in ("train.jsonl", "val.jsonl"):
        assert (tmp_path / name).read_bytes() == (root / "mindspeed_rl" / "assets" / "arith_task" / name).read_bytes()
    import json
    rows = [json.loads(line) for line in (tmp_path / "val.jsonl").open()]
    for row in rows:
        a, op, b = row["prompt"][len("What is "):-1].split()
        assert str(int(a) + int(b) if op == "+" else int(a) - int(b)) == row["labels"]
