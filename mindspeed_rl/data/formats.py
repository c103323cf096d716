"""Raw sample formats (alpaca, sharegpt) -> one conversation shape, and `--map-keys` checking.

Column names and defaults follow MindSpeed-LLM (LlamaFactory's dataset attributes):

    alpaca    prompt=instruction, query=input, response=output, history, system
    sharegpt  messages=conversations, system, tags={role_tag: from, content_tag: value,
              user_tag: human, assistant_tag: gpt, system_tag: system}

`--map-keys '{"prompt": "question", "query": "", "response": "answer"}'` renames them ("" or null
= not used). A conversation is {"messages": [{"role", "content"}, ...] ending with the user's
last turn, "system": str, "response": str (the final assistant text, "" if none)}.
Departure from MindSpeed-LLM: a malformed conversation is an error naming the row, where
MindSpeed-LLM silently replaces it with an empty one; tool/observation turns are not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mindspeed_rl.utils.errors import UserInputError

ALPACA_DEFAULTS = {"prompt": "instruction", "query": "input", "response": "output", "history": None, "system": None}
SHAREGPT_DEFAULTS = {"messages": "conversations", "system": None}
SHAREGPT_TAGS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "system_tag": "system",
}
STYLES = ("alpaca", "sharegpt")


@dataclass(frozen=True)
class ColumnMap:
    """Which raw column holds each part of a sample (None = not present)."""

    style: str
    columns: dict  # name -> column or None
    tags: dict  # sharegpt tags


def _text(value: Any) -> str:
    """A cell as text: None -> "", numbers -> their str (labels stored as ints in parquet)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def resolve_columns(
    style: str,
    map_keys: Optional[dict],
    present: list[str],
    required: tuple[str, ...],
    source: str,
) -> ColumnMap:
    """Apply --map-keys to the style's defaults and check every named column exists.

    Args:
        style: "alpaca" or "sharegpt".
        map_keys: {name: column} overrides; "" or None switches a part off.
        present: the raw dataset's column names.
        required: names that must resolve to a column (e.g. ("prompt", "response")).
        source: the input path, named in errors.

    Raises:
        UserInputError: an unknown map-keys name, a mapped column that is not in the data, or a
            required part with no column.
    """
    defaults = ALPACA_DEFAULTS if style == "alpaca" else SHAREGPT_DEFAULTS
    valid_names = list(defaults) + (["tags"] if style == "sharegpt" else [])
    columns, tags = dict(defaults), dict(SHAREGPT_TAGS)
    listing = ", ".join(present)
    for name, column in (map_keys or {}).items():
        if name not in valid_names:
            raise UserInputError(
                f"--map-keys name {name!r} is not used by {style}-style data; valid names: {', '.join(valid_names)}."
            )
        if name == "tags":
            unknown = sorted(set(column or {}) - set(SHAREGPT_TAGS))
            if unknown:
                raise UserInputError(
                    f"--map-keys tags has unknown tag {unknown[0]!r}; valid tags: {', '.join(SHAREGPT_TAGS)}."
                )
            tags.update(column or {})
            continue
        if column and column not in present:
            raise UserInputError(
                f"--map-keys {name!r}: column {column!r} is not in {source}; its columns are: {listing}."
            )
        columns[name] = column or None
    explicit = set(map_keys or {})
    for name, column in list(columns.items()):
        if column and column not in present:
            if name in required:
                raise UserInputError(
                    f"{source} has no column {column!r} (the default {name} column of {style}-style data); "
                    f"its columns are: {listing}; pass --map-keys '{{\"{name}\": \"COLUMN\"}}'."
                )
            if name not in explicit:
                columns[name] = None  # an optional default column that this data does not have
    for name in required:
        if not columns.get(name):
            raise UserInputError(
                f"the {name} part of each sample has no column (--map-keys sets it to empty); "
                f"map it to one of: {listing}."
            )
    return ColumnMap(style, columns, tags)


def to_conversation(sample: dict, cmap: ColumnMap, row: int) -> dict:
    """One raw row -> {"messages", "system", "response"}.

    Args:
        sample: the raw row.
        cmap: from `resolve_columns`.
        row: the row's index, named in errors.
    """
    c = cmap.columns
    if cmap.style == "alpaca":
        messages = []
        for turn in (sample.get(c["history"]) if c["history"] else None) or []:
            if not isinstance(turn, (list, tuple)) or len(turn) != 2:
                raise UserInputError(
                    f"row {row}: column {c['history']!r} must be a list of [question, answer] pairs."
                )
            messages += [{"role": "user", "content": _text(turn[0])}, {"role": "assistant", "content": _text(turn[1])}]
        parts = [_text(sample.get(c[k])) for k in ("prompt", "query") if c[k]]
        messages.append({"role": "user", "content": "\n".join(p for p in parts if p)})
        response = _text(sample.get(c["response"])) if c["response"] else ""
        system = _text(sample.get(c["system"])) if c["system"] else ""
        return {"messages": messages, "system": system, "response": response}

    t = cmap.tags
    roles = {t["user_tag"]: "user", t["assistant_tag"]: "assistant"}
    raw = sample.get(c["messages"]) or []
    system = _text(sample.get(c["system"])) if c["system"] else ""
    messages = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise UserInputError(f"row {row}: message {i} of column {c['messages']!r} is not an object.")
        role = msg.get(t["role_tag"])
        if role == t["system_tag"] and i == 0:
            system = _text(msg.get(t["content_tag"]))
            continue
        if role not in roles:
            raise UserInputError(
                f"row {row}: message {i} has role {role!r}; expected {t['user_tag']!r} or {t['assistant_tag']!r} "
                "(set other names with --map-keys '{\"tags\": {\"user_tag\": ..., \"assistant_tag\": ...}}')."
            )
        messages.append({"role": roles[role], "content": _text(msg.get(t["content_tag"]))})
    response = ""
    if messages and messages[-1]["role"] == "assistant":
        response = messages.pop()["content"]
    expected = ["user", "assistant"] * (len(messages) // 2 + 1)
    if not messages or [m["role"] for m in messages] != expected[: len(messages)] or messages[-1]["role"] != "user":
        raise UserInputError(
            f"row {row}: column {c['messages']!r} must alternate user/assistant turns starting with the user."
        )
    return {"messages": messages, "system": system, "response": response}
