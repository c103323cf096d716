"""distributed.worker_env helpers that need no Ray worker."""


def test_local_world_is_made_once(gloo_world1):
    """Scripts call init_local_world for megatron's process group; a process that has one keeps it."""
    import torch

    from mindspeed_rl.distributed.worker_env import init_local_world

    assert torch.distributed.is_initialized()
    assert init_local_world("gloo") is False and torch.distributed.get_world_size() == 1


DESTROY_WORLD = r"""
import torch
from mindspeed_rl.platform import get_platform
get_platform("cpu").patch()
from mindspeed_rl.distributed.worker_env import destroy_world, init_local_world
from mindspeed_rl.models.builder import init_parallel_state
from megatron.core import parallel_state
destroy_world()  # no world yet: nothing to do
assert init_local_world("gloo")
init_parallel_state(1, 1)
torch.distributed.all_reduce(torch.ones(3), group=parallel_state.get_tensor_model_parallel_group())
groups = len(torch.distributed.distributed_c10d._world.pg_map)
destroy_world()
assert not torch.distributed.is_initialized() and not parallel_state.model_parallel_is_initialized()
assert not torch.distributed.distributed_c10d._world.pg_map
print("groups", groups)
assert init_local_world("gloo")  # a new world after it
destroy_world()
"""


def test_destroy_world_shuts_down_every_group():
    """A script's end: megatron's state and every process group gone (left alive, their gloo
    threads can abort the process at exit), and a world can be made again."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", DESTROY_WORLD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split("groups")[1]) > 5  # megatron's groups were there to shut down


def test_rendezvous_ports_stay_out_of_the_ephemeral_range(monkeypatch):
    """free_port picks rendezvous ports between Ray's worker ports and the kernel's ephemeral range (where a
    port the kernel picked can be handed to another process before the group binds it: EADDRINUSE in CI),
    each one bindable when picked; with no room there it falls back to the kernel's choice."""
    import socket

    from mindspeed_rl.distributed import worker_env

    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="utf-8") as f:
        ephemeral = int(f.read().split()[0])
    low, high = worker_env.RENDEZVOUS_PORTS[0], min(worker_env.RENDEZVOUS_PORTS[1], ephemeral)
    ports = {worker_env.free_port("127.0.0.1") for _ in range(20)}
    if high - low >= 1000:  # this host leaves room below its ephemeral range (Linux's default starts at 32768)
        assert all(low <= p < high for p in ports)
    assert len(ports) > 1  # random, not one fixed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))  # free when picked (nothing holds it since)
    monkeypatch.setattr(worker_env, "RENDEZVOUS_PORTS", (40000, 40000))  # no room: the kernel picks
    assert worker_env.free_port("127.0.0.1") >= 1024
