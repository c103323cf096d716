"""CPU workers compute with the CPU units of their device bundle, at normal priority.

Ray would start a colocated actor (num_cpus = bundle CPUs x 1/2) with OMP_NUM_THREADS=1 and
niceness 15; the Ray instances we start start their workers at 0 (cluster.NICENESS_ENV), and init_distributed sizes
torch's pool to the bundle's CPUs and renices to 0 where a cluster gave more.
"""

import pytest

from mindspeed_rl.distributed.plan import host_cpus_per_device, make_plan
from mindspeed_rl.distributed.pools import create_pools, remove_pools
from mindspeed_rl.distributed.worker_group import WorkerGroup
from ray_test_workers import ThreadsWorker, plan_of

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


def test_colocated_cpu_worker_gets_the_bundle_cpus_at_normal_priority(ray_session):
    plan = plan_of("resource_pool.actor_rollout=[1]")  # actor 1 rank, reference colocated on it (share 1/2)
    pools = create_pools(list(plan.values()), "NPU", cpus_per_device=2, timeout_s=30)
    group = WorkerGroup("actor", ThreadsWorker, pools["actor_rollout"], plan["actor_rollout"],
                        ready_timeout_s=60, call_timeout_s=30)
    try:
        report = group.run_rank0("report")
    finally:
        group.shutdown()
        remove_pools(pools)
    assert pools["actor_rollout"].share == 0.5  # Ray saw num_cpus=1 for this actor
    assert report["threads"] == 2 and report["omp"] == "2", report
    assert report["info"]["threads"] == 2
    assert report["given"]["nice"] == 0, report  # started at normal priority (cluster.NICENESS_ENV), not Ray's 15
    assert report["nice"] == 0 and report["info"]["nice"] == 0, report  # and still 0 after init_distributed


def test_host_cpus_per_device_splits_a_node_over_its_bundles():
    from mindspeed_rl.config import build_config, compose_yaml

    def plan(*o):
        return make_plan(build_config(compose_yaml("grpo_trainer_tiny", list(o)), "t"))

    assert host_cpus_per_device(plan(), {"n": 1}, {"n": 2}) == 2  # 1 bundle, 2 cores: both
    assert host_cpus_per_device(plan("resource_pool.actor_rollout=[2]"), {"n": 2}, {"n": 2}) == 1
    # a separate reference pool takes a bundle too
    assert host_cpus_per_device(plan("resource_pool.ref=[1]"), {"n": 2}, {"n": 8}) == 4
    # a big node with spare devices: only the plan's devices share its CPUs; the smallest node decides
    assert host_cpus_per_device(plan("resource_pool.actor_rollout=[2]"), {"a": 8, "b": 2}, {"a": 16, "b": 4}) == 2
    assert host_cpus_per_device(plan(), {"n": 4}, {"n": 1}) == 1  # never below 1
