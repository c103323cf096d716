"""ray_gpt.py end to end with rollout_engine=vllm on CPU: colocated it learns the tiny task with the
native e2e test's margin; on the generation rank of the train/infer split it runs, syncs and
checks every step (with `sync_check_interval: 0`, no probe check); a sync check that cannot be met
stops the run with its sentence.

The tiny model's head dim is 16, which vLLM's CPU attention has no kernel for: these runs use
hidden_size 128 and kv_channels 32 (head dim 32; vLLM's Qwen2 takes it as hidden / heads)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
A = "actor_rollout_ref.actor_rollout"
VLLM = (f"{A}.rollout_engine=vllm", "training.hidden_size=128", "training.kv_channels=32")
pytestmark = pytest.mark.e2e


def ray_gpt(*overrides, timeout=900):
    return subprocess.run([sys.executable, str(ROOT / "ray_gpt.py"), *VLLM, *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled"})


def metrics(out_dir):
    with open(Path(out_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.timeout(1800)  # ~3 min alone on 2 cores; CI machines are shared, so leave room
def test_colocated_vllm_learns_the_tiny_task(tmp_path):
    """60 steps, for CI's time (150 until 2026-11-29, 80 until 2026-11-30; measured on a quiet machine: the last 10
    steps' mean score 0.044 -> 0.61 at step 60, 0.80 at 80, 0.84 at 150; 69 s for 150 steps, ~4x that beside another
    stage in CI)."""
    steps = 60
    proc = ray_gpt(f"training.train_iters={steps}", f"training.output_dir={tmp_path}", timeout=1750)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    first = sum(r["grpo/score/mean"] for r in rows[:10]) / 10
    last = sum(r["grpo/score/mean"] for r in rows[-10:]) / 10
    print(f"vllm colocated: score {first:.3f} -> {last:.3f}; sync s (last) {rows[-1]['timing/sync_weights']:.4f}")
    assert last > first + 0.3, (first, last)  # the native e2e test's margin (measured here: 0.04 -> 0.61 at step 60)
    for r in rows:  # synced and verified before every step's generation
        assert r["rollout/logp_diff_max"] <= 1e-4 and r["timing/sync_weights"] > 0, r
        assert r["rollout/sync_peak_bytes"] > 0
    assert "val/score/mean" in rows[19]


def test_vllm_on_the_generation_rank_of_the_split_and_sync_check_interval_0(tmp_path):
    """The split's generation rank runs vLLM, synced every step; with `sync_check_interval: 0` and a
    tolerance no check could meet (1e-12), no probe check runs, so the run finishes: the key reaches
    the trainer, and the weights still sync every step (the probe check on the split runs in the
    inference-TP-2 test below). Layer 0's attention is frozen: after the first sync its tensors stay in the engine
    (the syncs load that many fewer) and the batch log-probs still agree."""
    import re

    proc = ray_gpt("training.train_iters=4", f"training.output_dir={tmp_path}", "training.test_freq=2",
                   "resource_pool.actor_rollout=[2]", f"{A}.num_gpus_for_train=1", f"{A}.num_gpus_for_infer=1",
                   f"{A}.ppo_mini_batch_size=8", f"{A}.tis_mode=token",  # 2 mini-batches: old log-probs computed
                   f"{A}.sync_check_tolerance=1e-12", f"{A}.sync_check_interval=0",
                   f"{A}.freeze_parameters=[decoder.layers.0.self_attention.*]")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "ranks 1: generate" in proc.stdout
    left_out = re.search(r"weight sync: (\d+) of the (\d+) frozen tensors are left out of later syncs", proc.stdout)
    assert left_out and int(left_out[1]) == int(left_out[2]) > 0, proc.stdout[-3000:]
    rows = metrics(tmp_path)
    assert [r["rollout/sync_tensors"] for r in rows[1:]] == [rows[0]["rollout/sync_tensors"] - int(left_out[1])] * 3
    assert len(rows) == 4 and "val/score/mean" in rows[1]
    for r in rows:
        # batch log-probs of the vLLM generation rank vs the training rank, same weights
        assert r["rollout/logp_diff_max"] <= 1e-4 and r["timing/sync_weights"] > 0, r
        assert r["rollout/sync_peak_bytes"] > 0 and "timing/sync_check" not in r, r
        assert abs(r["actor/tis_weight_mean"] - 1.0) < 1e-3  # fp32: the engines agree, TIS weights ~1


def test_a_sync_check_that_cannot_pass_stops_the_run_with_its_sentence(tmp_path):
    """Tolerance 1e-12: fp32 kernels of vLLM and megatron differ by ~1e-7, so the first check fails."""
    proc = ray_gpt("training.train_iters=3", f"training.output_dir={tmp_path}", "training.test_freq=0",
                   f"{A}.sync_check_tolerance=1e-12", timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("ray_gpt.py: step 1: after the weight sync, the log-probs of the actor ranks' rollout engines on the "
            "probe differ from the training forward by up to") in proc.stderr
    assert "tolerance 1e-12" in proc.stderr and "Traceback" not in proc.stderr.split("ray_gpt.py: step 1")[-1]


def shm_files() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def run_at_inference_tp2(tmp_path, placement: str, *overrides) -> None:
    """Three steps of ray_gpt.py with vLLM at inference TP 2: the placement plan shows `placement`,
    every step is synced and passes the sync check, and nothing new is left in /dev/shm."""
    before = shm_files()
    proc = ray_gpt("training.train_iters=3", f"training.output_dir={tmp_path}", "training.test_freq=0",
                   f"{A}.infer_tensor_parallel_size=2", *overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert placement in proc.stdout
    rows = metrics(tmp_path)
    assert len(rows) == 3
    for r in rows:
        assert r["rollout/logp_diff_max"] <= 1e-4 and r["timing/sync_weights"] > 0, r
    assert shm_files() <= before, shm_files() - before


def test_vllm_at_inference_tp2_colocated_with_a_tp2_actor(tmp_path):
    """Each training TP group hosts one vLLM engine at inference TP 2 (external_launcher over the
    actor's gloo world): weights synced from the TP-2 trainer and checked on the probe every step.
    The engine's shared memory leaves nothing in /dev/shm when Ray kills the workers: vLLM names it
    alike for every run on a host, so a leftover failed the next run (errno 17)."""
    run_at_inference_tp2(tmp_path, "ranks 0-1: train+generate", "resource_pool.actor_rollout=[2]",
                         f"{A}.tensor_model_parallel_size=2")


@pytest.mark.extended  # CI's time: vLLM at inference TP 2 is the test above's, vLLM on the split the generation-rank test's
def test_vllm_at_inference_tp2_on_the_split(tmp_path):
    """Two generation ranks form one vLLM engine at inference TP 2; the training rank (TP 1) streams
    its weights to both, and the batch's log-probs are checked against the training forward."""
    run_at_inference_tp2(tmp_path, "ranks 1-2: generate", "resource_pool.actor_rollout=[3]",
                         f"{A}.num_gpus_for_train=1", f"{A}.num_gpus_for_infer=2",
                         f"{A}.ppo_mini_batch_size=8")  # 2 mini-batches: old log-probs computed
