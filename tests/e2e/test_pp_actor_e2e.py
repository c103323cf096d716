"""ray_gpt.py end to end with a pipeline-parallel actor: PP=2 ranks train AND generate (the native
engine's pipelined decode), colocated with a PP=1 reference on the same 2 devices."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
A = "actor_rollout_ref.actor_rollout"


@pytest.mark.extended  # CI's time: test_parallel_features_e2e's pp2-vpp2 case runs the same with VPP on top
def test_pp2_actor_trains_and_generates(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ray_gpt.py"), "training.train_iters=3", "training.test_freq=0",
         f"training.output_dir={tmp_path}", "resource_pool.actor_rollout=[2]", f"{A}.pipeline_model_parallel_size=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ranks 0-1: train+generate" in proc.stdout
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert math.isfinite(r[key]), (r["step"], key, r[key])
        assert r["actor/grad_norm"] > 0, r  # the last stage's loss reached both stages' weights
        assert r["response_length/mean"] > 0, r
