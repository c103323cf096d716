"""A worker killed by Ray's memory monitor (ray.exceptions.OutOfMemoryError, which is not a
RayActorError) becomes one WorkerGroupError sentence with the node's memory level and the fix,
not a Ray traceback (found when a shared machine filled up during the SmolLM2 example run)."""
from types import SimpleNamespace

from ray.exceptions import OutOfMemoryError

from mindspeed_rl.distributed.worker_group import WorkerGroup, WorkerGroupError

# Ray 2.60's text, shortened to the lines the message reads
RAY_TEXT = ("1 worker(s) were killed due to the node running low on memory. Memory on the node "
            "(IP: 192.0.2.2, ID: a081e2) was 23.30GB used / 23.54GB limit (0.989592)\n"
            "OOM kill reason: Memory usage 24066531328B exceeded threshold of 24012685312B\n"
            "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n31751\t6.71\tray::ActorRolloutWorker.generate_sequences")


def _group():
    slot = SimpleNamespace(node_ip="192.0.2.2", pid=31751)
    return SimpleNamespace(role="actor_rollout", slots=[slot])


def test_oom_kill_is_one_sentence_with_memory_level_and_fix():
    err = WorkerGroup._failure(_group(), 0, "generate_sequences", OutOfMemoryError(RAY_TEXT))
    msg = str(err)
    assert isinstance(err, WorkerGroupError)
    assert msg.startswith("actor_rollout rank 0 on 192.0.2.2 was killed during generate_sequences by "
                          "Ray's memory monitor: the node's memory reached 23.30GB of 23.54GB"), msg
    assert "micro_batch_size" in msg and "RAY_memory_usage_threshold" in msg
    assert "\n" not in msg


def test_oom_text_without_figures_still_names_the_cause():
    msg = str(WorkerGroup._failure(_group(), 0, "update_actor", OutOfMemoryError("killed")))
    assert "was killed during update_actor by Ray's memory monitor: the node ran low on memory" in msg
