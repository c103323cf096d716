"""Shared test setup: hooks and fixtures only (helpers live in testing_utils.py).

Like every worker process, the test session selects the device platform and applies its patches
before anything imports megatron (on CPU: the megatron-core CUDA shim).
"""

import datetime
import os

import pytest
import torch

from mindspeed_rl.platform import get_platform
from testing_utils import free_port


def pytest_configure(config):
    get_platform().patch()


@pytest.fixture(scope="session")
def gloo_world1():
    """A world-size-1 gloo process group in the test process (for megatron parallel_state)."""
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        torch.distributed.init_process_group(
            "gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    yield
