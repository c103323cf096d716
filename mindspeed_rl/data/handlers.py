"""Dataset handlers (`--handler-name`): one raw row -> token-id sequences, one per output key.

Names, output keys and file names are MindSpeed-LLM's, so data preprocessed by either framework
loads in the other:

    handler                            reads      writes {prefix}_...                 per sample
    GeneralPretrainHandler             --json-keys {key}_document (default text)     text ids (+EOD)
    AlpacaStyleInstructionHandler      alpaca     packed_{input_ids,attention_mask,labels}_document
    SharegptStyleInstructionHandler    sharegpt     "      (labels: -100 on prompt tokens, SFT)
    PPOAlpacaStyleInstructionHandler   alpaca     packed_{input_ids,attention_mask}_document  prompt only
    R1AlpacaStyleInstructionHandler    alpaca     packed_{input_ids,attention_mask,<extra>}_document
    R1SharegptStyleInstructionHandler  sharegpt     "      (prompt + --dataset-additional-keys)

For the R1 handlers each additional key is stored as token ids without special tokens: `labels`
is the response column (the ground truth the rule verifiers need, e.g. "72"), any other key is
the raw column of that name. The trainer's PromptDataset decodes them back to strings.

Departure: `--label-pattern REGEX` (ours) keeps only the regex's first group of the ground
truth, e.g. the number after "####" in GSM8K answers, so no separate conversion step is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from mindspeed_rl.data.formats import ColumnMap, resolve_columns, to_conversation
from mindspeed_rl.data.templates import HF, check_prompt_type, encode_conversation, encode_prompt
from mindspeed_rl.utils.errors import UserInputError

IGNORE_INDEX = -100  # label of prompt tokens in supervised data (never a token id)


@dataclass(frozen=True)
class HandlerSpec:
    """What a handler reads and writes.

    Attributes:
        style: raw format: "text" (plain columns), "alpaca" or "sharegpt".
        kind: "pretrain" (text ids), "sft" (prompt + response with labels), "prompt" (prompt
            only) or "r1" (prompt + additional keys such as the ground-truth labels).
    """

    style: str
    kind: str

    @property
    def packed(self) -> bool:
        """Outputs are named {prefix}_packed_{key}_document (all but pre-training)."""
        return self.kind != "pretrain"


HANDLERS: dict[str, HandlerSpec] = {
    "GeneralPretrainHandler": HandlerSpec("text", "pretrain"),
    "AlpacaStyleInstructionHandler": HandlerSpec("alpaca", "sft"),
    "SharegptStyleInstructionHandler": HandlerSpec("sharegpt", "sft"),
    "PPOAlpacaStyleInstructionHandler": HandlerSpec("alpaca", "prompt"),
    "R1AlpacaStyleInstructionHandler": HandlerSpec("alpaca", "r1"),
    "R1SharegptStyleInstructionHandler": HandlerSpec("sharegpt", "r1"),
}


def get_handler(name: str) -> HandlerSpec:
    """The HandlerSpec of a handler name; unknown names raise listing the valid ones."""
    if name not in HANDLERS:
        raise UserInputError(f"unknown --handler-name {name!r}; valid: {', '.join(HANDLERS)}.")
    return HANDLERS[name]


@dataclass(frozen=True)
class EncodeSettings:
    """Everything a worker process needs to encode rows (picklable: no tokenizer in it)."""

    handler_name: str = "GeneralPretrainHandler"
    prompt_type: Optional[str] = None
    enable_thinking: Optional[bool] = None  # the template's thinking switch (templates.py)
    json_keys: tuple = ("text",)
    additional_keys: tuple = ()
    map_keys: Optional[dict] = None
    label_pattern: Optional[str] = None
    append_eod: bool = False
    columns: Optional[ColumnMap] = field(default=None, compare=False)  # set by `check_settings`


def output_keys(settings: EncodeSettings) -> list[str]:
    """The sequence keys a handler writes, in MindSpeed-LLM's order."""
    kind = HANDLERS[settings.handler_name].kind
    if kind == "pretrain":
        return list(settings.json_keys)
    if kind == "sft":
        return ["input_ids", "attention_mask", "labels"]
    if kind == "prompt":
        return ["input_ids", "attention_mask"]
    return ["input_ids", "attention_mask", *settings.additional_keys]


def output_name(prefix: str, handler_name: str, key: str) -> str:
    """The indexed-dataset path prefix (no .bin/.idx) of one output key."""
    packed = "_packed" if HANDLERS[handler_name].packed else ""
    return f"{prefix}{packed}_{key}_document"


