"""Reading raw data files (jsonl, json, parquet, csv, txt) with the `datasets` library.

`--input` / a raw `data_path` is a file, a glob, or a directory (every data file in it, sorted by
name). All files must share one format. Reading errors become one sentence naming the file and,
for JSON lines, the line number: `datasets` reports a malformed line as a pyarrow parse error
without the file name, so on failure the JSON files are scanned to find the line (no cost when
the data is fine).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Optional

from mindspeed_rl.utils.errors import UserInputError

# file suffix -> `datasets` builder name
FORMATS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
}


def is_raw_data_file(path: str) -> bool:
    """True if `path` names a data file by its suffix (used to tell files from indexed prefixes)."""
    return os.path.splitext(path)[1].lower() in FORMATS


def resolve_input_files(pattern: str, what: str = "--input") -> list[str]:
    """The data files a file / glob / directory names, sorted.

    Raises:
        UserInputError: nothing matches, no file has a known suffix, or formats are mixed.
    """
    if os.path.isdir(pattern):
        candidates = [os.path.join(pattern, n) for n in os.listdir(pattern)]
        files = sorted(f for f in candidates if os.path.isfile(f) and is_raw_data_file(f))
        if not files:
            raise UserInputError(
                f"{what} directory {pattern!r} has no data files; put files ending in "
                f"{', '.join(FORMATS)} there."
            )
    elif os.path.isfile(pattern):
        files = [pattern]
    else:
        files = sorted(f for f in glob.glob(pattern) if os.path.isfile(f))
        if not files:
            raise UserInputError(f"{what} {pattern!r} matches no file; check the path.")
    unknown = [f for f in files if not is_raw_data_file(f)]
    if unknown:
        raise UserInputError(
            f"{what} file {unknown[0]!r} has an unknown suffix; use one of {', '.join(FORMATS)}."
        )
    formats = {FORMATS[os.path.splitext(f)[1].lower()] for f in files}
    if len(formats) > 1:
        raise UserInputError(
            f"{what} {pattern!r} mixes data formats ({', '.join(sorted(formats))}); pass one format at a time."
        )
    return files


def find_bad_json_line(path: str) -> Optional[str]:
    """The first problem of a JSON-lines file as 'FILE line N: why', or None if every line is an object."""
    if path.lower().endswith(".json"):
        # a .json file may be one JSON array rather than JSON lines
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            head = f.read(4096).lstrip()
        if head.startswith("["):
            try:
                with open(path, "r", encoding="utf-8") as f:
                    json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                return f"{path} is not valid JSON ({err})"
            return None
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                why = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8"
                return f"{path} line {lineno} is not valid JSON ({why})"
            if not isinstance(obj, dict):
                return f"{path} line {lineno} is a JSON {type(obj).__name__}, not an object"
    return None


def load_raw_dataset(
    pattern: str,
    cache_dir: Optional[str] = None,
    max_samples: Optional[int] = None,
    what: str = "--input",
):
    """Read raw data files into one `datasets.Dataset` (rows in file order).

    Args:
        pattern: a file, a glob, or a directory of data files.
        cache_dir: where `datasets` keeps its Arrow cache (None = its default).
        max_samples: keep only the first this many rows (for quick runs).
        what: the option or key the path came from, named in error messages.

    Returns:
        datasets.Dataset with at least one row.

    Raises:
        UserInputError: missing/mixed/malformed files (naming file and line), or no rows.
    """
    files = resolve_input_files(pattern, what)
    builder = FORMATS[os.path.splitext(files[0])[1].lower()]
    if all(os.path.getsize(f) == 0 for f in files):
        raise UserInputError(f"{what} {pattern!r} is empty; it needs at least one sample.")

    import datasets  # heavy import, only when raw data is read

    datasets.disable_progress_bars()
    try:
        data = datasets.load_dataset(
            builder,
            data_files=files,
            split="train",
            cache_dir=os.path.expanduser(cache_dir) if cache_dir else None,
        )
    except Exception as err:  # datasets/pyarrow raise many types for bad files
        if builder == "json":
            for path in files:
                problem = find_bad_json_line(path)
                if problem:
                    raise UserInputError(f"{what}: {problem}; fix or remove it.") from None
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserInputError(f"{what} {pattern!r} could not be read as {builder} ({first_line}).") from None
    if max_samples is not None and max_samples < len(data):
        data = data.select(range(max_samples))
    if len(data) == 0:
        raise UserInputError(f"{what} {pattern!r} has no samples; it needs at least one.")
    return data
