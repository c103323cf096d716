"""One local Ray instance per test module (4 logical CPUs, 4 logical NPUs, no dashboard), and the
2-rank actor plan (reference colocated on it) with its placement groups."""
import logging
import os

import pytest
import ray


@pytest.fixture(scope="module")
def ray_session():
    os.environ.pop("RAY_ADDRESS", None)
    logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)  # no CANN here: expected
    ray.init(address="local", num_cpus=4, resources={"NPU": 4}, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def plan():
    from ray_test_workers import plan_of

    return plan_of("resource_pool.actor_rollout=[2]")  # actor 2 ranks; ref colocated on them


@pytest.fixture(scope="module")
def pools(ray_session, plan):
    from mindspeed_rl.distributed.pools import create_pools, remove_pools

    pools = create_pools(list(plan.values()), "NPU", timeout_s=30)
    yield pools
    remove_pools(pools)
