"""ray_gpt.py end to end with the actor at TP=2 + sequence parallelism (training with SP, the
native engine generating with it switched off) and at PP=2 x virtual pipeline 2 (4 layers, the
interleaved schedule; the engine passes the hidden states round the pipeline twice per token),
a few steps each on the tiny task, colocated with the reference on the same 2 devices."""
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


@pytest.mark.parametrize("name,overrides", [
    ("tp2-sp", [f"{A}.tensor_model_parallel_size=2", f"{A}.sequence_parallel=true"]),
    ("pp2-vpp2", [f"{A}.pipeline_model_parallel_size=2", f"{A}.virtual_pipeline_model_parallel_size=2",
                  "model.tiny.num_layers=4"]),
])
def test_actor_trains_and_generates(tmp_path, name, overrides):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ray_gpt.py"), "training.train_iters=3", "training.test_freq=0",
         f"training.output_dir={tmp_path}", "resource_pool.actor_rollout=[2]", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ, RAY_ADDRESS="local"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ranks 0-1: train+generate" in proc.stdout  # both ranks train and generate (the native engine's TP / PP decode)
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
            assert math.isfinite(r[key]), (name, r["step"], key, r[key])
        assert r["actor/grad_norm"] > 0, r  # the loss reached the weights
        assert r["response_length/mean"] > 0, r
