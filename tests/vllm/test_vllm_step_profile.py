"""bench/vllm_step_profile.py runs against the installed vLLM: the methods it wraps still exist
(a renamed one raises at start) and its parts add up to the whole generate call. Eager, one
repeat, no native row: a smoke run of the bench, not a timing."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_step_profile_runs_and_its_parts_add_up():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "vllm_step_profile.py"), "--size", "10m",
                           "--no-compile", "--no-native", "--repeats", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("part (ms / step)"))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = line[22:].split()  # eager wall, eager cpu
        rows[line[:22].strip()] = (float(cells[0]), float(cells[1]))
    assert {"model forward", "sampler + logprobs", "schedule / update", "ours", "total"} <= rows.keys(), proc.stdout
    wall = {k: v[0] for k, v in rows.items()}
    assert wall["model forward"] > 0 and wall["total"] > 0
    parts = sum(v for k, v in wall.items() if k != "total")
    assert abs(parts - wall["total"]) <= 0.01 * wall["total"] + 0.05, rows  # the parts partition the call
