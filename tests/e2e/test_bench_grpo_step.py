"""bench/grpo_step.py end to end on the smallest size for two steps, so the benchmark does not rot.

Our side always runs; TRL's side runs whenever its venv can be created (`--trl-optional`): about a
minute the first time (torch from the local wheel, trl from PyPI), reused from .bench_venv/ after
that. Without a registry the test still covers our side instead of failing on the network.
Nothing here asserts a time: only that both sides ran the same workload and the report is complete.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_quick_tiny_two_steps(tmp_path):
    out = tmp_path / "grpo_step.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "grpo_step.py"), "--quick", "--sizes", "tiny", "--steps", "2",
         "--work-dir", str(tmp_path / "work"), "--json", str(out), "--trl-optional"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    tiny = report["sizes"]["tiny"]
    assert [s["step"] for s in tiny["ours"]["steps"]] == [1, 2]
    summary = tiny["ours"]["summary"]
    for key in ("step_s", "tokens_per_s", "gen", "reward", "ref", "old_log_prob", "update", "sync", "other",
                "mfu_update", "mfu_gen"):
        assert summary[key] is not None, key
    assert 0.0 <= summary["reward_step1"] <= 1.0
    assert tiny["ours"]["load"]["processes"]["actor_rollout"]["peak_rss_mb"] > 0  # memory per process
    assert report["meta"]["peak_flops"] > 0
    assert "| tiny (0.08M) | ours |" in proc.stdout
    if "trl" in tiny:  # its venv could be made: both sides, same settings, both rewards reported
        assert [s["step"] for s in tiny["trl"]["steps"]] == [1, 2]
        assert not tiny["differs"] and all(row["match"] is not False for row in tiny["matched"]), tiny["matched"]
        assert 0.0 <= tiny["trl"]["summary"]["reward_step1"] <= 1.0
        assert tiny["reward_curves"]["steps"] == 2 and tiny["reward_curves"]["mae"] >= 0
        assert "| tiny (0.08M) | ours/TRL |" in proc.stdout
