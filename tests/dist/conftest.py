"""Fixtures shared by the multi-process tests: one local Ray instance per test module."""
import logging
import os

import pytest
import ray


@pytest.fixture(scope="module")
def ray_session():
    """4 logical CPUs, 4 logical NPUs, no dashboard; never a cluster that happens to run here."""
    os.environ.pop("RAY_ADDRESS", None)
    if ray.is_initialized():  # a test of this module connected by itself and failed before disconnecting
        ray.shutdown()
    logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)  # no CANN here: expected
    ray.init(address="local", num_cpus=4, resources={"NPU": 4}, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()
