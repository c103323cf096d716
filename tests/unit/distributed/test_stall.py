"""Stall reports: a stopped process is found by its /proc state and named, with what the others wait for."""
import os
import signal
import subprocess
import sys
import time

from mindspeed_rl.distributed.stall import ProcState, describe_stall, probe_states, read_proc_state


def test_read_proc_state_of_a_stopped_and_a_sleeping_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.time() + 30
        while read_proc_state(proc.pid).state != "S" and time.time() < deadline:
            time.sleep(0.05)
        assert read_proc_state(proc.pid).state == "S"
        os.kill(proc.pid, signal.SIGSTOP)
        while read_proc_state(proc.pid).state != "T" and time.time() < deadline:
            time.sleep(0.05)
        st = probe_states({0: ("127.0.0.1", "node", proc.pid)})[0]
        assert st.stopped and st.state == "T"
    finally:
        proc.kill()
        proc.wait()
    assert read_proc_state(proc.pid).state == "?"  # gone
    assert probe_states({3: ("127.0.0.1", "node", None)}) == {3: ProcState("?")}  # pid not known yet


WHERE = {0: ("10.0.0.1", "n1", 100), 1: ("10.0.0.2", "n2", 200)}


def test_stopped_rank_named_and_the_waiting_one_explained():
    msg = describe_stall("actor_rollout", "update_actor", 20, 2, [0, 1], WHERE,
                         {0: ProcState("S", "futex_wait_queue"), 1: ProcState("T")})
    assert msg.startswith("actor_rollout.update_actor timed out after 20 s (`training.worker_timeout_s`")
    assert "rank 1 of 2 (pid 200 on 10.0.0.2) is stopped (state T: SIGSTOP or a debugger), so it never finished update_actor" in msg
    assert "rank 0 of 2 (pid 100 on 10.0.0.1) is waiting, in futex_wait_queue, most likely for rank 1 in a collective" in msg
    assert msg.index("rank 1 of 2") < msg.index("rank 0 of 2")  # the culprit first
    assert "\n" not in msg


def test_all_computing_says_the_timeout_is_too_short():
    msg = describe_stall("reference", "compute_ref_log_prob", 5, 2, [0, 1], WHERE, {0: ProcState("R"), 1: ProcState("R")})
    assert "raise it if the step is just slow" in msg and msg.count("still running (computing)") == 2


def test_dead_and_unreadable_ranks():
    msg = describe_stall("rollout", "generate_sequences", 7, 2, [0, 1], WHERE,
                         {0: ProcState("Z"), 1: ProcState("?", "its node did not answer")})
    assert "rank 0 of 2 (pid 100 on 10.0.0.1) is dead (a zombie process)" in msg
    assert "rank 1 of 2 (pid 200 on 10.0.0.2) is in an unknown state (its node did not answer)" in msg
    start = describe_stall("actor", "__init__", 9, 1, [0], {0: ("10.0.0.1", "n1", None)}, {}, "training.worker_start_timeout_s")
    assert "(`training.worker_start_timeout_s`" in start and "rank 0 of 1 (on 10.0.0.1)" in start


def test_ray_start_timing_out_is_a_sentence(monkeypatch):
    """An overloaded machine: Ray's own start-up timeout becomes one sentence, not a traceback."""
    import pytest
    import ray

    from mindspeed_rl.distributed import cluster
    from mindspeed_rl.platform import get_platform

    calls, shutdowns = [], []

    def slow_init(**kwargs):
        calls.append(kwargs)
        if len(calls) < fail_times:  # the first fail_times - 1 starts time out
            raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", slow_init)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(cluster, "_describe", lambda *args: "described")
    monkeypatch.setenv(cluster.GCS_WAIT_ENV, "0")
    monkeypatch.delenv(cluster.GCS_WAIT_ENV)  # restored (unset) after the test whatever connect sets
    monkeypatch.setenv(cluster.NICENESS_ENV, "15")
    monkeypatch.delenv(cluster.NICENESS_ENV)
    fail_times = 2  # a busy machine: the second start makes it
    assert cluster.connect([], get_platform("cpu"), address="local") == "described"
    assert len(calls) == 2 and len(shutdowns) == 1
    assert [c["include_dashboard"] for c in calls] == [False, False]  # training.ray_dashboard's default
    assert os.environ[cluster.GCS_WAIT_ENV] == "120"  # Ray's GCS gets 120 s to start and answer, not 20
    assert os.environ[cluster.NICENESS_ENV] == "0"  # its workers start at normal priority, not Ray's nice 15
    monkeypatch.setenv(cluster.GCS_WAIT_ENV, "300")
    monkeypatch.setenv(cluster.NICENESS_ENV, "5")
    calls.clear()
    cluster.connect([], get_platform("cpu"), address="local", dashboard=True)
    assert os.environ[cluster.GCS_WAIT_ENV] == "300"  # the user's value is kept
    assert os.environ[cluster.NICENESS_ENV] == "5"
    assert calls[-1]["include_dashboard"] and calls[-1]["dashboard_host"] == "127.0.0.1"  # asked for: loopback only
    calls.clear()
    fail_times = cluster.LOCAL_START_ATTEMPTS + 1  # never: one sentence, not a traceback
    with pytest.raises(cluster.ClusterError, match=r"starting a local Ray instance failed 3 times: The current node "
                                                   r"timed out during startup\. .*\(load average [0-9.]+ on \d+ "
                                                   r"cores\); retry"):
        cluster.connect([], get_platform("cpu"), address="local")
    assert len(calls) == cluster.LOCAL_START_ATTEMPTS
