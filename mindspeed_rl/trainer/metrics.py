"""Per-step metrics: phase timers, batch statistics, and the sinks (console, metrics.jsonl, tensorboard, wandb).

metrics.jsonl holds one JSON object per step (keys like `grpo/score/mean`, `timing/gen`), the
file scripts/plot_metrics.py draws the reward curve from. Sinks open lazily and flush every step,
so a killed run keeps every completed step. On a terminal the console shows a progress bar plus a
line every log_interval steps; when stderr is not a terminal (a log file, CI, `| tee`) it prints
only the lines, `step 12/200 (6%): score/mean=0.41, ...`, since bar redraws are noise in a file.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from typing import Callable, Optional

import torch

from mindspeed_rl.data import keys as K


class Timer:
    """Wall time per phase: `with timer("gen"): ...`; repeated phases add up."""

    def __init__(self):
        self.elapsed: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.elapsed[name] = self.elapsed.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}": v for k, v in self.elapsed.items()}


def batch_metrics(batch: dict) -> dict[str, float]:
    """Score and length statistics of a scored rollout batch."""
    scores = batch[K.SCORES].float()
    response_len = batch[K.RESPONSE_MASK].sum(-1).float()  # (B,)
    prompt_len = batch[K.PROMPT_MASK].sum(-1).float() if K.PROMPT_MASK in batch else None
    out = {
        "grpo/score/mean": float(scores.mean()),
        "grpo/score/max": float(scores.max()),
        "grpo/score/min": float(scores.min()),
        "response_length/mean": float(response_len.mean()),
        "response_length/max": float(response_len.max()),
        "response_length/clip_ratio": float((response_len >= batch[K.RESPONSE_MASK].shape[1]).float().mean()),
    }
    if prompt_len is not None:
        out["prompt_length/mean"] = float(prompt_len.mean())
    if K.FINISH_REASON in batch:
        reasons = batch[K.FINISH_REASON]
        out["response_length/eos_ratio"] = sum(r == "eos" for r in reasons) / max(len(reasons), 1)
    return out


class MetricsLogger:
    """Writes each step's metrics to the console, <output_dir>/metrics.jsonl, tensorboard and wandb."""

    CONSOLE_KEYS = ("grpo/score/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean", "timing/step")

    def __init__(self, output_dir: str, total_steps: int, tensorboard_dir: Optional[str] = None,
                 wandb_project: Optional[str] = None, run_name: str = "grpo", log_interval: int = 1,
                 console: bool = True, start_step: int = 0, interactive: Optional[bool] = None,
                 extra_metrics: Optional[Callable[[], dict]] = None):
        """start_step: a resumed run's checkpoint step; rows of later steps (logged by the run that
        died before its next checkpoint) are dropped from metrics.jsonl, so each step appears once.
        interactive: show a progress bar (default: when stderr is a terminal).
        extra_metrics: called at each step for metrics that belong to the process, not the step
        (e.g. driver_resources: memory, open files, object store)."""
        self.extra_metrics = extra_metrics
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.total, self.log_interval, self.console = total_steps, log_interval, console
        if os.path.isfile(self.path):
            _truncate_after(self.path, start_step)
        self._jsonl = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter
            self._tb = SummaryWriter(tensorboard_dir)
        self._wandb = None
        if wandb_project:
            import wandb  # optional extra: pip install -e .[wandb]
            self._wandb = wandb.init(project=wandb_project, name=run_name)
        self._bar = None
        if interactive is None:
            interactive = sys.stderr.isatty()
        if console and interactive:
            from tqdm import tqdm
            self._bar = tqdm(total=total_steps, initial=start_step, desc="GRPO", unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.extra_metrics is not None:
            metrics = {**metrics, **self.extra_metrics()}
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(record, step=step)
        if not self.console:
            return
        shown = {k.split("/")[-2] + "/" + k.split("/")[-1] if k.count("/") > 1 else k: f"{record[k]:.3g}"
                 for k in self.CONSOLE_KEYS if isinstance(record.get(k), (int, float))}
        line = ", ".join(f"{k}={v}" for k, v in shown.items())
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix(shown, refresh=False)
            self._bar.refresh()
            if step % self.log_interval == 0:
                self._bar.write(f"step {step}: {line}")
        elif step % self.log_interval == 0 or step == self.total:
            print(f"step {step}/{self.total} ({step / max(self.total, 1):.0%}): {line}", flush=True)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()


def driver_resources() -> dict[str, float]:
    """The driver's resident memory and open file descriptors, and the Ray object store's use: what
    a long run must keep flat (scripts/soak.py reads them from metrics.jsonl)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        out["perf/driver_rss_mb"] = rss_kb / 1024
        out["perf/driver_open_fds"] = float(len(os.listdir("/proc/self/fd")))
    except (OSError, StopIteration):  # not Linux: nothing to report
        pass
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        total, free = ray.cluster_resources(), ray.available_resources()
        if "object_store_memory" in total:
            used = total["object_store_memory"] - free.get("object_store_memory", total["object_store_memory"])
            out["perf/object_store_used_mb"] = used / 2 ** 20
    return out


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def read_metrics(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _truncate_after(path: str, step: int) -> None:
    """Make metrics.jsonl hold steps 1..step of this run. A resumed run keeps its rows up to the
    checkpoint; rows past it (the steps the dead run did after its last checkpoint, about to be
    redone) and a fresh run's predecessor file are moved aside, never deleted."""
    rows = read_metrics(path)
    keep = [r for r in rows if step and r.get("step", 0) <= step]
    if len(keep) == len(rows):
        return
    n = 1
    while os.path.exists(f"{path}.{n}"):
        n += 1
    shutil.copyfile(path, f"{path}.{n}")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in keep:
            f.write(json.dumps(row) + "\n")
    os.replace(tmp, path)
