"""cluster.connect: a dead address fails fast by name; "local" starts Ray with the plan's logical NPUs."""
import time

import pytest
import ray

from mindspeed_rl.distributed import cluster
from mindspeed_rl.distributed.cluster import ClusterError, connect
from mindspeed_rl.platform import get_platform
from ray_test_workers import plan_of

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


def test_dead_address_fails_fast_naming_it(monkeypatch):
    assert not ray.is_initialized()
    start = time.monotonic()
    with pytest.raises(ClusterError, match=r"no Ray cluster answered at 127\.0\.0\.1:1 within 2 s"):
        connect([], get_platform("cpu"), address="127.0.0.1:1", timeout_s=2)
    assert time.monotonic() - start < 5
    with pytest.raises(ClusterError, match="is not host:port"):
        connect([], get_platform("cpu"), address="head-node", timeout_s=2)
    monkeypatch.setattr(cluster, "_recorded_address", lambda: None)  # no `ray start` on this machine
    with pytest.raises(ClusterError, match="no `ray start` cluster is recorded"):
        connect([], get_platform("cpu"), address="auto")


def test_local_start_has_the_plan_logical_npus(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    plan = list(plan_of("resource_pool.actor_rollout=[3]").values())
    try:
        info = connect(plan, get_platform("cpu"), address="local")
        assert info.started_local and info.resource == "NPU"
        assert list(info.nodes.values()) == [3.0]  # ref is colocated: 3, not 6
        assert list(info.cpus.values())[0] >= 3  # at least one logical CPU per logical NPU
        again = connect(plan, get_platform("cpu"))  # already connected: just describes
        assert again.nodes == info.nodes and not again.started_local
    finally:
        ray.shutdown()
