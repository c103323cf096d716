"""Where `python ray_gpt.py`'s start-up goes, with and without the Ray dashboard, side by side.

    .venv/bin/python bench/startup.py               # 2 rounds x 2 variants of a 1-step tiny run, ~5 min on 2 cores
    .venv/bin/python bench/startup.py --rounds 3

Each run is a fresh `ray_gpt.py` (the tiny task, 1 step, no validation, no checkpoint) in its own local Ray
instance; rounds alternate the order of the variants, so load swings hit both:
  nodash     the default (training.ray_dashboard: false);
  dashboard  training.ray_dashboard=true (Ray's dashboard server and agent start with the instance).
Printed per variant: the medians of the run's wall time, of its `workers ready` phases (data and tokenizer,
Ray cluster and device bundles, role workers) and of the time after the last step (shutdown). Also timed, each
in a fresh interpreter: the imports the driver no longer makes at start-up (torch._dynamo, which megatron-core's
own import still loads in the model workers, and math-verify, loaded by the reward scorer only for the math and
acc verifiers). Nothing asserts a time; the host's speed moves (README: Tests and benchmarks).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {"nodash": "false", "dashboard": "true"}
READY = re.compile(r"workers ready ([0-9.]+) s after the start: data and tokenizer ([0-9.]+) s, Ray cluster and "
                   r"device bundles ([0-9.]+) s, role workers \(start, build and load the models\) ([0-9.]+) s")
COLUMNS = ("wall_s", "startup_s", "data_s", "ray_s", "workers_s", "after_last_step_s")
RUN_TIMEOUT_S = 900


def one_run(dashboard: str) -> dict:
    """One 1-step tiny run; its wall time and the phases of its `workers ready` line."""
    with tempfile.TemporaryDirectory(prefix="startup-") as out:
        cmd = [sys.executable, os.path.join(ROOT, "ray_gpt.py"), "training.train_iters=1", "training.test_freq=0",
               "training.save_final=false", f"training.ray_dashboard={dashboard}", f"training.output_dir={out}"]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "RAY_ADDRESS": "local"})
        last_step_at, lines = None, []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("done: "):
                last_step_at = time.perf_counter()
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
        wall = time.perf_counter() - start
    text = "".join(lines)
    match = READY.search(text)
    if rc != 0 or match is None or last_step_at is None:
        raise SystemExit(f"bench/startup.py: the run with ray_dashboard={dashboard} failed (exit {rc}):\n{text[-3000:]}")
    startup, data, ray_s, workers = (float(x) for x in match.groups())
    return {"wall_s": wall, "startup_s": startup, "data_s": data, "ray_s": ray_s, "workers_s": workers,
            "after_last_step_s": wall - (last_step_at - start)}


def import_seconds(statement: str) -> float:
    """Seconds `statement` takes in a fresh interpreter that has already imported torch."""
    code = f"import time, torch; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"bench/startup.py: `{statement}` failed:\n{proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="runs per variant (alternating order)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            runs[name].append(one_run(VARIANTS[name]))
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[name][-1].items()), flush=True)
    print(f"\nmedians over {args.rounds} run(s) per variant, seconds (1-step tiny task, {os.cpu_count()} CPUs)")
    print(f"{'variant':<11}" + "".join(f"{c:>19}" for c in COLUMNS))
    med = {name: {c: statistics.median(run[c] for run in runs[name]) for c in COLUMNS} for name in VARIANTS}
    for name in VARIANTS:
        print(f"{name:<11}" + "".join(f"{med[name][c]:>19.1f}" for c in COLUMNS))
    print(f"{'ratio':<11}" + "".join(f"{med['nodash'][c] / med['dashboard'][c]:>19.2f}" if med["dashboard"][c] else f"{'-':>19}"
                                       for c in COLUMNS) + "   (nodash / dashboard)")
    dynamo = import_seconds("import torch._dynamo")
    math_verify = import_seconds("import math_verify")
    print("\nimports the driver no longer makes at start-up, each in a fresh interpreter after `import torch`:")
    print(f"  torch._dynamo  {dynamo:6.1f} s   (still loaded by megatron-core's import in the model workers)")
    print(f"  math_verify    {math_verify:6.1f} s   (loaded by the reward scorer for the math and acc verifiers only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
