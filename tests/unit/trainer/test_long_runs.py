"""The loop's long-run duties with in-process fakes: when it saves, what it saves, stopping on
request, and halting after too many skipped (non-finite) updates; plus resume bookkeeping."""
import json
import signal

import pytest

from mindspeed_rl.trainer.grpo import GRPOSettings, GRPOTrainer, TrainingHalted
from mindspeed_rl.trainer.metrics import MetricsLogger, read_metrics
from mindspeed_rl.trainer.resume import Resume, StopOnSignal, changed_settings, describe
from tests.unit.trainer.test_grpo_loop import FrozenReference, MatchReward, TabularActor, prompt_stream


def trainer(tmp_path, steps, actor=None, saves=None, stop=lambda: None, **settings):
    s = GRPOSettings(train_iters=steps, n_samples_per_prompt=4, **settings)
    logger = MetricsLogger(str(tmp_path), steps, console=False)
    save = (lambda step, state: saves.append((step, dict(state)))) if saves is not None else None
    return GRPOTrainer(s, actor or TabularActor(), FrozenReference(), MatchReward(), prompt_stream(), logger,
                       save=save, stop_requested=stop)


def test_saves_every_interval_and_at_the_last_step(tmp_path):
    saves = []
    t = trainer(tmp_path, 7, saves=saves, save_interval=3, use_kl_in_reward=True, kl_ctrl_type="adaptive",
                kl_coef=0.1)
    t.fit()
    assert [s for s, _ in saves] == [3, 6, 7]
    step, state = saves[-1]
    assert state["step"] == 7 and state["skipped_in_a_row"] == 0
    assert state["kl_coef"] == t.kl_ctrl.value != 0.1  # the adaptive coefficient moved and is saved


def test_save_final_false_skips_only_the_last_step_checkpoint(tmp_path):
    saves = []
    trainer(tmp_path, 7, saves=saves, save_interval=3, save_final=False).fit()
    assert [s for s, _ in saves] == [3, 6]
    saves.clear()
    trainer(tmp_path, 6, saves=saves, save_interval=3, save_final=False).fit()  # an interval step is still saved
    assert [s for s, _ in saves] == [3, 6]


def test_save_final_is_a_config_key():
    from mindspeed_rl.config import load_config
    from mindspeed_rl.trainer.grpo import settings_from_config

    assert settings_from_config(load_config("grpo_trainer_tiny", []), 1).save_final is True
    assert settings_from_config(load_config("grpo_trainer_tiny", ["training.save_final=false"]), 1).save_final is False


def test_stop_request_saves_and_returns_early(tmp_path):
    saves, calls = [], []

    def stop():
        calls.append(1)
        return "SIGTERM" if len(calls) >= 2 else None

    t = trainer(tmp_path, 10, saves=saves, save_interval=5, stop=stop)
    history = t.fit()
    assert len(history) == 2 and t.stopped_by == "SIGTERM" and [s for s, _ in saves] == [2]


def test_load_state_dict_continues_at_the_next_step(tmp_path):
    t = trainer(tmp_path, 5, kl_ctrl_type="adaptive", kl_coef=0.1, use_kl_in_reward=True)
    t.load_state_dict({"step": 3, "kl_coef": 0.25, "skipped_in_a_row": 1})
    assert t.kl_ctrl.value == 0.25
    t.fit()
    assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl"))] == [4, 5]


class SkippingActor(TabularActor):
    """Reports a skipped update (non-finite loss) on the steps listed."""

    def __init__(self, bad_steps):
        super().__init__()
        self.bad, self.n = set(bad_steps), 0

    def update_actor(self, batch):
        self.n += 1
        stats = super().update_actor(batch)
        stats["actor/update_skipped"] = float(self.n in self.bad)
        return stats


def test_skipped_updates_in_a_row_halt_the_run(tmp_path):
    t = trainer(tmp_path, 20, actor=SkippingActor({2, 4, 5, 6}), max_skipped_updates=3)
    with pytest.raises(TrainingHalted, match=r"skipped at 3 steps in a row \(steps 4-6\).*training.resume=auto"):
        t.fit()
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["actor/skipped_in_a_row"] for r in rows] == [0, 1, 0, 1, 2, 3]  # step 6 is logged before halting


def test_skipped_updates_never_halt_with_zero(tmp_path):
    t = trainer(tmp_path, 6, actor=SkippingActor(range(1, 7)), max_skipped_updates=0)
    assert len(t.fit()) == 6


def test_metrics_of_a_resumed_run_keep_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2, 3, 4, 5)))
    MetricsLogger(str(tmp_path), 10, console=False, start_step=3).close()
    assert [r["step"] for r in read_metrics(str(path))] == [1, 2, 3]
    assert [r["step"] for r in read_metrics(str(tmp_path / "metrics.jsonl.1"))] == [1, 2, 3, 4, 5]  # kept aside
    MetricsLogger(str(tmp_path), 10, console=False).close()  # a fresh run: the old file goes aside too
    assert read_metrics(str(path)) == [] and (tmp_path / "metrics.jsonl.2").exists()


def test_changed_settings_lists_what_differs():
    old = "run:\n  train_iters: 10\n  resume: null\nactor:\n  optim:\n    lr: 0.001\n"
    new = "run:\n  train_iters: 20\n  resume: auto\nactor:\n  optim:\n    lr: 0.001\n"
    assert changed_settings(old, new) == ["run.train_iters: 10 -> 20"]
    assert changed_settings("", new) == []


def test_the_resume_line_says_whether_the_optimizer_state_follows_a_layout_change():
    manifest = {"tp": 2, "pp": 1, "dp": 1, "has_optimizer": True}
    layout = {"tp": 1, "pp": 1, "dp": 2}
    old = describe(Resume("ckpt/iter_0000002", 2, {}, manifest), "", layout)
    assert old[1] == ("the checkpoint was saved at TP=2 PP=1 DP=1; this run is TP=1 PP=1 DP=2: the weights, lr "
                      "schedule and data position resume, Adam's moments start fresh (this checkpoint, written "
                      "before 2026-11-30, holds them per TP/PP/DP).")
    new = describe(Resume("ckpt/iter_0000002", 2, {}, dict(manifest, optimizer_state="per_parameter")), "", layout)
    assert new[1].endswith("this run is TP=1 PP=1 DP=2: the weights, the optimizer's state (re-sharded per "
                           "parameter), lr schedule and data position resume.")
    assert len(describe(Resume("ckpt/iter_0000002", 2, {}, manifest), "", {"tp": 2, "pp": 1, "dp": 1})) == 1


def test_first_signal_asks_second_interrupts():
    import os

    with StopOnSignal() as stop:
        assert stop.reason() is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.reason() == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is not stop._handle  # handlers restored
