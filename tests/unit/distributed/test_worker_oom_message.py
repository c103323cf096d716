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


# torch 2.x's CUDA allocator text and torch_npu's (the NPU one from its allocator's format string)
CUDA_TEXT = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
             "1.20 GiB is free. Including non-PyTorch memory, this process has 77.90 GiB memory in use. Of the "
             "allocated memory 70.00 GiB is allocated by PyTorch, and 5.00 GiB is reserved by PyTorch but "
             "unallocated. If reserved but unallocated memory is large try setting "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
NPU_TEXT = ("NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity; 58.10 GiB already "
            "allocated; 58.10 GiB current active; 1.10 GiB free; 59.00 GiB reserved in total by PyTorch) If "
            "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.")


class _TaskError(Exception):
    """What ray.get raises for a method that raised: the worker's exception as `cause`."""

    def __init__(self, cause):
        super().__init__(f"ray::ActorRolloutWorker.update_actor() ... {cause}")
        self.cause = cause


def test_device_oom_is_one_sentence_with_the_allocator_figures_and_the_keys():
    import torch

    group = _group()
    group.oom_advice = lambda method: f"lower the keys of {method}"
    msg = str(WorkerGroup._failure(group, 0, "update_actor", _TaskError(torch.OutOfMemoryError(CUDA_TEXT))))
    assert msg == ("actor_rollout rank 0 on 192.0.2.2 ran out of device memory in update_actor: CUDA out of memory. "
                   "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.20 GiB is free; "
                   "lower the keys of update_actor (log: 192.0.2.2:" + msg.split("(log: 192.0.2.2:")[1]), msg
    assert "PYTORCH_CUDA_ALLOC_CONF" not in msg and "\n" not in msg
    npu = str(WorkerGroup._failure(group, 0, "generate_sequences", _TaskError(RuntimeError(NPU_TEXT))))
    assert ("ran out of device memory in generate_sequences: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; "
            "60.97 GiB total capacity; 58.10 GiB already allocated; 58.10 GiB current active; 1.10 GiB free; "
            "59.00 GiB reserved in total by PyTorch); lower the keys of generate_sequences (log: ") in npu, npu
    assert "max_split_size_mb" not in npu  # the allocator's tuning hint is left out


def test_device_oom_in_init_names_it_too():
    """A rank that dies in __init__ (model load) with a device OOM: a RayActorError whose text holds
    the traceback; the same sentence, not 'died during __init__'."""
    from ray.exceptions import RayActorError

    group = _group()
    group.oom_advice = lambda method: "the model does not fit"
    err = RayActorError(error_msg="The actor died because of an error raised in its creation task, "
                                  "ray::ActorRolloutWorker.__init__() ...\n  File \"x.py\", line 1\n"
                                  f"torch.OutOfMemoryError: {CUDA_TEXT}\n")
    msg = str(WorkerGroup._failure(group, 0, "__init__", err))
    assert msg.startswith("actor_rollout rank 0 on 192.0.2.2 ran out of device memory in __init__: CUDA out of "
                          "memory. Tried to allocate 2.00 GiB."), msg
    assert "; the model does not fit (log: " in msg


def test_other_errors_are_not_taken_for_device_oom():
    from mindspeed_rl.distributed.worker_group import device_oom

    assert device_oom(KeyError("no such sample")) is None
    assert device_oom(RuntimeError("CUDA error: device-side assert triggered")) is None
    assert device_oom(RuntimeError("CUDA error: out of memory")) == "CUDA error: out of memory"
