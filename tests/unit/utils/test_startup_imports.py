"""Start-up cost: the driver's config check and modules, and the reward scorer's, do not import what only some
runs use. torch._dynamo (2-7 s on a 2-core host) loads when something compiles (and in the model workers through
megatron-core's own import), math-verify (1-5 s) when a math verifier scores; measured on the tiny task, 2026-11-30, on a slow host: the driver's
config import went from 15.6 s to 4.6 s."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch._dynamo", "math_verify", "sympy", "datasets")


def loaded_after(code: str) -> list[str]:
    probe = code + f"\nimport json, sys; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_driver_and_reward_modules_import_none_of_the_heavy_optional_libraries():
    # (the model workers import megatron-core, whose import calls torch.compile itself: they load dynamo anyway)
    assert loaded_after("import mindspeed_rl.config, mindspeed_rl.rewards, mindspeed_rl.trainer.launch, "
                        "mindspeed_rl.workers.reward, mindspeed_rl.platform") == []


def test_the_tiny_configs_check_imports_none_of_them():
    # the driver's whole config stage for `python ray_gpt.py` (the tiny task's reward is not math)
    assert loaded_after("from mindspeed_rl.config import load_config; load_config('grpo_trainer_tiny', [])") == []


def test_a_math_scorer_loads_math_verify_before_its_first_call_and_still_scores():
    out = loaded_after("from mindspeed_rl.workers.reward import RuleRewardScorer\n"
                       "RuleRewardScorer(None, ['math'])\n"
                       "from mindspeed_rl.rewards import compute_score\n"
                       "assert compute_score('math', 'so \\\\boxed{\\\\frac{1}{2}}', '0.5') == 1.0")
    assert "math_verify" in out


def test_compile_failed_names_dynamos_compile_errors():
    from mindspeed_rl.platform.base import compile_failed

    import torch._dynamo.exc as exc

    assert compile_failed() == (exc.BackendCompilerFailed, exc.InternalTorchDynamoError)
