"""Long runs survive (ray_gpt.py end to end on CPU): SIGKILL + resume=auto continues bitwise, a
checkpoint resumes into another TP, SIGTERM saves and exits, a killed worker ends the run fast."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
LOCAL = {"RAY_ADDRESS": "local"}  # never join another cluster that happens to run on this machine
A = "actor_rollout_ref.actor_rollout"
NOT_COMPARED = ("timing/", "perf/")


def ray_gpt(*overrides, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "ray_gpt.py"), *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **LOCAL})


def start(out_dir, *overrides):
    """ray_gpt.py in its own session (so the test can clean up every Ray process it started)."""
    log = open(Path(out_dir).with_suffix(".log"), "w")
    return subprocess.Popen([sys.executable, str(ROOT / "ray_gpt.py"), f"training.output_dir={out_dir}", *overrides],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **LOCAL},
                            start_new_session=True)


def output(out_dir) -> str:
    return Path(out_dir).with_suffix(".log").read_text()


def kill_session(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def wait_for(predicate, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def latest_step(save_dir) -> int:
    path = Path(save_dir) / "latest_checkpointed_iteration.txt"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def metrics(out_dir):
    with open(Path(out_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def assert_same_metrics(a: dict, b: dict, tol: float, keys=None):
    keys = keys or [k for k in a if not k.startswith(NOT_COMPARED)]
    for k in keys:
        x, y = a[k], b[k]
        assert abs(x - y) <= tol * max(1.0, abs(x)), (a["step"], k, x, y)


def test_sigkill_then_resume_auto_matches_an_uninterrupted_run(tmp_path):
    common = ("training.train_iters=12", "training.save_interval=1", "training.keep_last_n=2", "training.test_freq=0")
    ref_dir, run_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    proc = ray_gpt(f"training.output_dir={ref_dir}", *common, "training.save_hf=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = ref_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("iter_")) == ["iter_0000011", "iter_0000012"]

    run = start(run_dir, *common)
    try:
        wait_for(lambda: latest_step(run_dir / "checkpoints") >= 2, 300, "the checkpoint of step 2")
        os.kill(run.pid, signal.SIGKILL)  # the driver, mid-run
    finally:
        kill_session(run)
    k = latest_step(run_dir / "checkpoints")
    assert 2 <= k < 12, k
    state = json.loads((run_dir / "checkpoints" / f"iter_{k:07d}" / "trainer_state.json").read_text())
    assert state["step"] == k and state["loader"]["consumed_samples"] == k * 16  # the data position (gbs 16)

    proc = ray_gpt(f"training.output_dir={run_dir}", *common, "training.resume=auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"(step {k}); continuing at step {k + 1}" in proc.stdout
    resumed, reference = metrics(run_dir), metrics(ref_dir)
    assert [r["step"] for r in resumed] == list(range(1, 13))
    for a, b in zip(reference, resumed):  # fp32, fixed seed: the same numbers, data order included
        assert_same_metrics(a, b, 1e-6)

    # save_hf: the final actor as a Hugging Face checkpoint that transformers loads
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpts / "hf")
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()


def test_resume_into_another_tensor_parallel_size(tmp_path):
    """Saved at TP=2, resumed at TP=1: the resumed steps have the uninterrupted run's losses, the second
    one too, which follows an update made with the restored optimizer state (before 2026-11-30 Adam's
    moments started fresh at another layout, so only the first resumed step matched)."""
    tp2, tp1 = tmp_path / "tp2", tmp_path / "tp1"
    proc = ray_gpt(f"training.output_dir={tp2}", "training.train_iters=4", "training.save_interval=2",
                   "training.test_freq=0", "resource_pool.actor_rollout=[2]", f"{A}.tensor_model_parallel_size=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = ray_gpt(f"training.output_dir={tp1}", "training.train_iters=4", "training.test_freq=0",
                   f"training.resume={tp2 / 'checkpoints' / 'iter_0000002'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("saved at TP=2 PP=1 DP=1; this run is TP=1 PP=1 DP=1: the weights, the optimizer's state "
            "(re-sharded per parameter)") in proc.stdout, proc.stdout[-2000:]
    resumed, reference = metrics(tp1), metrics(tp2)
    assert [r["step"] for r in resumed] == [3, 4]
    for a, b in zip(reference[2:], resumed):
        assert_same_metrics(a, b, 1e-5, keys=["grpo/score/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean"])


def test_split_mode_resume_is_bitwise_and_save_final_off(tmp_path):
    """ray_gpt's train/infer split (1 training + 1 generation rank): resumed from step 2, steps 3-4
    equal the uninterrupted run's (the generation ranks' sampling counter is in the checkpoint).
    save_final=false: only the interval checkpoints exist."""
    split = ("resource_pool.actor_rollout=[2]", f"{A}.num_gpus_for_train=1", f"{A}.num_gpus_for_infer=1",
             "training.train_iters=4", "training.test_freq=0", "training.global_batch_size=8", f"{A}.ppo_mini_batch_size=8")
    ref_dir, resumed_dir = tmp_path / "uninterrupted", tmp_path / "resumed"
    proc = ray_gpt(f"training.output_dir={ref_dir}", *split, "training.save_interval=2", "training.save_final=false",
                   "training.keep_last_n=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpts = ref_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("iter_")) == ["iter_0000002", "iter_0000004"]
    state = json.loads((ckpts / "iter_0000002" / "trainer_state.json").read_text())
    assert state["rollout"] == {"calls": 2}  # one generate call per step on the generation rank

    proc = ray_gpt(f"training.output_dir={resumed_dir}", *split, "training.save_final=false",
                   f"training.resume={ckpts / 'iter_0000002'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed, reference = metrics(resumed_dir), metrics(ref_dir)
    assert [r["step"] for r in resumed] == [3, 4]
    for a, b in zip(reference[2:], resumed):
        assert_same_metrics(a, b, 1e-6)
    assert not (resumed_dir / "checkpoints").exists() or not any((resumed_dir / "checkpoints").glob("iter_*"))


def test_sigterm_saves_a_checkpoint_and_exits(tmp_path):
    out = tmp_path / "run"
    run = start(out, "training.train_iters=500", "training.test_freq=0")
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(metrics(out)) >= 2, 300, "two logged steps")
        os.kill(run.pid, signal.SIGTERM)
        rc = run.wait(timeout=60)
    finally:
        kill_session(run)
    assert rc == 128 + signal.SIGTERM, output(out)[-3000:]
    steps = len(metrics(out))
    assert f"stopped by SIGTERM after step {steps}" in output(out)
    assert latest_step(out / "checkpoints") == steps
    assert "Traceback" not in output(out)


def test_killed_worker_ends_the_run_within_60_s(tmp_path):
    out = tmp_path / "run"
    run = start(out, "training.train_iters=500", "training.save_interval=2", "training.test_freq=0")
    try:
        wait_for(lambda: latest_step(out / "checkpoints") >= 2, 300, "the checkpoint of step 2")
        workers = [pid for pid in _session_pids(run.pid) if _cmdline(pid).startswith("ray::ActorRolloutWorker")]
        assert workers, "no actor worker found in the run's session"
        os.kill(workers[0], signal.SIGKILL)
        killed_at = time.time()
        rc = run.wait(timeout=60)
        took = time.time() - killed_at
    finally:
        kill_session(run)
    text = output(out)
    assert rc == 1, text[-3000:]
    assert took < 60
    assert "actor_rollout rank 0 on" in text and "died during" in text, text[-3000:]
    from mindspeed_rl.models.checkpoint import latest_complete, read_manifest

    last = latest_complete(str(out / "checkpoints"))
    assert last is not None and read_manifest(last)["step"] >= 2  # every file matches its manifest


def test_stopped_worker_ends_the_run_within_its_timeout_naming_it(tmp_path):
    """SIGSTOP on the actor worker: no silent hang; after training.worker_timeout_s the driver stops
    with a sentence naming the role, rank, pid, the call it waited for and the stopped state."""
    out = tmp_path / "run"
    run = start(out, "training.train_iters=500", "training.test_freq=0", "training.worker_timeout_s=15",
                "training.save_final=false")
    try:
        wait_for(lambda: (out / "metrics.jsonl").exists() and len(metrics(out)) >= 2, 300, "two logged steps")
        workers = [pid for pid in _session_pids(run.pid) if _cmdline(pid).startswith("ray::ActorRolloutWorker")]
        assert workers, "no actor worker found in the run's session"
        os.kill(workers[0], signal.SIGSTOP)
        rc = run.wait(timeout=15 + 60)  # the timeout, plus the stall report and shutdown on a busy machine
    finally:
        for pid in _session_pids(run.pid):
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        kill_session(run)
    text = output(out)
    assert rc == 1, text[-3000:]
    assert "timed out after 15 s (`training.worker_timeout_s`" in text, text[-3000:]
    assert "actor_rollout." in text and f"rank 0 of 1 (pid {workers[0]} on" in text, text[-3000:]
    assert "is stopped (state T: SIGSTOP or a debugger), so it never finished" in text, text[-3000:]
    assert "Traceback" not in text


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
