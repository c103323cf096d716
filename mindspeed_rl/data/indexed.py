"""Megatron-core indexed datasets (.bin/.idx): atomic writing and MindSpeed-LLM-style prefix lookup.

Files are written with megatron-core's IndexedDatasetBuilder (int32 ids, one document per
sample, as MindSpeed-LLM writes them), first into a hidden staging directory next to the output,
then renamed into place: a failed or interrupted run leaves no half-written dataset behind.

A data prefix names a group of datasets:
    {prefix}_packed_{key}_document.bin/.idx   instruction / RL data, one file pair per key
    {prefix}.bin/.idx                          one dataset (e.g. pre-training {out}_text_document)
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from mindspeed_rl.utils.errors import UserInputError

DTYPE = np.int32  # MindSpeed-LLM's: int32 holds -100 (ignored labels) and any vocab


def import_megatron_indexed():
    """megatron-core's indexed_dataset module.

    It needs only torch + numpy (no CUDA, no platform shim); imported lazily so that importing
    the data package does not pay for megatron.
    """
    from megatron.core.datasets import indexed_dataset

    return indexed_dataset


class SequenceWriter:
    """Writes one indexed dataset (one sequence per document) at `prefix`.bin/.idx."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._builder = import_megatron_indexed().IndexedDatasetBuilder(prefix + ".bin", dtype=DTYPE)

    def add(self, ids: list[int]) -> None:
        """Append one sample as its own document."""
        arr = np.asarray(ids, dtype=DTYPE)
        self._builder.add_document(arr, [arr.size])

    def add_dataset(self, prefix: str) -> None:
        """Append every document of the dataset at `prefix` (byte copy, as in MindSpeed-LLM's merge)."""
        self._builder.add_index(prefix)

    def finalize(self) -> None:
        self._builder.finalize(self.prefix + ".idx")


@contextmanager
def staging_dir(output_prefix: str) -> Iterator[str]:
    """A hidden temp directory next to the output; removed on exit, whether or not the work succeeded.

    Raises:
        UserInputError: the output's directory cannot be created.
    """
    out_dir = os.path.dirname(os.path.abspath(output_prefix))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise UserInputError(
            f"--output-prefix {output_prefix!r}: cannot create directory {out_dir!r} ({err.strerror}); "
            "pick a writable location."
        ) from None
    tmp = tempfile.mkdtemp(prefix=".preprocess-", dir=out_dir)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: dict[str, str]) -> None:
    """Move staged datasets into place: {staged prefix: final prefix}. Renames are atomic per file."""
    for src, dst in staged.items():
        for ext in (".bin", ".idx"):
            os.replace(src + ext, dst + ext)


# ---------------------------------------------------------------------------- reading
def exists(prefix: str) -> bool:
    return os.path.isfile(prefix + ".idx") and os.path.isfile(prefix + ".bin")


def packed_keys(prefix: str) -> list[str]:
    """The keys of the {prefix}_packed_{key}_document datasets that exist, sorted."""
    pattern = re.compile(re.escape(os.path.basename(prefix)) + r"_packed_(.+)_document\.idx$")
    keys = []
    for path in glob.glob(glob.escape(prefix) + "_packed_*_document.idx"):
        match = pattern.match(os.path.basename(path))
        if match and os.path.isfile(path[: -len(".idx")] + ".bin"):
            keys.append(match.group(1))
    return sorted(keys)


def open_dataset(prefix: str):
    """megatron-core IndexedDataset at `prefix` (memory-mapped)."""
    return import_megatron_indexed().IndexedDataset(prefix, multimodal=False, mmap=True)


def open_prefix(prefix: str, what: str = "data_path") -> dict:
    """Open the datasets a data prefix names.

    Returns:
        {key: IndexedDataset}: the packed keys ("input_ids", "labels", ...) of
        {prefix}_packed_{key}_document, or {"input_ids": ...} for a single dataset {prefix}.bin/.idx.

    Raises:
        UserInputError: nothing is found, or packed keys disagree on the number of samples.
    """
    keys = packed_keys(prefix)
    if keys:
        if "input_ids" not in keys:
            raise UserInputError(
                f"{what} {prefix!r} has packed keys {', '.join(keys)} but no input_ids; "
                "re-run preprocess_data.py with an instruction handler."
            )
        data = {key: open_dataset(f"{prefix}_packed_{key}_document") for key in keys}
        sizes = {key: len(d) for key, d in data.items()}
        if len(set(sizes.values())) != 1:
            raise UserInputError(
                f"{what} {prefix!r}: its packed files hold different sample counts {sizes}; re-run preprocess_data.py."
            )
        return data
    if exists(prefix):
        return {"input_ids": open_dataset(prefix)}
    raise UserInputError(
        f"{what} {prefix!r}: no indexed dataset there (looked for {prefix}_packed_*_document.idx and {prefix}.idx); "
        "pass the --output-prefix given to preprocess_data.py (for pre-training data, {prefix}_text_document)."
    )
