"""ray_gpt.py end to end with the reward-model role and with ray_gpt's train/infer split (CPU).

(a) separated deployment: actor 2 ranks at TP=2, reference on its own device, a reward model
    (a tiny Qwen2ForSequenceClassification) on its own device, added to the rule verifier;
(b) split: resource_pool.actor_rollout=[2] with num_gpus_for_train=1 + num_gpus_for_infer=1; the
    generation rank's log-probs equal the training rank's on every step (weights synced), also
    after validation generated right after an update; with layer 0 frozen (freeze_parameters), which the
    checkpoints of steps 2 and 3 hold unchanged while every other weight moved, and which only the first
    sync sends (the generation rank keeps it).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
A = "actor_rollout_ref.actor_rollout"


def ray_gpt(*overrides, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "ray_gpt.py"), *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": "local"})  # never a stray cluster


def metrics(out_dir):
    with open(Path(out_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_reward_model_role_next_to_tp2_actor_and_own_reference(tmp_path):
    from tests.unit.workers.tiny_rm import make_tiny_task_rm

    make_tiny_task_rm(str(tmp_path / "rm"))
    proc = ray_gpt("training.train_iters=3", f"training.output_dir={tmp_path / 'out'}", "training.test_freq=0",
                   "resource_pool.actor_rollout=[2]", f"{A}.tensor_model_parallel_size=2", "resource_pool.ref=[1]",
                   "resource_pool.reward=[1]", f"reward.load={tmp_path / 'rm'}", "reward.micro_batch_size=32",
                   "algorithm.reward_model_weight=0.5")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    plan = proc.stdout.split("# placement plan")[1]
    assert "reward" in plan and "ranks 0-1: train+generate" in plan
    rows = metrics(tmp_path / "out")
    assert len(rows) == 3
    for r in rows:
        # score = tiny_repeat verifier (weight 1, no EOS penalty) + 0.5 x reward model, per sequence,
        # so the batch means add up the same way
        assert r["grpo/score/mean"] == pytest.approx(r["reward/score/mean"] + 0.5 * r["reward/rm_score/mean"],
                                                     abs=1e-5)
        assert r["reward/rm_score/max"] > r["reward/rm_score/min"]  # a random RM tells sequences apart
        assert r["actor/kl_loss"] >= 0 and "timing/sync_weights" not in r  # colocated generation: no sync


def test_train_infer_split_syncs_weights(tmp_path):
    proc = ray_gpt("training.train_iters=3", f"training.output_dir={tmp_path}", "training.test_freq=2",
                   "resource_pool.actor_rollout=[2]", f"{A}.num_gpus_for_train=1", f"{A}.num_gpus_for_infer=1",
                   f"{A}.ppo_mini_batch_size=8",  # 2 mini-batches: old log-probs are computed by the trainer
                   f"{A}.freeze_parameters=[decoder.layers.0.*]", "training.save_interval=2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    from safetensors.torch import load_file

    ckpt = [load_file(tmp_path / "checkpoints" / f"iter_000000{i}" / "mp_rank_00_000" / "model.safetensors")
            for i in (2, 3)]
    frozen = [n for n in ckpt[0] if n.startswith("decoder.layers.0.")]
    assert frozen and all(ckpt[0][n].equal(ckpt[1][n]) for n in frozen)
    assert all(not ckpt[0][n].equal(ckpt[1][n]) for n in ckpt[0] if n not in frozen and "layernorm" not in n), \
        [n for n in ckpt[0] if n not in frozen and ckpt[0][n].equal(ckpt[1][n])]
    assert "ranks 0: train" in proc.stdout and "ranks 1: generate" in proc.stdout
    # after the first sync, layer 0's 12 frozen HF tensors stay on the generation rank (its engine keeps them): the
    # log-prob check below then holds with them not sent
    assert "weight sync: 12 of the 12 frozen tensors are left out of later syncs" in proc.stdout + proc.stderr, \
        (proc.stdout + proc.stderr)[-3000:]
    rows = metrics(tmp_path)
    assert len(rows) == 3 and "val/score/mean" in rows[1]
    for r in rows:
        # the sampler's log-probs (generation rank) vs the trainer's (training rank) on the same batch,
        # before the update: equal up to kernel numerics only if the generation rank got the weights
        # (after step 1, lr 1e-3 moves them far more than 1e-5)
        assert r["rollout/logp_diff_max"] <= 1e-5, r
        assert r["timing/sync_weights"] > 0
    print("sync_weights s per step:", [round(r["timing/sync_weights"], 4) for r in rows],
          "logp diff max:", [r["rollout/logp_diff_max"] for r in rows])
