"""A random-weight Hugging Face model of a real config, with that model's tokenizer: for benchmarks on
machines a real checkpoint cannot reach (a GPU lease carries at most 64 MiB).

    python scripts/random_hf.py SRC DST [--seed 0]

SRC holds config.json (+ tokenizer files, generation_config.json, a chat template); DST gets the model
built from that config with transformers' own initialisation, saved with save_pretrained, and those
files copied beside it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

AUX = ("generation_config.json", "chat_template.jinja")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.src, "config.json")):
        print(f"random_hf: {args.src} has no config.json; pass a Hugging Face model directory.", file=sys.stderr)
        return 2
    import torch
    import transformers as tf

    torch.manual_seed(args.seed)
    model = tf.AutoModelForCausalLM.from_config(tf.AutoConfig.from_pretrained(args.src))
    model.save_pretrained(args.dst)
    copied = [n for n in sorted(os.listdir(args.src)) if n.startswith("tokenizer") or n in AUX]
    for name in copied:
        shutil.copy(os.path.join(args.src, name), args.dst)
    n = sum(p.numel() for p in model.parameters())
    print(f"random_hf: {args.dst}: {type(model).__name__}, {n / 1e6:.1f}M parameters, seed {args.seed}; "
          f"copied {', '.join(copied) or 'no tokenizer files'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
