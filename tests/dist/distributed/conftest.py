"""The 2-rank actor plan (reference colocated on it) with its placement groups, on the module's
local Ray instance (ray_session, tests/dist/conftest.py)."""

import pytest


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
