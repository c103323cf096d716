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


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dtype_reaches_both_of_our_roles_and_the_settings_check(bench, tmp_path, dtype):
    gs, _ = bench
    args = gs.parse_args(["--sizes", "tiny", "--dtype", dtype])
    w = gs.workload(args)
    assert w["dtype"] == dtype
    d = {"config_dir": str(tmp_path), "model": str(tmp_path / "model"), "prompts": str(tmp_path / "p.jsonl"),
         "ours": str(tmp_path / "ours")}
    with open(gs.our_config("tiny", w, d)) as f:
        cfg = json.load(f)
    roles = cfg["actor_rollout_ref"]
    assert roles["actor_rollout"]["bf16"] is roles["ref"]["bf16"] is (dtype == "bf16")
    # compute and master precision must match; a TRL run in another precision stops the comparison
    ours = {"compute_dtype": "bfloat16" if dtype == "bf16" else "float32", "master_dtype": "float32"}
    _, bad = gs.check_settings(ours, dict(ours))
    assert "compute_dtype" not in bad and "master_dtype" not in bad
    _, bad = gs.check_settings(ours, {**ours, "compute_dtype": "float32" if dtype == "bf16" else "bfloat16"})
    assert "compute_dtype" in bad
    with pytest.raises(SystemExit):
        gs.parse_args(["--dtype", "fp16"])


def test_matmul_peak_is_measured_in_the_asked_precision(bench, monkeypatch):
    import torch

    _, wl = bench
    seen = []
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: seen.append(a.dtype) or mm(a, b))
    assert wl.matmul_peak(1, n=64, repeats=1, dtype="bf16") > 0
    assert wl.matmul_peak(1, n=64, repeats=1) > 0
    assert set(seen) == {torch.bfloat16, torch.float32} and seen[0] == torch.bfloat16


@pytest.mark.parametrize("driver_old", [2e-5, 0.2])
def test_the_probe_forward_is_not_counted_as_old_log_probs(bench, tmp_path, monkeypatch, driver_old):
    """On-policy the trainer asks for no old log-probs; the worker's compute_log_prob time is then the
    vLLM sync check's probe forward, already in `sync` (counted once, so `other` is not negative)."""
    gs, _ = bench
    out = tmp_path / "ours_vllm"
    monkeypatch.setattr(gs, "our_config", lambda *a, **k: None)

    def fake_run(cmd, env, log_path, timeout):
        out.mkdir(exist_ok=True)
        record = {"step": 1, "timing/step": 1.0, "timing/gen": 0.6, "timing/reward": 0.01, "timing/ref": 0.0,
                  "timing/old_log_prob": driver_old, "timing/adv": 0.001, "timing/update_actor": 0.3,
                  "timing/sync_weights": 0.05, "timing/sync_check": 0.08, "timing/gen_worker": 0.4,
                  "timing/ref_worker": 0.1, "timing/old_log_prob_worker": 0.03 + driver_old,
                  "timing/update_actor_worker": 0.28, "timing/sync_weights_worker": 0.05,
                  "prompt_length/mean": 4.0, "response_length/mean": 64.0, "grpo/score/mean": 0.5}
        (out / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        return {}

    monkeypatch.setattr(gs, "run_monitored", fake_run)
    d = {"ours_vllm": str(out), "config_dir": str(tmp_path), "root": str(tmp_path)}
    step = gs.run_ours("10m", {"prompts_per_step": 2, "n_samples": 8, "threads": 2}, d, "vllm")["steps"][0]
    assert step["sync"] == pytest.approx(0.13)
    assert step["old_log_prob"] == (0.0 if driver_old < 1e-3 else pytest.approx(0.23))
    if driver_old < 1e-3:
        assert step["other"] >= 0


def test_arith_task_is_the_smollm2_examples_and_needs_a_model(bench, tmp_path):
    gs, wl = bench
    (tmp_path / "config.json").write_text(json.dumps(dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100, tie_word_embeddings=True, model_type="llama")))
    args = gs.parse_args(["--model", str(tmp_path), "--task", "arith", "--dtype", "bf16", "--stochastic-rounding"])
    try:
        w = gs.workload(args)
        d = {"config_dir": str(tmp_path), "model": str(tmp_path), "prompts": str(tmp_path / "p.jsonl"),
             "ours": str(tmp_path / "ours")}
        with open(gs.our_config(args.sizes[0], w, d)) as f:
            cfg = json.load(f)
    finally:
        wl.SIZES.pop(args.sizes[0], None)
    actor = cfg["actor_rollout_ref"]["actor_rollout"]
    # the example's learning rate, weight decay, chat template and reward; the settings TRL gets are w's
    import yaml
    example = yaml.safe_load(open(wl.SMOLLM2_EXAMPLE))["actor_rollout_ref"]["actor_rollout"]
    assert actor["lr"] == w["lr"] == float(example["lr"]) and actor["weight_decay"] == w["weight_decay"] == 0.0
    assert actor["prompt_type"] == "hf" == example["prompt_type"] and actor["bf16_stochastic_rounding"] is True
    assert cfg["algorithm"]["verifier_function"] == [f"{gs.ARITH_REWARD_FILE}:compute_score"]
    assert cfg["training"]["seq_length"] == actor["max_prompt_length"] + actor["max_new_tokens"]
    # the prompts carry the example's instruction; the reward is its gsm8k + 0.5 x hash_format
    rows = [json.loads(line) for line in open(wl.write_arith_prompts(str(tmp_path / "p.jsonl")))]
    assert rows[0]["prompt"] == example["instruction_template"].replace("{prompt}", "What is 2 - 1?")
    assert rows[0]["labels"] == "1" and len(rows) == 2000
    import importlib.util
    spec = importlib.util.spec_from_file_location("arith_reward", gs.ARITH_REWARD_FILE)
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    from mindspeed_rl.rewards.scoring import compute_score
    for response in ("#### 1", "It is 1.", "#### 2", "1 #### 1 and more", "", "#### 1\n"):
        assert reward.compute_score(response, "1") == \
            compute_score("gsm8k", response, "1") + 0.5 * compute_score("hash_format", response, "1"), response
    for bad in (["--model", str(tmp_path), "--stochastic-rounding"],           # fp32 has no rounding
                ["--task", "arith"],                                            # no chat model
                ["--task", "arith", "--model", str(tmp_path), "--sizes", "10m"]):  # random sizes cannot chat
        with pytest.raises(SystemExit):
            try:
                gs.parse_args(bad)
            finally:
                for name in [k for k in wl.SIZES if k.startswith("model:")]:
                    wl.SIZES.pop(name)


