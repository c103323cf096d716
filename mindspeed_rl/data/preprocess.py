"""Raw data -> megatron-core indexed datasets: the library behind preprocess_data.py.

    raw files --datasets--> rows --cut into n_subs contiguous shards--> a pool of `workers`
    processes encodes each shard into its own staged .bin/.idx --> merged in shard order
    --> renamed into place

Everything is checked (handler, template, columns, tokenizer) before the first row is encoded.
The output depends only on the rows and their order, so any (workers, n_subs) gives the same
bytes. MindSpeed-LLM runs one pool over all CPUs when --n-subs > 1; here --workers sizes the pool
and --n-subs defaults to it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Optional

from mindspeed_rl.data.handlers import (
    EncodeSettings,
    check_settings,
    get_handler,
    make_encoder,
    output_keys,
    output_name,
)
from mindspeed_rl.data.indexed import SequenceWriter, import_megatron_indexed, publish, staging_dir
from mindspeed_rl.data.raw import load_raw_dataset
from mindspeed_rl.data.templates import check_prompt_type, thinking_problem
from mindspeed_rl.data.tokenizer import load_tokenizer
from mindspeed_rl.utils.errors import UserInputError
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)


@dataclass
class PreprocessResult:
    """What a run wrote. outputs: {key: final prefix}; seconds covers reading + encoding + writing."""

    outputs: dict
    num_rows: int
    num_written: int
    num_skipped: int
    seconds: float


@dataclass(frozen=True)
class _ShardTask:
    index: int
    start: int  # first row's 0-based index in the whole input
    data: object  # datasets.Dataset slice (pickles as a reference to its Arrow cache files)
    tokenizer_path: str
    trust_remote_code: bool
    settings: EncodeSettings
    seq_length: Optional[int]
    stage: str
    source: str
    log_interval: int


_TOKENIZERS: dict = {}  # per worker process: path -> tokenizer


def _encode_shard(task: _ShardTask) -> tuple[dict, int, int]:
    """Encode one shard into staged datasets. Returns ({key: staged prefix}, written, skipped)."""
    if task.tokenizer_path not in _TOKENIZERS:
        _TOKENIZERS[task.tokenizer_path] = load_tokenizer(task.tokenizer_path, "--tokenizer-name-or-path",
                                                          task.trust_remote_code, "--trust-remote-code")
    encode = make_encoder(task.settings, _TOKENIZERS[task.tokenizer_path])
    keys = output_keys(task.settings)
    writers = {key: SequenceWriter(os.path.join(task.stage, f"part{task.index:05d}_{key}")) for key in keys}
    written = skipped = 0
    t0 = time.perf_counter()
    for offset, sample in enumerate(task.data):
        row = task.start + offset + 1  # 1-based: the line number of a single jsonl file
        try:
            out = encode(sample, row)
        except UserInputError as err:
            raise UserInputError(f"{task.source}: {err}") from None
        # MindSpeed-LLM drops a sample when any of its sequences reaches seq_length
        if task.seq_length and any(len(out[key]) >= task.seq_length for key in keys):
            skipped += 1
            continue
        for key in keys:
            writers[key].add(out[key])
        written += 1
        if task.log_interval and (offset + 1) % task.log_interval == 0:
            rate = (offset + 1) / max(time.perf_counter() - t0, 1e-9)
            log.info("shard %d: %d rows (%.0f rows/s)", task.index, offset + 1, rate)
    for writer in writers.values():
        writer.finalize()
    return {key: w.prefix for key, w in writers.items()}, written, skipped


def _shard_bounds(n: int, n_subs: int) -> list[tuple[int, int]]:
    """n rows cut into n_subs contiguous, near-equal [start, end) ranges (no empty ones)."""
    n_subs = max(1, min(n_subs, n))
    step, extra = divmod(n, n_subs)
    bounds, start = [], 0
    for k in range(n_subs):
        end = start + step + (1 if k < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def preprocess(
    input: str,
    tokenizer_name_or_path: str,
    output_prefix: str,
    handler_name: str = "GeneralPretrainHandler",
    json_keys: tuple = ("text",),
    map_keys: Optional[dict] = None,
    prompt_type: Optional[str] = None,
    enable_thinking: Optional[bool] = None,
    dataset_additional_keys: tuple = (),
    label_pattern: Optional[str] = None,
    append_eod: bool = False,
    seq_length: Optional[int] = None,
    workers: int = 1,
    n_subs: Optional[int] = None,
    log_interval: int = 100,
    max_samples: Optional[int] = None,
    cache_dir: Optional[str] = None,
    trust_remote_code: bool = False,
) -> PreprocessResult:
    """Tokenize raw data with a handler and write megatron-core indexed datasets.

    Args:
        input: a file, glob or directory of jsonl/json/parquet/csv/txt files.
        tokenizer_name_or_path: a local Hugging Face tokenizer directory.
        output_prefix: outputs go to {output_prefix}[_packed]_{key}_document.bin/.idx; its
            directory is created if missing.
        handler_name: a key of handlers.HANDLERS.
        json_keys: GeneralPretrainHandler: the text columns to write.
        map_keys: {part name: column} for alpaca/sharegpt data (formats.py).
        prompt_type: a chat template name (templates.py) or "hf"; None = the text as it is.
        enable_thinking: the thinking switch of a reasoning template or of "hf" (templates.py).
        dataset_additional_keys: R1 handlers: extra keys to store (e.g. ("labels",)).
        label_pattern: R1 handlers: keep this regex's first group of the ground truth.
        append_eod: GeneralPretrainHandler: end each document with EOS.
        seq_length: drop samples with a sequence of this many tokens or more.
        workers: encoding processes.
        n_subs: contiguous shards (default: workers).
        log_interval: log progress every this many rows per shard (0 = never).
        max_samples: only the first this many rows.
        cache_dir: the `datasets` cache directory.
        trust_remote_code: run the tokenizer class the directory ships as Python (tokenization_*.py).

    Returns:
        PreprocessResult.

    Raises:
        UserInputError: bad input. Names, columns and the tokenizer are checked before any row is
            encoded; a row that fails later (e.g. --label-pattern) stops the run, and nothing of
            it is left behind (the output directory, if created, stays empty).
    """
    t0 = time.perf_counter()
    if workers < 1 or (n_subs is not None and n_subs < 1):
        raise UserInputError(f"--workers {workers} and --n-subs {n_subs} must be at least 1.")
    if max_samples is not None and max_samples < 1:
        raise UserInputError(f"--max-samples {max_samples} must be at least 1.")
    if seq_length is not None and seq_length < 2:
        raise UserInputError(f"--seq-length {seq_length} must be at least 2.")
    settings = EncodeSettings(
        handler_name=handler_name,
        prompt_type=prompt_type,
        enable_thinking=enable_thinking,
        json_keys=tuple(json_keys),
        additional_keys=tuple(dataset_additional_keys or ()),
        map_keys=dict(map_keys) if map_keys else None,
        label_pattern=label_pattern,
        append_eod=append_eod,
    )
    # cheap name checks before the tokenizer and the data are loaded; columns are checked after
    get_handler(handler_name)
    check_prompt_type(prompt_type)
    thinking = thinking_problem(prompt_type, enable_thinking, "--prompt-type", "--enable-thinking")
    if thinking:
        raise UserInputError(thinking)
    tokenizer = load_tokenizer(tokenizer_name_or_path, "--tokenizer-name-or-path", trust_remote_code, "--trust-remote-code")
    _TOKENIZERS[os.fspath(tokenizer_name_or_path)] = tokenizer  # reused in-process and by forked workers
    import_megatron_indexed()  # once here, not once per forked worker (seconds each)
    data = load_raw_dataset(input, cache_dir=cache_dir, max_samples=max_samples)
    settings = check_settings(settings, present=list(data.column_names), source=input)
    make_encoder(settings, tokenizer)  # template checks (e.g. "hf" needs a chat_template) once, up front

    keys = output_keys(settings)
    finals = {key: output_name(output_prefix, handler_name, key) for key in keys}
    bounds = _shard_bounds(len(data), n_subs or workers)
    log.info("encoding %d rows of %s with %s in %d shard(s), %d worker(s)",
             len(data), input, handler_name, len(bounds), workers)
    with staging_dir(output_prefix) as stage:
        tasks = [
            _ShardTask(k, start, data.select(range(start, end)) if len(bounds) > 1 else data,
                       os.fspath(tokenizer_name_or_path), trust_remote_code, settings, seq_length, stage, input,
                       log_interval)
            for k, (start, end) in enumerate(bounds)
        ]
        if workers == 1 or len(tasks) == 1:
            results = [_encode_shard(t) for t in tasks]
        else:
            # fork: workers inherit the imported modules (spawn would re-import torch per worker).
            # ProcessPoolExecutor, not Pool: a worker that dies raises BrokenProcessPool instead of hanging.
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=multiprocessing.get_context(method)) as pool:
                results = list(pool.map(_encode_shard, tasks))
        written = sum(r[1] for r in results)
        skipped = sum(r[2] for r in results)
        if written == 0:
            raise UserInputError(
                f"every one of the {len(data)} samples of {input} has a sequence of --seq-length {seq_length} "
                "tokens or more, so nothing would be written; raise --seq-length."
            )
        staged = {}
        for key in keys:
            merged = os.path.join(stage, f"merged_{key}")
            writer = SequenceWriter(merged)
            for parts, _, _ in results:
                writer.add_dataset(parts[key])
            writer.finalize()
            staged[merged] = finals[key]
        publish(staged)
    if skipped:
        log.warning("skipped %d of %d samples with a sequence of --seq-length %s tokens or more",
                    skipped, len(data), seq_length)
    return PreprocessResult(finals, len(data), written, skipped, time.perf_counter() - t0)
