"""Worker groups never hang: timeouts, dead workers, raising methods and __init__ all fail fast
with a one-line WorkerGroupError naming role, method and rank."""
import time

import pytest

from mindspeed_rl.distributed.worker_group import WorkerGroup, WorkerGroupError
from ray_test_workers import GlooWorker

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def healthy(pools, plan):
    """A group whose failures leave it usable (a method raising, a method that does not exist)."""
    group = WorkerGroup("actor", GlooWorker, pools["actor_rollout"], plan["actor_rollout"],
                        ready_timeout_s=60, call_timeout_s=30)
    yield group
    group.shutdown()


@pytest.fixture
def group(pools, plan, healthy):
    """A fresh 2-rank group (on the pool's other half, as a colocated role would be): after a
    timeout or a death a group is in an unknown state."""
    group = WorkerGroup("actor", GlooWorker, pools["actor_rollout"], plan["actor_rollout"],
                        ready_timeout_s=60, call_timeout_s=30)
    yield group
    group.shutdown()


def test_method_past_its_timeout_names_role_method_and_rank(group):
    start = time.monotonic()
    with pytest.raises(WorkerGroupError) as err:
        group.run_all("sleep_on", 1, 60, timeout_s=2)
    assert time.monotonic() - start < 10
    msg = str(err.value)
    assert "actor.sleep_on timed out after 2 s" in msg and "\n" not in msg
    assert f"rank 1 of 2 (pid {group.slots[1].pid} on {group.slots[1].node_ip}) is waiting" in msg, msg
    assert "rank 0 " not in msg  # rank 0 answered


def test_dead_worker_names_role_rank_node_and_log(group):
    start = time.monotonic()
    with pytest.raises(WorkerGroupError) as err:
        group.run_all("exit_on", 1)  # rank 0 keeps "hanging" for 30 s: not waited for
    assert time.monotonic() - start < 10
    msg = str(err.value)
    assert f"actor rank 1 on {group.slots[1].node_ip} died during exit_on" in msg
    assert f"worker-*-{group.slots[1].pid}.err" in msg and "\n" not in msg
    group.shutdown()
    with pytest.raises(WorkerGroupError, match="actor.rank_info called after the group was shut down"):
        group.run_all("rank_info")


def test_raising_method_names_the_exception(healthy, monkeypatch):
    """The one-line error says "traceback above": the worker's traceback is logged on the driver first
    (Ray returns it with the error and prints it nowhere; before, a raising vLLM sync left no trace)."""
    from mindspeed_rl.distributed import worker_group

    logged = []
    monkeypatch.setattr(worker_group, "get_logger", lambda name: type("L", (), {
        "error": staticmethod(lambda fmt, *a: logged.append(fmt % a))})())
    with pytest.raises(WorkerGroupError, match=r"actor rank 1 on .* raised in raise_on: KeyError: 'no such sample'"):
        healthy.run_all("raise_on", 1)
    assert len(logged) == 1 and "actor rank 1 raised in raise_on; its traceback:" in logged[0]
    assert 'ray_test_workers.py", line' in logged[0] and "raise KeyError(" in logged[0]  # the worker's frames
    assert healthy.run_rank0("raise_on", 1) == 0  # still usable


def test_device_oom_names_the_allocator_figures_and_the_advice(healthy):
    healthy.oom_advice = lambda method: f"lower the micro-batch of {method}"
    try:
        with pytest.raises(WorkerGroupError) as err:
            healthy.run_all("oom_on", 1)
    finally:
        healthy.oom_advice = None
    msg = str(err.value)
    assert msg.startswith(f"actor rank 1 on {healthy.slots[1].node_ip} ran out of device memory in oom_on: CUDA out "
                          "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
                          "1.20 GiB is free; lower the micro-batch of oom_on (log: "), msg
    assert healthy.run_rank0("oom_on", 1) == 0  # still usable


def test_failing_init_is_reported_and_cleaned_up(pools, plan, healthy):
    start = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"actor rank \d on .* died during __init__: its __init__ raised "
                                               r"ValueError: bad init value"):
        WorkerGroup("actor", GlooWorker, pools["actor_rollout"], plan["actor_rollout"], kwargs={"fail_init": True},
                    ready_timeout_s=300)
    # reported when the rank died, not at the ready deadline (two worker starts take 5-60 s on 2 busy cores)
    assert time.monotonic() - start < 150


def test_unknown_method_is_named(healthy):
    with pytest.raises(WorkerGroupError, match=r"actor workers \(GlooWorker\) have no method 'generate'"):
        healthy.run_all("generate")
