"""Soak run: many GRPO steps of the tiny task, watching for leaks. Reports growth, asserts nothing.

    python scripts/soak.py                       # the full run: 2,000 steps (~15 min on 2 cores)
    python scripts/soak.py --steps 300 --json r.json   # the CI-sized one (tests/e2e/test_soak_e2e.py)

ray_gpt.py runs in its own session (RAY_ADDRESS=local, a private Ray). Every few seconds this
script samples the resident memory and open file descriptors of every process of that session
(the driver, the actor and reference workers, Ray's own daemons), keyed by the step the run had
logged; the driver also writes its RSS, fds and the object store's use into metrics.jsonl each
step (trainer/metrics.py driver_resources). Growth is measured from the end of a warm-up (default
the first 10 % of steps: allocator pools, compiled kernels and caches fill there) to the last step,
and per 1,000 steps. "metrics complete" = every step 1..N logged exactly once with the same keys.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLES = {"ray::ActorRolloutWorker": "actor", "ray::ReferenceWorker": "reference", "ray::RolloutWorker": "rollout"}


def session_pids(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    out.append(int(entry))
            except OSError:
                pass
    return out


def proc_sample(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None
    name = next((role for prefix, role in ROLES.items() if cmd.startswith(prefix)), None)
    if name is None:
        name = "driver" if "ray_gpt.py" in cmd else "ray:" + os.path.basename(cmd.split()[0]) if cmd else "?"
    return {"pid": pid, "name": name, "rss_mb": rss, "fds": fds}


def logged_steps(metrics: Path) -> int:
    try:
        with open(metrics, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def run(steps: int, out_dir: Path, interval_s: float, timeout_s: float) -> tuple[int, list[dict], float]:
    metrics = out_dir / "metrics.jsonl"
    log = open(out_dir / "ray_gpt.log", "w")
    env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, str(ROOT / "ray_gpt.py"), f"training.train_iters={steps}", "training.test_freq=0",
           "training.save_final=false", f"training.output_dir={out_dir}", f"training.log_interval={max(1, steps // 20)}"]
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    samples, stop = [], threading.Event()

    def sample_loop():
        while not stop.wait(interval_s):
            step = logged_steps(metrics)
            for pid in session_pids(proc.pid):
                s = proc_sample(pid)
                if s:
                    samples.append({"t": time.time() - start, "step": step, **s})

    sampler = threading.Thread(target=sample_loop, daemon=True)
    sampler.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = -1
    finally:
        stop.set()
        sampler.join()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Ray's daemons of this run, if any are left
        except ProcessLookupError:
            pass
        log.close()
    return rc, samples, time.time() - start


def growth(samples: list[dict], name: str, key: str, warm: int, steps: int) -> dict | None:
    """Mean of `key` over the processes called `name`, first sample after `warm` vs the last one."""
    rows = [s for s in samples if s["name"] == name]
    # from the warm-up to the last sample taken while steps still ran (not during the shutdown)
    after = [s for s in rows if warm <= s["step"] < steps] or [s for s in rows if s["step"] >= warm]
    if not after:
        return None
    first_step, last_step = after[0]["step"], after[-1]["step"]
    at = lambda st: sum(s[key] for s in after if s["step"] == st) / max(1, sum(1 for s in after if s["step"] == st))  # noqa: E731
    a, b = at(first_step), at(last_step)
    span = max(1, last_step - first_step)
    return {"from_step": first_step, "to_step": last_step, "start": round(a, 1), "end": round(b, 1),
            "growth": round(b - a, 1), "per_1000_steps": round((b - a) * 1000 / span, 1),
            "peak": round(max(s[key] for s in rows), 1)}


def report(steps: int, out_dir: Path, rc: int, samples: list[dict], wall: float, warmup: float) -> dict:
    rows = []
    metrics = out_dir / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    warm = max(1, int(steps * warmup))
    keysets = {tuple(sorted(r)) for r in rows}
    complete = [r["step"] for r in rows] == list(range(1, steps + 1)) and len(keysets) == 1
    driver_from = next((r for r in rows if r["step"] == warm), rows[0] if rows else {})
    driver_to = rows[-1] if rows else {}

    def dgrowth(key):
        if key not in driver_from or key not in driver_to:
            return None
        span = max(1, driver_to["step"] - driver_from["step"])
        d = driver_to[key] - driver_from[key]
        return {"from_step": driver_from["step"], "to_step": driver_to["step"], "start": round(driver_from[key], 1),
                "end": round(driver_to[key], 1), "growth": round(d, 1), "per_1000_steps": round(d * 1000 / span, 1),
                "peak": round(max(r.get(key, 0) for r in rows), 1)}

    names = sorted({s["name"] for s in samples if s["name"] in ("driver", *ROLES.values())})
    return {
        "steps": steps, "returncode": rc, "wall_s": round(wall, 1), "warmup_steps": warm,
        "metrics_complete": complete, "logged_steps": len(rows),
        "step_s_median": sorted(r["timing/step"] for r in rows)[len(rows) // 2] if rows else None,
        "score_first": rows[0].get("grpo/score/mean") if rows else None,
        "score_last": rows[-1].get("grpo/score/mean") if rows else None,
        "driver": {k.split("/")[-1]: dgrowth(k) for k in ("perf/driver_rss_mb", "perf/driver_open_fds",
                                                          "perf/object_store_used_mb")},
        "processes": {n: {"rss_mb": growth(samples, n, "rss_mb", warm, steps),
                          "fds": growth(samples, n, "fds", warm, steps)} for n in names},
        "samples": len(samples),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of steps before growth is measured")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between process samples")
    p.add_argument("--timeout", type=float, default=7200.0)
    p.add_argument("--out-dir", default=None, help="run directory (default: a temporary one, removed)")
    p.add_argument("--json", default=None, help="write the report here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak") as tmp:
        out = Path(args.out_dir or tmp)
        out.mkdir(parents=True, exist_ok=True)
        rc, samples, wall = run(args.steps, out, args.interval, args.timeout)
        rep = report(args.steps, out, rc, samples, wall, args.warmup)
        if rc != 0:
            rep["log_tail"] = (out / "ray_gpt.log").read_text()[-3000:]
    print(f"soak: {args.steps} steps, exit {rc}, {rep['wall_s']} s, metrics complete: {rep['metrics_complete']}, "
          f"median step {rep['step_s_median']} s, score {rep['score_first']} -> {rep['score_last']}")
    print(f"growth after step {rep['warmup_steps']} (start -> end, per 1,000 steps):")
    for key, g in rep["driver"].items():
        if g:
            print(f"  driver {key:20s} {g['start']} -> {g['end']} ({g['per_1000_steps']:+} per 1,000 steps)")
    for name, kinds in rep["processes"].items():
        for key, g in kinds.items():
            if g:
                print(f"  {name:10s} {key:20s} {g['start']} -> {g['end']} ({g['per_1000_steps']:+} per 1,000 steps, peak {g['peak']})")
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
