"""The ray_gpt check of scripts/gpu_smoke.py: `ray_gpt.py` on the tiny task, colocated, on the
device, once per --ray-variants entry; every step logged, finite grad norms; the figures of each run
(scores, seconds per step, every step's phase timings, start-up and wall seconds)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# the ray_gpt check's runs (--ray-variants): name -> overrides of the tiny task
RAY_VARIANTS = {
    "fp32": ["training.bf16=false"],
    "bf16": ["training.bf16=true"],
    # both compiles: the decode step (enforce_eager: false) and the decoder layers of update and log-probs
    "compiled": ["training.bf16=true", "actor_rollout_ref.actor_rollout.enforce_eager=false",
                 "training.use_torch_compile=true"],
    # the tiny task's model with 4 experts, top-2 (EP 1 on one device), as tests/e2e/test_moe_e2e.py at EP 2
    "moe": ["training.bf16=false", "training.num_experts=4", "training.moe_ffn_hidden_size=128",
            "training.moe_router_topk=2"],
}


def ray_gpt_command(platform: str, steps: int, out_dir: str, variant: str) -> list[str]:
    """The ray_gpt.py command line of the check: the tiny task, colocated, no validation or saving."""
    return [sys.executable, os.path.join(ROOT, "ray_gpt.py"), f"training.platform={platform}",
            f"training.train_iters={steps}", f"training.output_dir={out_dir}", "training.test_freq=0",
            "training.save_interval=0", *RAY_VARIANTS[variant]]


def summarize_run(out_dir: str, steps: int) -> tuple[bool, dict]:
    """Figures of a finished ray_gpt run from its metrics.jsonl: every step logged, finite grad norms."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return False, {"error": f"{path} was not written"}
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    norms = [r.get("actor/grad_norm", float("nan")) for r in rows]
    f = {"steps": len(rows), "score_first": rows[0].get("grpo/score/mean") if rows else None,
         "score_last": rows[-1].get("grpo/score/mean") if rows else None,
         "step_s_mean": sum(r.get("timing/step", 0.0) for r in rows[1:]) / max(1, len(rows) - 1),
         "gen_s_mean": sum(r.get("timing/gen", 0.0) for r in rows[1:]) / max(1, len(rows) - 1),
         # every step's phases, so an uneven step shows where its time went
         "timing": [{k[len("timing/"):]: round(v, 4) for k, v in r.items() if k.startswith("timing/")}
                    for r in rows]}
    return len(rows) == steps and all(math.isfinite(x) for x in norms), f


def startup_of(stdout: str) -> dict:
    """ray_gpt.py's start-up seconds from its `done: {...}` line ({} when absent)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("done: "):
            try:
                return {"startup_s": json.loads(line[len("done: "):]).get("startup_seconds")}
            except ValueError:
                return {}
    return {}


def check_ray_gpt(ctx) -> tuple[bool, dict]:
    a, figures, ok = ctx["args"], {}, True
    for label in a.ray_variants:
        out_dir = os.path.join(ctx["tmp"], f"ray_gpt_{label}")
        env = {**os.environ, "RAY_ADDRESS": "local", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(ray_gpt_command(ctx["platform"], a.ray_steps, out_dir, label), cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=600 + 60 * a.ray_steps)
        except subprocess.TimeoutExpired:
            figures[label] = {"error": f"ray_gpt.py did not finish {a.ray_steps} steps within the timeout"}
            ok = False
            continue
        if a.log_dir:
            os.makedirs(a.log_dir, exist_ok=True)
            with open(os.path.join(a.log_dir, f"ray_gpt_{label}.log"), "w") as fh:
                fh.write(f"$ {' '.join(proc.args)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        passed, f = summarize_run(out_dir, a.ray_steps)
        f["wall_s"] = round(time.perf_counter() - t0, 1)  # the whole run, start-up and shutdown included
        f.update(startup_of(proc.stdout))
        if proc.returncode != 0:
            passed, f["error"] = False, f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"
        figures[label], ok = f, ok and passed
    return ok, figures
