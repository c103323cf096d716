"""Bad input: one plain sentence naming the file/line/key and the fix; nothing half-written is left."""

import os
import subprocess
import sys

import pytest
from data_helpers import GSM8K_SLICE, REPO, write_jsonl

from mindspeed_rl.data.preprocess import preprocess
from mindspeed_rl.data.prompt_dataset import build_prompt_dataset
from mindspeed_rl.data.tokenizer import load_tokenizer
from mindspeed_rl.utils.errors import UserInputError

R1 = dict(handler_name="R1AlpacaStyleInstructionHandler", dataset_additional_keys=("labels",),
          map_keys={"prompt": "question", "query": "", "response": "answer"})


def _listing(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def test_malformed_jsonl_line_names_file_and_line(tmp_path, qwen_tokenizer_dir, hf_cache):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n{"question": "c", "answ\n')
    with pytest.raises(UserInputError, match=rf"{src} line 3 is not valid JSON .*; fix or remove it"):
        preprocess(str(src), qwen_tokenizer_dir, str(tmp_path / "out" / "d"), cache_dir=hf_cache, **R1)
    assert _listing(tmp_path / "out") == []


def test_map_key_that_is_not_a_column_lists_columns(tmp_path, qwen_tokenizer_dir, hf_cache):
    bad = dict(R1, map_keys={"prompt": "problem", "response": "answer"})
    with pytest.raises(UserInputError, match=r"--map-keys 'prompt': column 'problem' is not in .*train.jsonl; "
                                             r"its columns are: question, answer\."):
        preprocess(GSM8K_SLICE, qwen_tokenizer_dir, str(tmp_path / "d"), cache_dir=hf_cache, **bad)


def test_missing_default_column_suggests_map_keys(tmp_path, qwen_tokenizer_dir, hf_cache):
    with pytest.raises(UserInputError, match=r"no column 'instruction' .* pass --map-keys"):
        preprocess(GSM8K_SLICE, qwen_tokenizer_dir, str(tmp_path / "d"), cache_dir=hf_cache,
                   handler_name="PPOAlpacaStyleInstructionHandler")


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_dataset(tmp_path, qwen_tokenizer_dir, hf_cache, content):
    src = tmp_path / "empty.jsonl"
    src.write_text(content)
    with pytest.raises(UserInputError, match=r"empty|no samples"):
        preprocess(str(src), qwen_tokenizer_dir, str(tmp_path / "out" / "d"), cache_dir=hf_cache, **R1)
    assert _listing(tmp_path / "out") == []


def test_unknown_handler_lists_valid_ones(tmp_path, qwen_tokenizer_dir):
    with pytest.raises(UserInputError, match=r"unknown --handler-name 'R1Handler'; valid: GeneralPretrainHandler, "):
        preprocess(GSM8K_SLICE, qwen_tokenizer_dir, str(tmp_path / "d"), handler_name="R1Handler")


@pytest.mark.parametrize("kind", ["missing", "file", "empty_dir", "garbage"])
def test_tokenizer_path_that_is_not_a_tokenizer(tmp_path, kind):
    path = tmp_path / "tok"
    if kind == "file":
        path.write_text("hello")
    elif kind == "empty_dir":
        path.mkdir()
    elif kind == "garbage":
        path.mkdir()
        (path / "tokenizer.json").write_text("{not json")
        (path / "tokenizer_config.json").write_text("{}")
    expected = {"missing": "does not exist", "file": "is a file, not a tokenizer directory",
                "empty_dir": "is not a tokenizer directory", "garbage": "does not load as a Hugging Face tokenizer"}
    with pytest.raises(UserInputError, match=expected[kind]) as err:
        load_tokenizer(str(path), "--tokenizer-name-or-path")
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_output_directory_is_created(tmp_path, qwen_tokenizer_dir, hf_cache):
    prefix = tmp_path / "a" / "b" / "gsm"
    result = preprocess(GSM8K_SLICE, qwen_tokenizer_dir, str(prefix), cache_dir=hf_cache, max_samples=3, **R1)
    assert result.num_written == 3
    assert _listing(prefix.parent) == sorted(f"gsm_packed_{k}_document{e}" for k in ("attention_mask", "input_ids", "labels")
                                             for e in (".bin", ".idx"))


def test_unwritable_output_directory_is_a_plain_error(tmp_path, qwen_tokenizer_dir, hf_cache):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserInputError, match="cannot create directory"):
        preprocess(GSM8K_SLICE, qwen_tokenizer_dir, str(blocker / "sub" / "gsm"), cache_dir=hf_cache, max_samples=3, **R1)


@pytest.mark.parametrize("workers", [1, 2])
def test_failure_midway_leaves_nothing_behind(tmp_path, qwen_tokenizer_dir, hf_cache, workers):
    rows = [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(40)]
    rows[33]["answer"] = "no marker here"
    src = write_jsonl(tmp_path / "raw.jsonl", rows)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UserInputError, match=r"raw.jsonl: row 34: --label-pattern .* does not match"):
        preprocess(src, qwen_tokenizer_dir, str(out / "d"), cache_dir=hf_cache, label_pattern=r"####\s*(.+)$",
                   workers=workers, n_subs=2, **R1)
    assert _listing(out) == []