def check_settings(settings: EncodeSettings, present: list[str], source: str) -> EncodeSettings:
    """Validate names and columns against the raw data before any work; returns settings with columns.

    Raises:
        UserInputError: unknown handler/template, a key or map-key that names no column, a bad regex.
    """
    spec = get_handler(settings.handler_name)
    check_prompt_type(settings.prompt_type)
    listing = ", ".join(present)
    if spec.kind == "pretrain":
        for key in settings.json_keys:
            if key not in present:
                raise UserInputError(f"--json-keys {key!r} is not a column of {source}; its columns are: {listing}.")
        return settings
    if settings.label_pattern is not None:
        try:
            re.compile(settings.label_pattern)
        except re.error as err:
            raise UserInputError(f"--label-pattern {settings.label_pattern!r} is not a valid regex ({err}).") from None
    reserved = {"input_ids", "attention_mask"}
    for key in settings.additional_keys:
        if key in reserved:
            raise UserInputError(f"--dataset-additional-keys {key!r} is written anyway; drop it.")
        if spec.kind == "r1" and key != "labels" and key not in present:
            raise UserInputError(
                f"--dataset-additional-keys {key!r} is not a column of {source}; its columns are: {listing}."
            )
    if settings.additional_keys and spec.kind != "r1":
        raise UserInputError(
            f"--dataset-additional-keys is only written by the R1 handlers, not {settings.handler_name}; "
            "use R1AlpacaStyleInstructionHandler."
        )
    needs_response = spec.kind == "sft" or (spec.kind == "r1" and "labels" in settings.additional_keys)
    first = "prompt" if spec.style == "alpaca" else "messages"
    required = (first, "response") if needs_response and spec.style == "alpaca" else (first,)
    columns = resolve_columns(spec.style, settings.map_keys, present, required, source)
    return EncodeSettings(**{**settings.__dict__, "columns": columns})


def _ground_truth(text: str, pattern: Optional[str], row: int) -> str:
    if pattern is None:
        return text
    match = re.search(pattern, text)
    if match is None:
        raise UserInputError(
            f"row {row}: --label-pattern {pattern!r} does not match its ground truth {text[-80:]!r}; "
            "fix the row or the pattern."
        )
    return (match.group(1) if match.groups() else match.group(0)).strip()


def make_encoder(settings: EncodeSettings, tokenizer) -> Callable[[dict, int], dict[str, list[int]]]:
    """A function (raw row, row index) -> {output key: token ids} for `settings` (already checked).

    Row indices are only used in error messages.
    """
    spec = HANDLERS[settings.handler_name]
    prompt_type = settings.prompt_type
    if prompt_type == HF:
        # the chat-template check happens once, here, not per row
        encode_prompt(tokenizer, HF, [{"role": "user", "content": ""}], enable_thinking=settings.enable_thinking)

    def plain(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) if text else []

    def pretrain(sample: dict, row: int) -> dict[str, list[int]]:
        out = {}
        for key in settings.json_keys:
            text = sample[key] if isinstance(sample[key], str) else str(sample[key])
            # MindSpeed-LLM tokenizes documents with the tokenizer's special tokens (BOS)
            ids = tokenizer(text)["input_ids"] if text else []
            if settings.append_eod and tokenizer.eos_token_id is not None:
                ids = ids + [tokenizer.eos_token_id]
            out[key] = ids
        return out

    def sft(sample: dict, row: int) -> dict[str, list[int]]:
        conv = to_conversation(sample, settings.columns, row)
        messages = conv["messages"] + [{"role": "assistant", "content": conv["response"]}]
        input_ids, labels = [], []
        for source_ids, target_ids in encode_conversation(tokenizer, prompt_type, messages, conv["system"],
                                                          settings.enable_thinking):
            input_ids += source_ids + target_ids
            labels += [IGNORE_INDEX] * len(source_ids) + target_ids
        return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}

    def prompt_only(sample: dict, row: int) -> dict[str, list[int]]:
        return _prompt(to_conversation(sample, settings.columns, row))

    def _prompt(conv: dict) -> dict[str, list[int]]:
        ids = encode_prompt(tokenizer, prompt_type, conv["messages"], conv["system"], settings.enable_thinking)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def r1(sample: dict, row: int) -> dict[str, list[int]]:
        conv = to_conversation(sample, settings.columns, row)
        out = _prompt(conv)
        for key in settings.additional_keys:
            if key == "labels":
                out[key] = plain(_ground_truth(conv["response"], settings.label_pattern, row))
            else:
                value = sample[key]
                out[key] = plain(value if isinstance(value, str) else str(value))
        return out

    return {"pretrain": pretrain, "sft": sft, "prompt": prompt_only, "r1": r1}[spec.kind]
