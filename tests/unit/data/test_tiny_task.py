"""The tiny task: shipped files are what the script makes, the tokenizer loads, the verifier scores."""

import filecmp
import os
import runpy
import sys

import pytest
from data_helpers import REPO

from mindspeed_rl.data.tiny_task import ASSET_DIR, TOKENIZER_DIR, make_rows, val_rows
from mindspeed_rl.rewards.tiny_task import TASK_NAME, compute_score


def test_regenerated_files_are_byte_identical(tmp_path, monkeypatch):
    out = tmp_path / "tiny"
    script = os.path.join(REPO, "scripts", "make_tiny_task.py")
    monkeypatch.setattr(sys, "argv", [script, "--out-dir", str(out)])
    with pytest.raises(SystemExit) as done:  # the script as `python scripts/make_tiny_task.py` runs it
        runpy.run_path(script, run_name="__main__")
    assert done.value.code == 0
    names = ["train.jsonl", "val.jsonl", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
             "tokenizer/special_tokens_map.json"]
    for name in names:
        assert filecmp.cmp(out / name, os.path.join(ASSET_DIR, name), shallow=False), name


def test_tokenizer_loads_with_autotokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    ids = tok.encode("7x3=777")
    assert len(ids) == 7 and tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "7x3=777"
    assert tok.pad_token_id == tok.eos_token_id == 0 and len(tok) == 13
    assert tok.apply_chat_template([{"role": "user", "content": "7x3="}], tokenize=False) == "7x3="


def test_data_is_the_task():
    rows = make_rows(500, seed=1)
    assert all(r["labels"] == r["prompt"][0] * int(r["prompt"][2]) for r in rows)
    assert {r["data_source"] for r in rows} == {TASK_NAME} and len(val_rows()) == 50


@pytest.mark.parametrize("response,label,score", [
    ("777", "777", 1.0), ("77", "777", 2 / 3), ("7777", "777", 3 / 4), ("707", "777", 2 / 3),
    ("", "777", 0.0), ("777<eos>12", "777", 1.0), (" 777 ", "777", 1.0), ("x", "", 0.0), ("", "", 1.0),
])
def test_verifier_partial_credit(response, label, score):
    assert compute_score(response, label) == pytest.approx(score)
