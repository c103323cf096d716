"""Write the built-in tiny task's tokenizer and train/val prompts (mindspeed_rl/data/tiny_task.py).

    python scripts/make_tiny_task.py                 # rewrite mindspeed_rl/assets/tiny_task/
    python scripts/make_tiny_task.py --out-dir DIR   # somewhere else (the test compares the bytes)
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspeed_rl.data.tiny_task import ASSET_DIR, NUM_TRAIN, SEED, write_tiny_task  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make_tiny_task.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=ASSET_DIR)
    p.add_argument("--num-train", type=int, default=NUM_TRAIN)
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    for path in write_tiny_task(args.out_dir, args.num_train, args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
