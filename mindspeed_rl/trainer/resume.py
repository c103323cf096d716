"""Long runs: which checkpoint to resume from, what changed since, and stopping on a signal.

    resume = find_resume(cfg, vocab_size)       # before any worker: path, step, trainer state
    train_loader.load_state_dict(resume.state["loader"])
    ... actor.load_checkpoint(resume.path); trainer.load_state_dict(resume.state)
    with StopOnSignal() as stop: GRPOTrainer(..., stop_requested=stop.reason).fit()

Everything a resumed run needs is in the checkpoint (models/checkpoint.py): each rank's model,
optimizer, scheduler and rng, and trainer_state.json with the step, the data-loader position, the KL
controller, the workers' sampling counters and the resolved config. A run killed at any moment
continues from its newest *complete* checkpoint; its metrics match an uninterrupted run's.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

from mindspeed_rl.utils.errors import UserInputError


@dataclass
class Resume:
    path: str  # the iter_* directory
    step: int
    state: dict[str, Any]  # trainer_state.json
    manifest: dict[str, Any]


def find_resume(cfg, vocab_size: int) -> Optional[Resume]:
    """The checkpoint `training.resume` points at (None = start fresh), checked before any worker
    starts: complete (every file matches the manifest), same architecture, written by a trainer."""
    from mindspeed_rl.models import checkpoint as ckpt
    from mindspeed_rl.models.arch_check import model_args

    where = cfg.run.resume
    if not where:
        return None
    if where == "auto":
        path = ckpt.latest_complete(cfg.actor.save)
        if path is None:
            print(f"resume=auto: no complete checkpoint under {cfg.actor.save} yet; starting at step 1.")
            return None
    elif os.path.isfile(os.path.join(where, ckpt.MANIFEST)):
        path = where  # an iter_* directory (read_manifest below says what is wrong with it, if anything)
    else:  # a save directory
        path = ckpt.latest_complete(where)
        if path is None:
            raise UserInputError(f"`training.resume: {where}` holds no complete checkpoint (no iter_* directory "
                                 "whose files match its manifest.json); point it at another one or use auto.")
    manifest = ckpt.read_manifest(path)
    ckpt.check_args_match(manifest, model_args(cfg.actor, vocab_size))
    state = ckpt.read_trainer_state(path)
    if "step" not in state:
        raise UserInputError(f"{manifest['path']} has no trainer state (a converted, weights-only checkpoint); "
                             f"start from it with actor_rollout.load: {manifest['path']} instead of training.resume.")
    return Resume(manifest["path"], int(state["step"]), state, manifest)


def describe(resume: Resume, now_yaml: str, layout: dict[str, int]) -> list[str]:
    """Lines telling the user what resumes: the checkpoint, a layout change, changed settings."""
    m = resume.manifest
    lines = [f"resuming from {resume.path} (step {resume.step}); continuing at step {resume.step + 1}"]
    saved = {k: m[k] for k in ("tp", "pp", "dp")}
    if saved != {k: layout[k] for k in saved}:
        from mindspeed_rl.models.optimizer_state import resumes_anywhere

        what = ("the weights, the optimizer's state (re-sharded per parameter), lr schedule and data position resume."
                if resumes_anywhere(m) else
                "the weights, lr schedule and data position resume, Adam's moments start fresh (this checkpoint, "
                "written before 2026-11-30, holds them per TP/PP/DP).")
        lines.append("the checkpoint was saved at TP={tp} PP={pp} DP={dp}; ".format(**saved) +
                     "this run is TP={tp} PP={pp} DP={dp}: ".format(**layout) + what)
    changed = changed_settings(resume.state.get("config_yaml", ""), now_yaml)
    if changed:
        lines.append("settings changed since the checkpoint: " + ", ".join(changed))
    return lines


def changed_settings(saved_yaml: str, now_yaml: str, limit: int = 12) -> list[str]:
    """`key: old -> new` for every setting that differs (run.resume itself excepted)."""
    if not saved_yaml:
        return []
    import yaml

    old, new = _flat(yaml.safe_load(saved_yaml) or {}), _flat(yaml.safe_load(now_yaml) or {})
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k != "run.resume")
    out = [f"{k}: {old.get(k)} -> {new.get(k)}" for k in keys[:limit]]
    return out + ([f"... {len(keys) - limit} more"] if len(keys) > limit else [])


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class StopOnSignal:
    """SIGTERM / SIGINT ask the run to finish its step, save a checkpoint and exit; a second signal
    stops at once (KeyboardInterrupt). Installed in the main thread only (Python's rule)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def reason(self) -> Optional[str]:
        return signal.Signals(self.signum).name if self.signum else None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\nray_gpt.py: {signal.Signals(signum).name} received: finishing this step, saving a checkpoint, then "
              "exiting (send it again to stop at once, without a checkpoint).", file=sys.stderr, flush=True)

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
