"""The RL prompt dataset: prompts (token ids) with the ground truth the verifiers need.

`build_prompt_dataset(data_path, tokenizer, ...)` reads any of:

    ./dataset/gsm8k/train            indexed prefix from preprocess_data.py (ours or MindSpeed-LLM's):
                                     {prefix}_packed_{input_ids,labels,...}_document, or {prefix}.bin/.idx
    "1,./a/train,2,./b/train"        blend (Megatron's weight,prefix list; spaces work too)
    ./gsm8k/train.jsonl (.parquet,   a raw file, templated and tokenized on the fly (no preprocessing
    .json, .csv)                     step for small data): columns prompt_key and label_key

Per sample it yields {"prompt_ids": (P,) int64, "label": str, "source": str, "extras": dict}:
- indexed R1 data: `labels` ids decoded back to text; other additional keys go to `extras`;
- indexed SFT data (labels with -100 on the prompt): prompt = tokens before the last answer,
  label = that answer's text without special tokens (so SFT data can be used for RL too);
- prompt-only and pre-training data: label "".
`source` is the raw file's `data_source` column if it has one, else `source`, else the file or
prefix name; the reward role uses it to pick the verifier.

Prompts longer than max_prompt_length follow `truncation` (TRUNCATION); filtering and
truncation counts are logged and kept on the dataset. Blends draw round(weight share x total)
samples from each part with a seeded choice (repeating a part whose share exceeds its size),
after filtering.
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Optional

import numpy as np

from mindspeed_rl.data.indexed import open_prefix
from mindspeed_rl.data.raw import is_raw_data_file, load_raw_dataset
from mindspeed_rl.data.templates import check_prompt_type, encode_prompt, shape_messages, shaping_problem
from mindspeed_rl.utils.errors import UserInputError
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)

IGNORE_INDEX = -100

# what happens to a prompt longer than max_prompt_length
TRUNCATION: dict[str, str] = {
    "error": "stop with an error naming the first such prompt",
    "left": "keep the last max_prompt_length tokens (the end of a chat prompt, with its assistant header)",
    "right": "keep the first max_prompt_length tokens",
    "filter": "drop the prompt (the count is logged)",
}


def check_truncation(mode: str) -> None:
    if mode not in TRUNCATION:
        raise UserInputError(f"unknown truncation {mode!r}; valid: {', '.join(TRUNCATION)}.")


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(t) for t in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


# ---------------------------------------------------------------------------- parts (one per path)
class _IndexedPart:
    """Prompts of one indexed prefix (memory-mapped; labels decoded when a sample is read)."""

    def __init__(self, prefix: str, tokenizer, source: str, what: str):
        self.name, self.source, self.tokenizer = prefix, source, tokenizer
        self.data = open_prefix(prefix, what)
        self.ids = self.data["input_ids"]
        self.extra_keys = [k for k in self.data if k not in ("input_ids", "attention_mask", "labels")]
        self.sft = False
        if "labels" in self.data and len(self.ids) > 0:
            # supervised data marks prompt tokens with -100; R1 labels are plain token ids
            first = self.data["labels"].get(0, 0, 1)
            self.sft = first.size > 0 and int(first[0]) == IGNORE_INDEX

    def __len__(self) -> int:
        return len(self.ids)

    def _split_sft(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        ids, labels = self.ids[row], self.data["labels"][row]
        answer = np.flatnonzero(labels != IGNORE_INDEX)
        if answer.size == 0:
            return ids, labels[:0]
        # the last answer starts after the last prompt token before it
        prompt_tokens = np.flatnonzero(labels[: answer[-1]] == IGNORE_INDEX)
        start = int(prompt_tokens[-1]) + 1 if prompt_tokens.size else int(answer[0])
        return ids[:start], labels[start:][labels[start:] != IGNORE_INDEX]

    def lengths(self) -> np.ndarray:
        if not self.sft:
            return np.asarray(self.ids.sequence_lengths, dtype=np.int64)
        return np.array([len(self._split_sft(r)[0]) for r in range(len(self))], dtype=np.int64)

    def prompt(self, row: int) -> np.ndarray:
        return self._split_sft(row)[0] if self.sft else self.ids[row]

    def label(self, row: int) -> str:
        if self.sft:
            # the answer as the verifier wants it: without the template's end-of-turn token
            answer = self._split_sft(row)[1]
            return self.tokenizer.decode([int(t) for t in answer], skip_special_tokens=True,
                                         clean_up_tokenization_spaces=False)
        return _decode(self.tokenizer, self.data["labels"][row]) if "labels" in self.data else ""

    def extras(self, row: int) -> dict:
        return {k: _decode(self.tokenizer, self.data[k][row]) for k in self.extra_keys}

    def sources(self, row: int) -> str:
        return self.source


class _RawPart:
    """Prompts of one raw file, templated and tokenized when the dataset is built."""

    def __init__(self, path, tokenizer, source, prompt_type, prompt_key, label_key, what,
                 system_prompt=None, instruction_template=None, enable_thinking=None):
        self.name = path
        self._prompts, self._labels, self._sources = [], [], []
        # a throw-away `datasets` cache: everything is tokenized into memory here, and the
        # default cache (~/.cache) may be read-only or shared on a cluster
        with tempfile.TemporaryDirectory(prefix="mindspeed_rl_raw_") as cache:
            data = load_raw_dataset(path, cache_dir=cache, what=what)
            columns = list(data.column_names)
            for key, role in ((prompt_key, "prompt_key"), (label_key, "label_key")):
                if key is not None and key not in columns:
                    raise UserInputError(
                        f"{what} {path!r} has no column {key!r} ({role}); its columns are: {', '.join(columns)}; "
                        f"set {role} to one of them."
                    )
            has_source = "data_source" in columns
            for row, sample in enumerate(data, start=1):
                messages, system = _messages(sample[prompt_key], path, row, prompt_key)
                messages, system = shape_messages(messages, system, system_prompt, instruction_template)
                ids = encode_prompt(tokenizer, prompt_type, messages, system, enable_thinking)
                self._prompts.append(np.asarray(ids, dtype=np.int64))
                self._labels.append(_label_text(sample[label_key]) if label_key is not None else "")
                self._sources.append(str(sample["data_source"]) if has_source else source)

    def __len__(self) -> int:
        return len(self._prompts)

    def lengths(self) -> np.ndarray:
        return np.array([p.size for p in self._prompts], dtype=np.int64)

    def prompt(self, row: int) -> np.ndarray:
        return self._prompts[row]

    def label(self, row: int) -> str:
        return self._labels[row]

    def extras(self, row: int) -> dict:
        return {}

    def sources(self, row: int) -> str:
        return self._sources[row]


def _messages(cell, path: str, row: int, key: str) -> tuple[list[dict], str]:
    """A prompt cell (text, or OpenAI-style [{"role", "content"}, ...]) -> (messages, system)."""
    if isinstance(cell, str):
        return [{"role": "user", "content": cell}], ""
    if isinstance(cell, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in cell):
        system = cell[0]["content"] if cell and cell[0]["role"] == "system" else ""
        messages = [{"role": m["role"], "content": m["content"]} for m in cell[1 if system else 0:]]
        if messages and messages[-1]["role"] == "user":
            return messages, system
    raise UserInputError(
        f"{path} row {row}: column {key!r} must be text or a list of {{role, content}} messages ending with the user's."
    )


def _label_text(cell) -> str:
    # verl-style parquet keeps the answer in reward_model.ground_truth
    if isinstance(cell, dict) and "ground_truth" in cell:
        cell = cell["ground_truth"]
    return "" if cell is None else cell if isinstance(cell, str) else str(cell)


# ---------------------------------------------------------------------------- the dataset
class PromptDataset:
    """Prompts for rollouts, after filtering, blending and (lazily) truncation.

    Attributes:
        num_filtered: prompts dropped for length (truncation="filter").
        num_truncated: prompts cut to max_prompt_length (truncation="left"/"right").
    """

    def __init__(self, parts: list, index: np.ndarray, max_prompt_length: int, truncation: str,
                 num_filtered: int = 0, num_truncated: int = 0):
        self.parts = parts
        self.index = index  # (N, 2) int64: (part, row)
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.num_filtered = num_filtered
        self.num_truncated = num_truncated

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict:
        """Returns {"prompt_ids": (P,) int64 array, "label": str, "source": str, "extras": dict}."""
        part_id, row = (int(x) for x in self.index[i])
        part = self.parts[part_id]
        ids = np.asarray(part.prompt(row), dtype=np.int64)
        if ids.size > self.max_prompt_length:
            ids = ids[-self.max_prompt_length:] if self.truncation == "left" else ids[: self.max_prompt_length]
        return {"prompt_ids": ids, "label": part.label(row), "source": part.sources(row), "extras": part.extras(row)}


def parse_data_path(data_path: str) -> list[tuple[float, str]]:
    """'prefix' -> [(1.0, prefix)]; '1,a,2,b' or '1 a 2 b' -> [(1.0, a), (2.0, b)].

    Raises:
        UserInputError: an odd number of items or a weight that is not a positive number.
    """
    items = [x for x in re.split(r"[,\s]+", data_path.strip()) if x]
    if len(items) == 1:
        return [(1.0, items[0])]
    if len(items) % 2:
        raise UserInputError(
            f"data_path {data_path!r} is neither one path nor 'weight,path,weight,path' pairs; check it."
        )
    pairs = []
    for weight, path in zip(items[::2], items[1::2]):
        try:
            w = float(weight)
        except ValueError:
            w = -1.0
        if not w > 0:
            raise UserInputError(f"data_path {data_path!r}: weight {weight!r} must be a positive number.")
        pairs.append((w, path))
    return pairs


def _source_name(path: str) -> str:
    base = os.path.basename(path.rstrip("/"))
    return os.path.splitext(base)[0] if is_raw_data_file(base) else base


def build_prompt_dataset(
    data_path: str,
    tokenizer,
    max_prompt_length: int,
    truncation: str = "error",
    prompt_type: Optional[str] = None,
    prompt_key: str = "prompt",
    label_key: Optional[str] = "labels",
    source: Optional[str] = None,
    seed: int = 1234,
    what: str = "data_path",
    system_prompt: Optional[str] = None,
    instruction_template: Optional[str] = None,
    enable_thinking: Optional[bool] = None,
) -> PromptDataset:
    """Build the prompt dataset a trainer samples from.

    Args:
        data_path: an indexed prefix, a blend 'w1,prefix1,w2,prefix2', or a raw jsonl/json/parquet/csv file.
        tokenizer: the actor's tokenizer (decodes stored labels, encodes raw prompts).
        max_prompt_length: longest prompt in tokens.
        truncation: a key of TRUNCATION.
        prompt_type: raw files only: chat template name (templates.TEMPLATES, "hf"); None = text as is.
        prompt_key: raw files: the prompt column.
        label_key: raw files: the ground-truth column (None = no labels).
        source: the name put in each sample's "source" (default: the file or prefix name).
        seed: seeds the blend's draws.
        what: the config key data_path came from (data_path / val_data_path), named in errors.
        system_prompt: raw files: system prompt of samples without one (needs a prompt_type).
        instruction_template: raw files: each prompt becomes this text with {prompt} replaced by it.
        enable_thinking: raw files: the thinking switch of a reasoning template or of "hf" (templates.py).

    Returns:
        PromptDataset.

    Raises:
        UserInputError: bad paths, columns, modes, a prompt over the limit under "error", or no prompts left.
    """
    check_truncation(truncation)
    check_prompt_type(prompt_type, "prompt_type")
    problem = shaping_problem(prompt_type, system_prompt, instruction_template, enable_thinking)
    if problem:
        raise UserInputError(problem)
    if max_prompt_length < 1:
        raise UserInputError(f"max_prompt_length {max_prompt_length} must be at least 1.")
    parts, weights = [], []
    for weight, path in parse_data_path(data_path):
        name = source or _source_name(path)
        if is_raw_data_file(path):
            parts.append(_RawPart(path, tokenizer, name, prompt_type, prompt_key, label_key, what,
                                  system_prompt, instruction_template, enable_thinking))
        elif system_prompt or instruction_template is not None or enable_thinking is not None:
            raise UserInputError(f"{what} {path!r} is a preprocessed (indexed) dataset: its prompts are token ids "
                                 "already, so system_prompt / instruction_template / enable_thinking cannot shape "
                                 "them; pass them to preprocess_data.py's template instead (--enable-thinking for "
                                 "the last), or point data_path at the raw file.")
        else:
            parts.append(_IndexedPart(path, tokenizer, name, what))
        weights.append(weight)

    kept, num_filtered, num_truncated = [], 0, 0
    for part in parts:
        lengths = part.lengths()
        too_long = np.flatnonzero(lengths > max_prompt_length)
        if too_long.size and truncation == "error":
            row = int(too_long[0])
            raise UserInputError(
                f"{what} {part.name!r}: sample {row} has a {int(lengths[row])}-token prompt, over max_prompt_length "
                f"{max_prompt_length} ({too_long.size} such); raise max_prompt_length or set truncation to "
                "filter, left or right."
            )
        if truncation == "filter":
            num_filtered += int(too_long.size)
            kept.append(np.flatnonzero(lengths <= max_prompt_length))
        else:
            num_truncated += int(too_long.size)
            kept.append(np.arange(len(lengths)))
    if num_filtered:
        log.warning("%s: filtered %d prompts longer than max_prompt_length %d", what, num_filtered, max_prompt_length)
    if num_truncated:
        log.warning("%s: %s-truncated %d prompts to max_prompt_length %d", what, truncation, num_truncated,
                    max_prompt_length)

    index = _blend(kept, weights, seed)
    if len(index) == 0:
        raise UserInputError(
            f"{what} {data_path!r} has no prompts left (filtered {num_filtered} longer than max_prompt_length "
            f"{max_prompt_length}); raise max_prompt_length or check the data."
        )
    return PromptDataset(parts, index, max_prompt_length, truncation, num_filtered, num_truncated)


def _blend(kept: list[np.ndarray], weights: list[float], seed: int) -> np.ndarray:
    """(N, 2) (part, row) pairs: every kept row of a lone part, else weight-share draws per part."""
    if len(kept) == 1:
        rows = kept[0]
        return np.stack([np.zeros_like(rows), rows], axis=1).astype(np.int64)
    total = sum(len(k) for k in kept)
    share = np.asarray(weights) / sum(weights)
    rng = np.random.default_rng(seed)
    pieces = []
    for part_id, (rows, s) in enumerate(zip(kept, share)):
        want = int(round(s * total))
        if want and not len(rows):
            raise UserInputError(f"blended data_path part {part_id} has no prompts left after filtering.")
        repeats, rest = divmod(want, max(len(rows), 1))
        chosen = np.concatenate([np.tile(rows, repeats), rng.choice(rows, size=rest, replace=False)])
        pieces.append(np.stack([np.full_like(chosen, part_id), chosen], axis=1))
    return np.concatenate(pieces).astype(np.int64)
