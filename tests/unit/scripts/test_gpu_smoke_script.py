"""scripts/gpu_smoke.py without an accelerator: the no-device sentence and exit code, argument
checks, the ray_gpt command and run summary, and the bf16 bound. The whole script runs on CPU in
tests/e2e/test_gpu_smoke_cpu.py."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "scripts" / "gpu_smoke.py")
gs = importlib.util.module_from_spec(spec)
sys.modules["gpu_smoke"] = gs
spec.loader.exec_module(gs)


@pytest.mark.parametrize("device", ["auto", "cuda", "npu"])
def test_no_accelerator_is_one_sentence_and_exit_3(capsys, device):
    assert gs.main(["--device", device]) == gs.NO_DEVICE
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("gpu_smoke: no ") and "nothing was checked" in out[0]


@pytest.mark.parametrize("bad", [["--batch", "0"], ["--seq", "4"], ["--shape", "tiny", "--seq", "4096"],
                                 ["--device", "tpu"], ["--only", "parity,warp"], ["--only", ","]])
def test_bad_arguments_exit_2(bad):
    with pytest.raises(SystemExit) as err:
        gs.parse_args(bad)
    assert err.value.code == 2


def test_ray_gpt_command_is_the_tiny_task_colocated_on_the_platform(tmp_path):
    cmd = gs.ray_gpt_command("cuda", 5, str(tmp_path), bf16=True)
    assert cmd[1].endswith("ray_gpt.py")
    assert {"training.platform=cuda", "training.train_iters=5", "training.bf16=true",
            f"training.output_dir={tmp_path}", "training.test_freq=0"} <= set(cmd)
    assert not any(c.startswith("resource_pool") for c in cmd)  # the tiny default: colocated on one device


def write_metrics(path, norms):
    rows = [{"step": i + 1, "grpo/score/mean": 0.1 * i, "actor/grad_norm": n, "timing/step": 0.2, "timing/gen": 0.1}
            for i, n in enumerate(norms)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_run_summary_needs_every_step_and_finite_grad_norms(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", [1.0, 0.5, 0.7])
    ok, f = gs.summarize_run(str(tmp_path), 3)
    assert ok and f["steps"] == 3 and f["score_last"] == pytest.approx(0.2) and f["step_s_mean"] == pytest.approx(0.2)
    assert not gs.summarize_run(str(tmp_path), 4)[0]  # a step missing
    write_metrics(tmp_path / "metrics.jsonl", [1.0, math.nan, 0.7])
    assert not gs.summarize_run(str(tmp_path), 3)[0]
    ok, f = gs.summarize_run(str(tmp_path / "nowhere"), 3)
    assert not ok and "was not written" in f["error"]


def test_bf16_bound_is_relative_to_transformers_own_bf16_error():
    assert gs.bf16_bound(0.0) == pytest.approx(gs.BF16_SLACK)
    assert gs.bf16_bound(0.1) == pytest.approx(0.2 + gs.BF16_SLACK)


def test_only_runs_the_named_checks_and_skips_the_rest(tmp_path, capsys):
    args = gs.parse_args(["--device", "cpu", "--shape", "tiny", "--batch", "2", "--seq", "16", "--only", "build, parity",
                          "--json", str(tmp_path / "s.json")])
    assert args.only == ["build", "parity"]
    results = gs.run(args, "cpu")
    status = {k: v["status"] for k, v in results["checks"].items()}
    assert status == {"build": "PASS", "parity": "PASS", "greedy": "SKIP", "update": "SKIP", "rounding": "SKIP",
                      "decode": "SKIP", "compiled": "SKIP", "speed": "SKIP", "ray_gpt": "SKIP"}
    assert results["checks"]["greedy"]["figures"]["reason"] == "not in --only"


def test_compiled_fails_when_the_compile_fell_back_to_eager(monkeypatch):
    """`compiled` passes only when the step really ran compiled: here torch.compile fails (inductor
    with no C++ compiler), the engine decodes eagerly with the same tokens, and the check fails."""
    from torch._inductor.compile_fx import compile_fx

    from mindspeed_rl.rollout import kv_cache, native

    def inductor_without_cxx(gm, example_inputs):
        with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/g++",), "fx_graph_cache": False}):
            return compile_fx(gm, example_inputs)

    monkeypatch.setattr(native, "compiled_decode_step", lambda: kv_cache.compiled_decode_step(inductor_without_cxx))
    # Dynamo keeps compiled code per function, not per torch.compile wrapper: a graph an earlier test
    # compiled for the same shapes (the native engine's tiny Qwen2) would run without calling this backend
    torch._dynamo.reset()
    args = gs.parse_args(["--device", "cpu", "--shape", "tiny", "--gen-batch", "4", "--new-tokens", "4",
                          "--only", "build,compiled"])
    check = gs.run(args, "cpu")["checks"]["compiled"]
    assert check["status"] == "FAIL", check
    assert check["figures"]["still_compiled"] is False and check["figures"]["fp32_rows_identical"] == 4


def test_a_crashing_check_fails_with_its_traceback(monkeypatch):
    def boom(ctx):
        raise RuntimeError("device said no")
    monkeypatch.setattr(gs, "CHECKS", [("build", boom)])
    results = gs.run(gs.parse_args(["--device", "cpu", "--shape", "tiny", "--seq", "16"]), "cpu")
    f = results["checks"]["build"]
    assert f["status"] == "FAIL" and f["figures"]["error"] == "RuntimeError: device said no"
    assert "in boom" in f["figures"]["traceback"]
