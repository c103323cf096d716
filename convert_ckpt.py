"""HF <-> Megatron-core checkpoint conversion, with MindSpeed-LLM's flags.

    python convert_ckpt.py --load-model-type hf --save-model-type mg \
        --load-dir ./models/Qwen2.5-7B-Instruct --save-dir ./ckpt/qwen25-7b-tp2pp2 \
        --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2 --model-type-hf qwen2

Offline conversion is optional here: `load:` takes a HF checkpoint directly and shards it at
load time. The flags are parsed and checked now; the conversion itself comes with the models
bridge (mindspeed_rl/models), and until then this says so instead of pretending.
"""
from __future__ import annotations

import argparse
import os
import sys

MODEL_TYPES_HF = ("llama2", "llama3", "qwen2", "qwen3")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="convert_ckpt.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--load-model-type", choices=("hf", "mg"), required=True)
    p.add_argument("--save-model-type", choices=("hf", "mg"), required=True)
    p.add_argument("--load-dir", required=True)
    p.add_argument("--save-dir", required=True)
    p.add_argument("--target-tensor-parallel-size", type=int, default=1)
    p.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    p.add_argument("--model-type-hf", choices=MODEL_TYPES_HF, default=None)
    p.add_argument("--params-dtype", choices=("fp32", "bf16", "fp16"), default=None)
    p.add_argument("--hf-cfg-dir", default=None, help="config.json + tokenizer to write next to an HF export")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not os.path.isdir(args.load_dir):
        print(f"convert_ckpt.py: --load-dir {args.load_dir} does not exist; point it at a checkpoint directory.", file=sys.stderr)
        return 2
    if args.target_tensor_parallel_size < 1 or args.target_pipeline_parallel_size < 1:
        print("convert_ckpt.py: --target-tensor-parallel-size and --target-pipeline-parallel-size must be at least 1.", file=sys.stderr)
        return 2
    print("convert_ckpt.py: conversion is not in this build yet (it comes with the HF <-> Megatron bridge in "
          "mindspeed_rl/models); nothing was written. Until then, give `load:` the HF directory.", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
