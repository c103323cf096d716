"""scripts/gpu_smoke.py end to end with --device cpu, so the GPU smoke check cannot rot between
GPU runs: build + HF load, parity, greedy, a bf16 update, decode speed, the compiled decode step,
the compiled decoder layers in training and a ray_gpt run (fp32)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_every_check_passes_on_cpu(tmp_path):
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), "--device", "cpu", "--shape", "tiny",
                           "--batch", "4", "--seq", "32", "--gen-batch", "8", "--new-tokens", "8", "--ray-steps", "2", "--ray-variants", "fp32",
                           "--speed-rows", "2", "--speed-seq", "32", "--speed-repeat", "1",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["passed"] and results["device"].startswith("cpu")
    checks = results["checks"]
    assert {k: v["status"] for k, v in checks.items()} == {k: "PASS" for k in
                                                          ("build", "parity", "greedy", "update", "rounding",
                                                           "decode", "compiled", "train_compiled", "speed",
                                                           "ray_gpt")}
    assert checks["parity"]["figures"]["fp32_max"] <= 2e-3
    assert checks["update"]["figures"]["params_changed"] > 0
    assert checks["rounding"]["figures"]["update_rounded_as_expected"] and checks["rounding"]["figures"]["update_weights"] > 0
    assert checks["rounding"]["figures"]["nan_kept"]
    # fp32 only (CI's time, 2026-11-30): ray_gpt in bf16 on CPU is tests/e2e/test_ray_gpt_e2e.py's bf16 run, and
    # --ray-variants' parsing tests/unit/scripts/test_gpu_smoke_script.py's; on a GPU the script runs both
    assert set(checks["ray_gpt"]["figures"]) >= {"fp32"} and "bf16" not in checks["ray_gpt"]["figures"]
    compiled = checks["compiled"]["figures"]
    assert compiled["still_compiled"] and compiled["fp32_rows_identical"] == compiled["rows"] == 8
    assert compiled["compiled_tok_s"] > 0 and compiled["eager_tok_s"] > 0
    train = checks["train_compiled"]["figures"]
    assert train["still_compiled"] and train["layers_compiled"] == 2 and train["fp32_forward_max"] <= 1e-4
    assert train["bf16_compiled_s"] > 0 and train["bf16_eager_s"] > 0
    assert len(checks["ray_gpt"]["figures"]["fp32"]["timing"]) == 2
    assert checks["ray_gpt"]["figures"]["fp32"]["startup_s"] > 0 and checks["ray_gpt"]["figures"]["fp32"]["wall_s"] > 0
    speed = checks["speed"]["figures"]
    assert speed["tokens"] == 64 and speed["ours_s"] > 0 and speed["transformers_s"] > 0 and speed["matmul_tflops_bf16"] > 0
