"""Draw the reward curve (and response length) of a run from its metrics.jsonl into a PNG.

    python scripts/plot_metrics.py outputs/grpo_trainer_tiny/metrics.jsonl -o docs/tiny_reward.png
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", help="a run's metrics.jsonl")
    p.add_argument("-o", "--output", default="reward.png")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    try:
        with open(args.metrics, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        print(f"plot_metrics.py: cannot read {args.metrics}: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(f"plot_metrics.py: {args.metrics} has no steps yet.", file=sys.stderr)
        return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(steps, [r["grpo/score/mean"] for r in rows], label="train score (mean)")
    val = [(r["step"], r["val/score/mean"]) for r in rows if "val/score/mean" in r]
    if val:
        ax1.plot(*zip(*val), "o-", label="validation score (greedy)")
    ax1.set_xlabel("step")
    ax1.set_ylabel("score")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(steps, [r.get("response_length/mean", float("nan")) for r in rows])
    ax2.set_xlabel("step")
    ax2.set_ylabel("response length (tokens)")
    ax2.grid(alpha=0.3)
    fig.suptitle(args.title or args.metrics)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
