"""Bad input outside the override table: yaml syntax errors, indexed data halves, the range table.

Each case ends in one sentence naming the file/key/line and the fix, exit 2, no traceback.
"""
import math
import sys
from pathlib import Path

import pytest

import ray_gpt
from mindspeed_rl.config import ranges
from mindspeed_rl.config.choices import data_path_problem

A = "actor_rollout_ref.actor_rollout"
ROOT = Path(__file__).resolve().parents[3]

GOOD = ("defaults:\n  - model:\n    - tiny\n\ntraining:\n  train_iters: 3\n  global_batch_size: 2\n  seq_length: 32\n"
        "actor_rollout_ref:\n  actor_rollout:\n    max_prompt_length: 16\n    micro_batch_size: 16\n"
        "reward:\n  verifier: true\nalgorithm:\n  verifier_function: [tiny_repeat]\n")
YAML_CASES = [
    # (id, text, line, fragments)
    ("bad-indent", GOOD.replace("  seq_length: 32", "   seq_length: 32"), 8, ["mapping values are not allowed", "line keys up"]),
    ("open-list", GOOD.replace("global_batch_size: 2", "global_batch_size: [2"), 7,
     ["gave up at line", "`[` list is not closed"]),
    ("tab-indent", GOOD.replace("  train_iters", "\ttrain_iters"), 6, ["tab", "spaces only"]),
    ("open-quote", GOOD.replace("seq_length: 32", "output_dir: \"abc"), 8, ["quote"]),
    ("unknown-alias", GOOD.replace("seq_length: 32", "seed: *nope"), 8, ["anchor"]),
]


@pytest.mark.parametrize("text,line,fragments", [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_yaml_syntax_error_names_file_line_and_fix(tmp_path, capsys, text, line, fragments):
    (tmp_path / "mine.yaml").write_text(text)
    code = ray_gpt.main(["--config-dir", str(tmp_path), "--config-name", "mine", "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"{tmp_path / 'mine.yaml'}, line {line}," in err, err
    for frag in fragments:
        assert frag in err, err


def test_valid_yaml_in_config_dir_loads(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text(GOOD)
    assert ray_gpt.main(["--config-dir", str(tmp_path), "--config-name", "mine", "dry_run=true"]) == 0, capsys.readouterr().err


# ---------------------------------------------------------------------------- indexed data: .idx and .bin
def _pair(prefix: Path, bin_bytes: bytes = b"\0" * 16, idx_bytes: bytes = b"\0" * 128):
    prefix.with_name(prefix.name + ".idx").write_bytes(idx_bytes)
    prefix.with_name(prefix.name + ".bin").write_bytes(bin_bytes)


def test_indexed_prefix_needs_its_bin(tmp_path):
    p = tmp_path / "gsm_packed_input_ids_document"
    _pair(p)
    assert data_path_problem(str(tmp_path / "gsm")) is None
    p.with_name(p.name + ".bin").unlink()
    err = data_path_problem(str(tmp_path / "gsm"))
    assert err and "gsm_packed_input_ids_document.bin is missing" in err and "preprocess_data.py" in err


def test_indexed_prefix_with_empty_bin(tmp_path):
    _pair(tmp_path / "d", bin_bytes=b"")
    assert "is empty" in data_path_problem(str(tmp_path / "d"))


def test_missing_bin_through_ray_gpt(tmp_path, capsys):
    (tmp_path / "x.idx").write_bytes(b"\0" * 128)
    tok = ROOT / "mindspeed_rl" / "assets" / "tiny_task"
    code = ray_gpt.main([f"{A}.data_path={tmp_path / 'x'}", "dry_run=true",
                         f"training.tokenizer_name_or_path={next(tok.glob('**/tokenizer.json')).parent}"])
    err = capsys.readouterr().err
    assert code == 2 and "x.bin is missing" in err, err


# ---------------------------------------------------------------------------- the range table
def test_every_numeric_key_has_a_range_decision():
    numeric = ranges.numeric_fields()
    decided = set(ranges.RANGES) | ranges.CHECKED_ELSEWHERE | ranges.NO_RANGE
    assert not numeric - decided, f"numeric keys without a range decision (add them to config/ranges.py): {sorted(numeric - decided)}"
    assert not decided - numeric, f"ranges.py names keys the schema does not have: {sorted(decided - numeric)}"
    overlap = (set(ranges.RANGES) & ranges.CHECKED_ELSEWHERE) | (set(ranges.RANGES) & ranges.NO_RANGE)
    assert not overlap


@pytest.mark.parametrize("text,inside,outside", [
    ("[0, 1)", [0, 0.5, 0.999], [-1e-9, 1, math.nan]),
    ("(0, 1]", [1e-12, 1], [0, 1.0001]),
    ("[1, inf)", [1, 10 ** 9], [0, -3]),
    ("(0, inf)", [1e-300], [0.0, -1]),
])
def test_interval_membership(text, inside, outside):
    assert all(ranges.in_range(v, text) for v in inside)
    assert not any(ranges.in_range(v, text) for v in outside)


def test_interval_words():
    assert ranges.describe("[1, inf)") == ">= 1" and ranges.describe("(0, inf)") == "> 0"
    assert ranges.describe("(0, 1]") == "in (0, 1]"
    with pytest.raises(ValueError):
        ranges.parse_interval("0..1")


def test_every_range_parses_and_the_defaults_are_inside():
    from mindspeed_rl.config.loader import load_config

    cfg = load_config("grpo_trainer_tiny", [])
    objs = [cfg.actor, cfg.actor.arch, cfg.actor.parallel, cfg.actor.optim, cfg.actor.rollout, cfg.actor.ppo,
            cfg.run, cfg.data, cfg.algorithm, cfg.algorithm.kl_ctrl]
    assert [p for o in objs for p in ranges.range_problems(o, "x")] == []
    for text in ranges.RANGES.values():
        ranges.parse_interval(text)


# ---------------------------------------------------------------------------- bench/grpo_step.py's table
def test_bench_table_formats_missing_values(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import grpo_step

    summary = {"step_s": 1.0, "step_min": 0.9, "step_max": 1.2, "tokens_per_s": 100.0, "reward_step1": None,
               "mfu_update": None, "mfu_gen": 0.01, **{p: 0.1 for p in grpo_step.PHASES}}
    ours = {"summary": summary, "load": {"own_cores": 1.0, "others_cores": 0.5}}
    trl = {"summary": {**summary, "mfu_update": 0.0, "old_log_prob": 0.0}, "load": ours["load"]}
    ratio = grpo_step.ratios(ours["summary"], trl["summary"])
    assert ratio["mfu_update"] is None and ratio["old_log_prob"] is None and ratio["step_s"] == 1.0
    text = grpo_step.table({"tiny": {"ours": ours, "trl": trl, "ratio": ratio}}, peak=1e11)
    assert "| ours/TRL | 1.00x" in text and "| - |" in text
    sys.modules.pop("grpo_step", None)
