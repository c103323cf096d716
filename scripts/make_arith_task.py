"""Write the small-arithmetic task of the SmolLM2 example (configs/rlxf/grpo_trainer_smollm2_135m.yaml).

    python scripts/make_arith_task.py                 # rewrite mindspeed_rl/assets/arith_task/
    python scripts/make_arith_task.py --out-dir DIR

Prompts are raw questions ("What is 7 + 8?"), labels the number. The example's
instruction_template asks for the answer after "####" and the gsm8k verifier scores it (the
last "#### N", else the last number). Why this task: a 135M instruct model gets such sums right
part of the time and rarely follows the "####" format at first, so GRPO has a signal to climb in
tens of steps on 2 CPU cores; GSM8K stays at ~0 reward at this size.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

ASSET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mindspeed_rl", "assets",
                         "arith_task")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def make_rows(n: int, seed: int) -> list[dict]:
    """n questions a op b with a, b in 1..9 (a >= b for "-", so answers are not negative)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        op = rng.choice(sorted(OPS))
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if op == "-" and a < b:
            a, b = b, a
        rows.append({"prompt": f"What is {a} {op} {b}?", "labels": str(OPS[op](a, b))})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make_arith_task.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default=ASSET_DIR)
    p.add_argument("--num-train", type=int, default=2000)
    p.add_argument("--num-val", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    for name, n, seed in (("train.jsonl", args.num_train, args.seed), ("val.jsonl", args.num_val, args.seed + 1)):
        path = os.path.join(args.out_dir, name)
        with open(path, "w") as f:
            for row in make_rows(n, seed):
                f.write(json.dumps(row, sort_keys=True) + "\n")
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
