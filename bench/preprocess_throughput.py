"""Preprocessing throughput (samples/s) of preprocess_data.py on GSM8K, for 1 and 2 workers.

    python bench/preprocess_throughput.py [TRAIN_JSONL] [--tokenizer DIR] [--workers 1 2] [--repeat 2]

TRAIN_JSONL defaults to ../shared/data/gsm8k/train.jsonl (relative to the repo root). The job is
the README's GSM8K recipe: R1AlpacaStyleInstructionHandler, qwen template, labels = the number
after "####". Without --tokenizer a byte-level BPE tokenizer with Qwen's special tokens is trained
on the file first (nothing is downloaded); pass a real Qwen2.5 tokenizer directory to measure it.
The `datasets` cache is warmed by one untimed run, so the numbers are encode + write time.
Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def make_bpe_tokenizer(train_file: str, out_dir: str, vocab_size: int = 8000) -> str:
    """A Qwen-like byte-level BPE (special tokens, chat markers) trained on the questions and answers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = []
    with open(train_file) as f:
        for line in f:
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out_dir)
    return out_dir


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("input", nargs="?", default=os.path.join(REPO, "..", "shared", "data", "gsm8k", "train.jsonl"))
    p.add_argument("--tokenizer", default=None, help="HF tokenizer directory (default: train a BPE on the input)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=2, help="runs per setting; the best is reported")
    args = p.parse_args(argv)
    args.input = os.path.normpath(args.input)
    if not os.path.isfile(args.input):
        print(f"preprocess_throughput.py: {args.input} does not exist; pass the GSM8K train.jsonl path.",
              file=sys.stderr)
        return 2

    from mindspeed_rl.data.preprocess import preprocess
    from mindspeed_rl.utils.logging import setup_logging

    setup_logging(role="bench", rank=None, level="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = args.tokenizer or make_bpe_tokenizer(args.input, os.path.join(tmp, "tok"))
        job = dict(input=args.input, tokenizer_name_or_path=tokenizer, handler_name="R1AlpacaStyleInstructionHandler",
                   prompt_type="qwen", map_keys={"prompt": "question", "query": "", "response": "answer"},
                   dataset_additional_keys=("labels",), label_pattern=r"####\s*(.+)$",
                   cache_dir=os.path.join(tmp, "cache"), log_interval=0)
        preprocess(output_prefix=os.path.join(tmp, "warm", "d"), **job)  # fills the datasets cache
        print(f"# {args.input}, tokenizer {'(trained BPE)' if args.tokenizer is None else tokenizer}, "
              f"{os.cpu_count()} CPUs, best of {args.repeat}")
        print(f"{'workers':>7} {'n_subs':>6} {'samples':>8} {'seconds':>8} {'samples/s':>10}")
        for workers in args.workers:
            best = None
            for r in range(args.repeat):
                result = preprocess(output_prefix=os.path.join(tmp, f"w{workers}r{r}", "d"), workers=workers, **job)
                best = result if best is None or result.seconds < best.seconds else best
            print(f"{workers:>7} {workers:>6} {best.num_written:>8} {best.seconds:>8.2f} "
                  f"{best.num_written / best.seconds:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
