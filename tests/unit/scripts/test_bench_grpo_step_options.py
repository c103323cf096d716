"""bench/grpo_step.py's options and numbers that need no run: --model shapes (parameter count
checked against transformers), --scaling points, the reward-curve comparison."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import grpo_step
    import grpo_step_workload

    yield grpo_step, grpo_step_workload
    for name in ("grpo_step", "grpo_step_workload", "_trl_side"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_model_dir_shape_counts_the_parameters_transformers_has(bench, tmp_path, arch):
    from testing_utils import make_tiny_hf

    _, wl = bench
    hf = make_tiny_hf(arch, str(tmp_path))
    name = wl.add_model_dir(str(tmp_path))
    try:
        assert name == f"model:{tmp_path.name}" and wl.SIZES[name]["dir"] == str(tmp_path)
        assert wl.param_counts(name)["total"] == sum(p.numel() for p in hf.parameters())
    finally:
        wl.SIZES.pop(name, None)


def test_model_and_scaling_options(bench, tmp_path):
    gs, wl = bench
    (tmp_path / "config.json").write_text(json.dumps(dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100, tie_word_embeddings=True, model_type="llama")))
    args = gs.parse_args(["--quick", "--model", str(tmp_path), "--scaling", "8x64,16x32"])
    try:
        assert args.sizes == [f"model:{tmp_path.name}"] and args.scaling == [(8, 64), (16, 32)]
        assert gs._slug(args.sizes[0]) == f"model_{tmp_path.name}".replace("-", "_")
    finally:
        wl.SIZES.pop(args.sizes[0], None)
    with pytest.raises(SystemExit):
        gs.parse_args(["--scaling", "8by64"])
    with pytest.raises(SystemExit):
        gs.parse_args(["--model", str(tmp_path / "missing")])


def test_reward_curves_compare_step_by_step(bench):
    gs, _ = bench
    ours = [{"score": 0.50}, {"score": 0.60}, {"score": None}]
    trl = [{"score": 0.52}, {"score": 0.56}, {"score": 0.7}]
    c = gs.reward_curves(ours, trl)
    assert c["steps"] == 2 and c["mae"] == pytest.approx(0.03) and c["relative_mae"] == pytest.approx(0.03 / 0.54)
    assert gs.reward_curves([], trl) == {}


def test_rounds_alternate_the_order_and_keep_each_sides_quietest_run(bench, tmp_path, monkeypatch):
    gs, wl = bench
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setitem(wl.SIZES, "model:m", {"dir": str(model)})
    medians = {"ours": iter([2.0, 1.5, 1.8]), "ours_vllm": iter([1.0, 1.2, 0.9])}
    order = []

    def fake_run(size, w, d, engine="megatron"):
        side = gs.SIDE[engine]
        order.append(side)
        m = next(medians[side])  # step 1 is left out: its time must not decide
        return {"steps": [{"step_s": 100.0}, {"step_s": m - 0.1}, {"step_s": m}, {"step_s": m + 0.1}], "load": {}}

    monkeypatch.setattr(gs, "run_ours", fake_run)
    w = {"steps": 4, "rounds": 3}
    r = gs.run_size(0, "model:m", w, str(tmp_path / "work"), None, None, None, ("megatron", "vllm"))
    assert order == ["ours", "ours_vllm", "ours_vllm", "ours", "ours", "ours_vllm"]
    assert r["ours"]["rounds_step_s"] == [2.0, 1.5, 1.8] and gs.median_step(r["ours"]["steps"]) == 1.5
    assert r["ours_vllm"]["rounds_step_s"] == [1.0, 1.2, 0.9] and gs.median_step(r["ours_vllm"]["steps"]) == 0.9
    with pytest.raises(SystemExit):
        gs.parse_args(["--rounds", "0"])
