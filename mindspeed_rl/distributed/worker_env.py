"""Inside a worker: read the env its WorkerGroup gave it, pick the device, join torch.distributed.

    class ActorWorker:                     # a plain class; WorkerGroup makes it a Ray actor
        def __init__(self, cfg):
            plat = get_platform(cfg.run.platform); plat.patch(...)
            self.env = init_distributed(plat, timeout=timedelta(minutes=10))
            ...                            # megatron parallel_state.initialize_model_parallel(...)
        def rank_info(self):
            return rank_info()             # the driver builds its DPLayout from these

Functions, not a base class ("say no to implementation inheritance"): a role worker calls them.

Device choice. The group sets LOCAL_RANK the torchrun way (rank among this role's ranks on the
node), but the device comes from what Ray assigned the actor (`get_accelerator_ids()`), because two
roles on one node, or a colocated pair on one bundle, would otherwise disagree about which physical
device is theirs. Ray sets the visible-devices variable to the assigned id unless the platform's
RAY_EXPERIMENTAL_NOSET_* variable is set (platform.ray_worker_env(True)); device_index() maps the
assigned id through whatever the variable holds, so both modes give the right index.
"""
from __future__ import annotations

import datetime
import os
import random
import socket
import sys
from dataclasses import dataclass

ROLE_ENV = "MINDSPEED_RL_ROLE"
HOST_CPUS_ENV = "MINDSPEED_RL_HOST_CPUS"  # CPU units of this worker's device bundle (WorkerGroup sets it)


RENDEZVOUS_PORTS = (20000, 32768)  # above Ray's worker ports (10002-19999), below the usual ephemeral range


