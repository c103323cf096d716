"""Raw data (jsonl, json, parquet, csv, txt) -> megatron-core indexed datasets, with MindSpeed-LLM's flags.

    # GSM8K for GRPO: prompt = question (Qwen chat template), labels = the number after "####"
    python preprocess_data.py --input ./gsm8k/train.jsonl \
        --tokenizer-type PretrainedFromHF --tokenizer-name-or-path ./models/Qwen2.5-7B-Instruct \
        --handler-name R1AlpacaStyleInstructionHandler --prompt-type qwen \
        --map-keys '{"prompt": "question", "query": "", "response": "answer"}' \
        --dataset-additional-keys labels --label-pattern '####\\s*(.+)$' \
        --output-prefix ./dataset/gsm8k/train --workers 4

writes ./dataset/gsm8k/train_packed_{input_ids,attention_mask,labels}_document.bin/.idx, the
`data_path: ./dataset/gsm8k/train` of a config. Output names and contents match MindSpeed-LLM's
preprocess_data.py for the same handler and --prompt-type, so either framework reads the other's.
Bad input is one sentence on stderr and exit status 2; nothing half-written is left behind.
"""
from __future__ import annotations

import argparse
import json
import sys

# MindSpeed-LLM flags that change nothing here: accepted so existing scripts run, and reported
_IGNORED = {
    "--dataset-impl": "mmap is the only format",
    "--tokenizer-not-use-fast": "the tokenizer directory decides",
    "--make-vocab-size-divisible-by": "vocab padding is a model setting",
    "--overwrite-cache": "the datasets cache is keyed by file content",
    "--seed": "preprocessing keeps the input order; shuffling happens in training",
}


def _true_false_none(text: str):
    """MindSpeed-LLM's --enable-thinking values."""
    values = {"true": True, "false": False, "none": None}
    if text.lower() not in values:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of true, false, none")
    return values[text.lower()]


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err.msg}); e.g. '{{\"prompt\": \"question\"}}'")
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"prompt\": \"question\"}'")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="preprocess_data.py", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("input data")
    g.add_argument("--input", required=True, help="a file, glob or directory of jsonl/json/parquet/csv/txt files")
    g.add_argument("--handler-name", default="GeneralPretrainHandler",
                   help="GeneralPretrainHandler, AlpacaStyleInstructionHandler, SharegptStyleInstructionHandler, "
                        "PPOAlpacaStyleInstructionHandler, R1AlpacaStyleInstructionHandler, "
                        "R1SharegptStyleInstructionHandler")
    g.add_argument("--json-keys", nargs="+", default=["text"], help="GeneralPretrainHandler: text columns")
    g.add_argument("--map-keys", type=_json_dict, default=None,
                   help='column names, e.g. \'{"prompt": "question", "query": "", "response": "answer"}\'')
    g.add_argument("--prompt-type", default=None,
                   help="chat template: empty, qwen, qwen_r1, qwen_math_r1, chatml, qwen3, llama3, or hf (the tokenizer's)")
    g.add_argument("--enable-thinking", type=_true_false_none, default=None,
                   help="true / false / none: the thinking switch of --prompt-type qwen3 (none or false: the prompt "
                        "ends with an empty <think></think>) or hf (passed to the chat template; none = its default)")
    g.add_argument("--dataset-additional-keys", nargs="*", default=[],
                   help="R1 handlers: extra keys to store, e.g. labels (the ground truth)")
    g.add_argument("--label-pattern", default=None,
                   help="R1 handlers: keep the regex's first group of the ground truth, e.g. '####\\s*(.+)$'")
    g.add_argument("--max-samples", type=int, default=None, help="only the first N rows")
    g.add_argument("--cache-dir", default=None, help="datasets cache directory (default: its own)")
    t = p.add_argument_group("tokenizer")
    # HuggingFaceTokenizer is MindSpeed-RL's name for the same thing
    t.add_argument("--tokenizer-type", default="PretrainedFromHF", choices=["PretrainedFromHF", "HuggingFaceTokenizer"])
    t.add_argument("--tokenizer-name-or-path", required=True, help="a local Hugging Face tokenizer directory")
    t.add_argument("--trust-remote-code", action="store_true",
                   help="run the tokenizer class the directory ships as Python (tokenizer_config.json's auto_map)")
    t.add_argument("--seq-length", type=int, default=None, help="drop samples with a sequence this long or longer")
    t.add_argument("--append-eod", action="store_true", help="GeneralPretrainHandler: end documents with EOS")
    o = p.add_argument_group("output and runtime")
    o.add_argument("--output-prefix", required=True, help="path prefix of the .bin/.idx files")
    o.add_argument("--workers", type=int, default=1, help="encoding processes")
    o.add_argument("--n-subs", type=int, default=None, help="contiguous shards of the input (default: --workers)")
    o.add_argument("--log-interval", type=int, default=100, help="log progress every N rows per shard")
    for flag in _IGNORED:
        if flag in ("--tokenizer-not-use-fast", "--overwrite-cache"):
            o.add_argument(flag, action="store_const", const=True, default=None, help=argparse.SUPPRESS)
        else:
            o.add_argument(flag, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mindspeed_rl.data.preprocess import preprocess
    from mindspeed_rl.utils.errors import UserInputError
    from mindspeed_rl.utils.logging import setup_logging

    log = setup_logging(role="preprocess", rank=None)
    for flag, why in _IGNORED.items():
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            log.warning("%s has no effect here (%s)", flag, why)
    try:
        result = preprocess(
            input=args.input,
            tokenizer_name_or_path=args.tokenizer_name_or_path,
            trust_remote_code=args.trust_remote_code,
            output_prefix=args.output_prefix,
            handler_name=args.handler_name or "GeneralPretrainHandler",
            json_keys=tuple(args.json_keys),
            map_keys=args.map_keys,
            prompt_type=args.prompt_type,
            enable_thinking=args.enable_thinking,
            dataset_additional_keys=tuple(args.dataset_additional_keys),
            label_pattern=args.label_pattern,
            append_eod=args.append_eod,
            seq_length=args.seq_length,
            workers=args.workers,
            n_subs=args.n_subs,
            log_interval=args.log_interval,
            max_samples=args.max_samples,
            cache_dir=args.cache_dir,
        )
    except UserInputError as err:
        print(f"preprocess_data.py: {err}", file=sys.stderr)
        return 2
    log.info("wrote %d of %d samples in %.1f s (library imports included):", result.num_written, result.num_rows,
             result.seconds)
    for prefix in result.outputs.values():
        log.info("  %s.bin/.idx", prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