def test_learning_is_compared_from_the_first_steps_to_the_last(bench):
    gs, _ = bench
    ours = [{"score": s, "step_s": 2.0} for s in (0.2, 0.2, 0.3, 0.5, 0.6, 0.7, 0.7, 0.8, 0.8)]
    trl = [{"score": s, "step_s": 3.0} for s in (0.2, 0.3, 0.2, 0.4, 0.5, 0.6, 0.6, 0.7, 0.8)]
    c = gs.reward_curves(ours, trl)
    assert c["ends_steps"] == 3 and c["ours_first"] == pytest.approx(0.7 / 3) and c["ours_last"] == pytest.approx(0.77,
                                                                                                                    abs=0.01)
    assert c["trl_first"] == pytest.approx(0.7 / 3) and c["trl_last"] == pytest.approx(0.7)
    assert c["ours_seconds"] == 18.0 and c["trl_seconds"] == 27.0


def test_micro_batch_reaches_both_of_our_roles_and_must_divide_the_step(bench, tmp_path):
    gs, _ = bench
    args = gs.parse_args(["--sizes", "tiny", "--prompts-per-step", "8", "--micro-batch", "16"])
    w = gs.workload(args)
    d = {"config_dir": str(tmp_path), "model": str(tmp_path / "model"), "prompts": str(tmp_path / "p.jsonl"),
         "ours": str(tmp_path / "ours")}
    with open(gs.our_config("tiny", w, d)) as f:
        cfg = json.load(f)
    roles = cfg["actor_rollout_ref"]
    assert w["micro_batch"] == 16 and roles["actor_rollout"]["micro_batch_size"] == roles["ref"]["micro_batch_size"] == 16
    assert roles["actor_rollout"]["no_shuffle"] is True  # file order: both sides see the same prompts at step k
    default = gs.workload(gs.parse_args(["--sizes", "tiny"]))
    assert default["micro_batch"] == 16  # 2 prompts x 8 samples: all at once
    for bad in (["--micro-batch", "5"], ["--micro-batch", "0"], ["--micro-batch", "8", "--scaling", "8x64"]):
        with pytest.raises(SystemExit):
            gs.parse_args(bad)
    _, bad = gs.check_settings({"micro_batch": 16, "prompt_order": "file order"},
                               {"micro_batch": 64, "prompt_order": "file order"})
    assert "micro_batch" in bad and "prompt_order" not in bad


def test_device_reaches_our_platform_trls_config_and_the_settings_check(bench, tmp_path, monkeypatch):
    """--device cuda: our trainer on platform cuda, TRL's GRPOConfig with use_cpu=False, and the
    device one of the settings that must match; --trl-python is taken as given."""
    from types import SimpleNamespace

    gs, _ = bench
    import _trl_side

    d = {"config_dir": str(tmp_path), "model": str(tmp_path / "model"), "prompts": str(tmp_path / "p.jsonl"),
         "ours": str(tmp_path / "ours")}
    monkeypatch.setitem(sys.modules, "trl", SimpleNamespace(GRPOConfig=lambda **kw: kw))
    for device in ("cpu", "cuda"):
        args = gs.parse_args(["--sizes", "tiny", "--dtype", "bf16", "--device", device, "--trl-python", "/x/python3"])
        w = gs.workload(args)
        with open(gs.our_config("tiny", w, d)) as f:
            assert json.load(f)["training"]["platform"] == device
        trl = _trl_side.grpo_config(w, str(tmp_path / "trl"))
        assert trl["use_cpu"] is (device == "cpu") and trl["bf16"] is True
        assert args.trl_python == "/x/python3"
    _, bad = gs.check_settings({"device": "cuda"}, {"device": "cpu"})
    assert "device" in bad
    assert gs.workload(gs.parse_args(["--sizes", "tiny"]))["device"] == "cpu"
    with pytest.raises(SystemExit):
        gs.parse_args(["--device", "npu"])