def free_port(host: str = "") -> int:
    """A TCP port free on `host` now, for a process group's rendezvous (MASTER_PORT), chosen at random
    between Ray's worker ports and the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range).

    The port is only free when chosen: the process group binds it later (seconds later for a Ray actor).
    A port the kernel picked (bind to 0) is an ephemeral one, which it hands to the next connection or
    bind(0) of any process on the host in the meantime: with two test stages side by side, a rank's
    rendezvous failed with EADDRINUSE (CI, 2026-11-28). Ports outside the ephemeral range are taken
    only by whoever names them; the kernel's choice is the fallback when none of 64 random tries binds
    (or the ranges leave no room)."""
    low, high = RENDEZVOUS_PORTS
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="utf-8") as f:
            high = min(high, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        pass
    pick = random.SystemRandom()
    for _ in range(64 if high - low >= 1000 else 0):
        port = pick.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class WorkerEnv:
    role: str
    rank: int
    world_size: int
    local_rank: int  # rank among this role's ranks on this node
    master_addr: str
    master_port: int
    device_index: int  # index of this worker's device among those visible to it


def read_env() -> WorkerEnv:
    """The rank/world/master a WorkerGroup put in this process's environment."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not set: this process was not started by a WorkerGroup "
                           f"(or torchrun); set them or spawn the worker with WorkerGroup.")
    return WorkerEnv(os.environ.get(ROLE_ENV, "worker"), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                     int(os.environ["LOCAL_RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                     int(os.environ["LOCAL_RANK"]))


def device_index(platform, local_rank: int) -> int:
    """Index (among the visible devices) of the device Ray assigned this actor.

    Falls back to local_rank outside Ray or when the actor holds no device resource.
    """
    try:
        import ray
        ids = ray.get_runtime_context().get_accelerator_ids().get(platform.ray_resource, [])
    except Exception:  # not in a Ray worker
        ids = []
    return pick_device(ids, platform.get_visible_devices(), local_rank, platform.visible_devices_env_var)


def pick_device(assigned: list, visible: list[int] | None, local_rank: int, env_var: str | None = None) -> int:
    """The device index from Ray's assigned ids and the visible-devices list (None = unset).

    Ray isolation mode: visible == [id] -> 0. NOSET mode: visible unset -> id, or the node's own
    restriction (e.g. 4,5,6,7 set before `ray start`, Ray assigns "5") -> its position, 1.
    """
    if not assigned:
        return local_rank
    device = int(assigned[0])
    if visible is None:
        return device
    if device not in visible:
        raise RuntimeError(f"Ray assigned device {device} but {env_var}={','.join(map(str, visible))} hides it")
    return visible.index(device)


def init_distributed(platform, timeout: datetime.timedelta = datetime.timedelta(minutes=10)) -> WorkerEnv:
    """Select this worker's device and join the role's default process group (env://).

    Args:
        platform: mindspeed_rl.platform.Platform of this process (patched already).
        timeout: init_process_group timeout; a rank that never arrives fails every rank after it.
    Returns:
        The WorkerEnv, with device_index resolved.
    """
    import torch.distributed as dist

    env = read_env()
    env.device_index = device_index(platform, env.local_rank)
    platform.set_device(env.device_index)
    if os.environ.get(HOST_CPUS_ENV):  # before any parallel op: the thread pool is sized once here
        platform.configure_host_threads(float(os.environ[HOST_CPUS_ENV]))
    if not dist.is_initialized():
        dist.init_process_group(platform.dist_backend, rank=env.rank, world_size=env.world_size, timeout=timeout)
    return env


def init_local_world(backend: str, timeout: datetime.timedelta = datetime.timedelta(seconds=120)) -> bool:
    """A one-process torch.distributed world on a free local port (megatron needs a process group
    even alone: scripts and benchmarks); nothing when the process has one already. Returns whether
    it made one (then the caller may destroy it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    port = free_port("127.0.0.1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=0, world_size=1, timeout=timeout)
    return True


def destroy_world() -> None:
    """Shut down megatron's parallel state and every process group of this process; nothing when it
    has none. A process that ends normally with gloo groups alive can abort at exit: their worker
    threads outlive the interpreter ("terminate called without an active exception", exit 134).
    Measured on torch 2.13 (a one-process world, 21 groups, all work waited for): 4 aborts in 91
    exits without this, none in 100 with it. Scripts and the test session call it before exiting;
    Ray kills the workers' processes, which never reach the interpreter's exit."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    builder = sys.modules.get("mindspeed_rl.models.builder")  # never imported here: on CPU the shim precedes megatron
    if builder is not None:
        builder.destroy_parallel_state()
    dist.destroy_process_group()  # the world and every group left


def rank_info() -> dict:
    """(rank, dp_rank, tp_rank, pp_rank, is_output_rank, node_ip, pid, threads, nice) of this worker.

    Megatron's parallel_state is read when it is initialised (never imported here: on CPU the
    shim must precede megatron); otherwise every rank is its own DP rank. is_output_rank: the rank
    whose outputs stand for its DP group (tp_rank 0 of the last pipeline stage).
    """
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    info = dict(rank=rank, dp_rank=rank, tp_rank=0, pp_rank=0, is_output_rank=True)
    mpu = sys.modules.get("megatron.core.parallel_state")
    if mpu is not None and mpu.model_parallel_is_initialized():
        info.update(dp_rank=mpu.get_data_parallel_rank(), tp_rank=mpu.get_tensor_model_parallel_rank(),
                    pp_rank=mpu.get_pipeline_model_parallel_rank(),
                    is_output_rank=mpu.get_tensor_model_parallel_rank() == 0
                    and mpu.is_pipeline_last_stage(ignore_virtual=True))  # the last chunk lives here
    import torch

    info.update(node_ip=node_ip(), pid=os.getpid(), threads=torch.get_num_threads(),
                nice=os.getpriority(os.PRIO_PROCESS, 0))
    return info


def node_ip() -> str:
    try:
        import ray
        return ray.util.get_node_ip_address()
    except Exception:
        return socket.gethostbyname(socket.gethostname())