@pytest.fixture()
def long_prompts(tmp_path):
    rows = [{"prompt": "1 2 3", "labels": "a"}, {"prompt": " ".join(["7"] * 40), "labels": "b"},
            {"prompt": "4 5", "labels": "c"}]
    return write_jsonl(tmp_path / "p.jsonl", rows)


def test_truncation_modes(long_prompts, qwen_tokenizer):
    full = build_prompt_dataset(long_prompts, qwen_tokenizer, 1000)
    long_ids = full[1]["prompt_ids"].tolist()
    with pytest.raises(UserInputError, match=r"p.jsonl.*sample 1 has a \d+-token prompt, over max_prompt_length 8 "
                                             r"\(1 such\); raise max_prompt_length or set truncation"):
        build_prompt_dataset(long_prompts, qwen_tokenizer, 8, truncation="error")
    left = build_prompt_dataset(long_prompts, qwen_tokenizer, 8, truncation="left")
    right = build_prompt_dataset(long_prompts, qwen_tokenizer, 8, truncation="right")
    assert left[1]["prompt_ids"].tolist() == long_ids[-8:] and right[1]["prompt_ids"].tolist() == long_ids[:8]
    assert left.num_truncated == right.num_truncated == 1 and len(left) == 3
    kept = build_prompt_dataset(long_prompts, qwen_tokenizer, 8, truncation="filter")
    assert kept.num_filtered == 1 and [kept[i]["label"] for i in range(len(kept))] == ["a", "c"]
    with pytest.raises(UserInputError, match="no prompts left"):
        build_prompt_dataset(long_prompts, qwen_tokenizer, 1, truncation="filter")
    with pytest.raises(UserInputError, match="unknown truncation 'middle'; valid: error, left, right, filter"):
        build_prompt_dataset(long_prompts, qwen_tokenizer, 8, truncation="middle")


def test_trainer_data_path_errors(tmp_path, long_prompts, qwen_tokenizer):
    with pytest.raises(UserInputError, match=r"no indexed dataset there .* pass the --output-prefix"):
        build_prompt_dataset(str(tmp_path / "nothing"), qwen_tokenizer, 8)
    with pytest.raises(UserInputError, match=r"has no column 'question' \(prompt_key\); its columns are: prompt, labels"):
        build_prompt_dataset(long_prompts, qwen_tokenizer, 100, prompt_key="question")
    with pytest.raises(UserInputError, match="weight 'x' must be a positive number"):
        build_prompt_dataset(f"x,{long_prompts},1,{long_prompts}", qwen_tokenizer, 100)


def test_cli_prints_one_line_and_exits_2(tmp_path, qwen_tokenizer_dir):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "preprocess_data.py"), "--input", str(tmp_path / "nope.jsonl"),
         "--tokenizer-name-or-path", qwen_tokenizer_dir, "--output-prefix", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    missing = str(tmp_path / "nope.jsonl")
    assert proc.stderr.strip().splitlines()[-1] == f"preprocess_data.py: --input {missing!r} matches no file; check the path."
    assert "Traceback" not in proc.stderr