def test_seeds_vary_the_sampling_seed_and_average_the_reward_curves(bench, tmp_path, monkeypatch):
    """--seeds 3: each side runs 3 times with seeds 1234, 1235, 1236 (TRL reads its seed from the
    workload file), the model is built once from the base seed, and the reward curves compare the
    per-seed means with the gap sampling noise alone would leave."""
    import math
    import statistics

    gs, wl = bench
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setitem(wl.SIZES, "model:m", {"dir": str(model)})
    scores = {"ours": {1234: [0.2, 0.4], 1235: [0.4, 0.6], 1236: [0.3, 0.8]},
              "trl": {1234: [0.3, 0.5], 1235: [0.3, 0.5], 1236: [0.3, 0.8]}}
    seen = []

    def result(side, seed):
        seen.append((side, seed))
        return {"steps": [{"step": k + 1, "step_s": 1.0, "score": x} for k, x in enumerate(scores[side][seed])],
                "load": {"processes": {"main": {"nice": 0}}}, "settings": {}}

    def fake_trl(python, w, d):
        with open(d["workload"]) as f:
            return result("trl", json.load(f)["seed"])

    monkeypatch.setattr(gs, "run_ours", lambda size, w, d, engine="megatron": result("ours", w["seed"]))
    monkeypatch.setattr(gs, "run_trl", fake_trl)
    monkeypatch.setattr(gs, "our_settings", lambda size, d, processes: {})
    w = {"steps": 2, "seeds": 3, "seed": 1234, "prompts_per_step": 2, "n_samples": 8}
    r = gs.run_size(0, "model:m", w, str(tmp_path / "work"), None, None, "/x/python", ("megatron",))
    assert sorted(seen) == [(side, s) for side in ("ours", "trl") for s in (1234, 1235, 1236)]
    c = r["reward_curves"]
    assert c["seeds"] == 3
    assert c["ours_mean"] == pytest.approx(statistics.fmean([0.3, 0.6]))  # step means 0.3, 0.6
    assert c["trl_mean"] == pytest.approx(statistics.fmean([0.3, 0.6]))
    assert c["mae"] == pytest.approx(0.0)
    se = lambda xs: statistics.stdev(xs) / math.sqrt(3)  # noqa: E731
    expected = statistics.fmean(math.sqrt(2 / math.pi) * math.hypot(se(a), se(b))
                                for a, b in (([0.2, 0.4, 0.3], [0.3, 0.3, 0.3]), ([0.4, 0.6, 0.8], [0.5, 0.5, 0.8])))
    assert c["noise_mae"] == pytest.approx(expected)
    assert c["relative_mae_per_seed"][0] == pytest.approx(0.1 / 0.4)
    for bad in (["--seeds", "0"], ["--seeds", "2", "--rounds", "2"]):
        with pytest.raises(SystemExit):
            gs.parse_args(bad)


def test_compile_reaches_our_engines_and_is_shown_beside_trls_eager_generation(bench, tmp_path):
    """--compile: enforce_eager false for our native and vLLM engines (--vllm-compile: vLLM only);
    the generation mode of each side is shown with the settings, not matched (TRL cannot compile)."""
    gs, _ = bench
    d = {"config_dir": str(tmp_path), "model": str(tmp_path / "model"), "prompts": str(tmp_path / "p.jsonl"),
         "ours": str(tmp_path / "ours"), "ours_vllm": str(tmp_path / "ours_vllm")}

    def eager(argv, engine):
        with open(gs.our_config("tiny", gs.workload(gs.parse_args(["--sizes", "tiny", *argv])), d, engine)) as f:
            return json.load(f)["actor_rollout_ref"]["actor_rollout"]["enforce_eager"]

    assert eager([], "megatron") is True and eager([], "vllm") is True
    assert eager(["--compile"], "megatron") is False and eager(["--compile"], "vllm") is False
    assert eager(["--vllm-compile"], "megatron") is True and eager(["--vllm-compile"], "vllm") is False
    rows, bad = gs.check_settings({"generation": "decode step compiled"}, {"generation": "eager"})
    assert "generation" not in bad
    assert {"setting": "generation", "ours": "decode step compiled", "trl": "eager", "match": None} in rows


def test_device_cuda_without_a_gpu_is_one_sentence_and_exit_2(bench, capsys, monkeypatch, tmp_path):
    import torch

    gs, _ = bench
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gs.main(["--sizes", "tiny", "--device", "cuda", "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["grpo_step.py: --device cuda, but torch sees no GPU on this machine; run it where one is, "
                   "or use --device cpu."]
