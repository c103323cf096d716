"""The built-in tiny task (`grpo_trainer_tiny`): its tokenizer and its train/val prompts.

Task ("tiny_repeat"): the prompt "7x3=" asks for the digit 7 written 3 times; the answer is
"777" then the end token. Counts run 1..5, so answers are at most 5 tokens. The verifier
(rewards/tiny_task.py) gives partial credit per position.

Why this task: a random-init 2-layer model must learn to read the digit, count, and stop; each
of these moves the dense partial-credit reward on its own, which is what GRPO (no supervised
warm-up) needs. Copying or reversing a random digit string, tried first, stayed below 0.3 after
300 steps at the same size; this one passes 0.7 in about 150-200 steps (README, "tiny task").

Tokenizer: one token per character over "<eos>" (also the pad token), the digits, "x" and "=";
no BOS or separate padding token the model could emit invisibly (a character outside the
alphabet also maps to "<eos>"). Files are written by hand (plain
JSON with sorted keys), not by `save_pretrained`, so regenerating them gives the same bytes
under any transformers/tokenizers version; they load with `AutoTokenizer.from_pretrained`.

    python scripts/make_tiny_task.py [--out-dir DIR]   # rewrites the shipped files
"""

from __future__ import annotations

import json
import os
import random

from mindspeed_rl.rewards.tiny_task import EOS_TEXT, TASK_NAME

ASSET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "tiny_task")
TOKENIZER_DIR = os.path.join(ASSET_DIR, "tokenizer")
TRAIN_FILE = os.path.join(ASSET_DIR, "train.jsonl")
VAL_FILE = os.path.join(ASSET_DIR, "val.jsonl")

DIGITS = "0123456789"
MAX_COUNT = 5
VOCAB = [EOS_TEXT, *DIGITS, "x", "="]  # id = position; EOS is 0 and also pads
NUM_TRAIN = 2000
SEED = 1234


def prompt_and_answer(digit: str, count: int) -> tuple[str, str]:
    """("7", 3) -> ("7x3=", "777")."""
    return f"{digit}x{count}=", digit * count


def make_rows(num: int, seed: int) -> list[dict]:
    """`num` random prompts (Python's Mersenne Twister, stable across versions)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(num):
        prompt, answer = prompt_and_answer(rng.choice(DIGITS), rng.randint(1, MAX_COUNT))
        rows.append({"prompt": prompt, "labels": answer, "data_source": TASK_NAME})
    return rows


def val_rows() -> list[dict]:
    """Every (digit, count) once: validation measures the whole task."""
    return [
        {"prompt": p, "labels": a, "data_source": TASK_NAME}
        for p, a in (prompt_and_answer(d, k) for k in range(1, MAX_COUNT + 1) for d in DIGITS)
    ]


def tokenizer_files() -> dict[str, dict]:
    """The tokenizer's files: {file name: JSON object}."""
    added = [
        {"id": 0, "content": EOS_TEXT, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
    ]
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        # every character is its own token
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},  # join tokens without spaces
        "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(VOCAB)}, "unk_token": EOS_TEXT},
    }
    special = {"eos_token": EOS_TEXT, "pad_token": EOS_TEXT}
    config = {
        **special,
        "added_tokens_decoder": {"0": {k: v for k, v in added[0].items() if k != "id"}},
        "bos_token": None,
        "chat_template": "{% for message in messages %}{{ message['content'] }}{% endfor %}",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 64,
        "padding_side": "left",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": config, "special_tokens_map.json": special}


def _dump(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def write_tiny_task(out_dir: str = ASSET_DIR, num_train: int = NUM_TRAIN, seed: int = SEED) -> list[str]:
    """Write tokenizer/, train.jsonl and val.jsonl under out_dir. Returns the paths written."""
    os.makedirs(os.path.join(out_dir, "tokenizer"), exist_ok=True)
    written = []
    for name, obj in tokenizer_files().items():
        written.append(os.path.join(out_dir, "tokenizer", name))
        _write(written[-1], _dump(obj))
    for name, rows in (("train.jsonl", make_rows(num_train, seed)), ("val.jsonl", val_rows())):
        written.append(os.path.join(out_dir, name))
        _write(written[-1], "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return written
