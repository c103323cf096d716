"""Connecting the driver to Ray, and what the live cluster offers.

    info = connect(plan, platform)           # join `ray start` cluster / RAY_ADDRESS, else start one
    check_cluster(plan, info.nodes, info.resource)  # (create_pools does this again, live)

Joining: an explicit `address`, else RAY_ADDRESS, else the cluster a `ray start --head` on this
machine recorded (Ray's address file). The address is probed over TCP first, so a wrong or dead
address fails within `timeout_s` with a sentence naming it instead of Ray's own retry loop.
"local" (as address or RAY_ADDRESS) always starts a fresh local instance.

Where it departs from verl / NeMo-RL: they call `ray.init()` and let Ray decide. We never attach
to a stray `ray.init()` instance of another process on the machine (Ray's "auto" also pgreps for
any running GCS; we only follow the address file of `ray start`), and a local instance on CPU is
started with exactly the logical "NPU" units the plan needs, so the same plan, placement groups
and worker groups run unchanged on a laptop.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass

import ray

from mindspeed_rl.distributed.plan import RolePlacement, placement_groups
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)
LOCAL_START_ATTEMPTS = 3  # tries to start a local Ray instance before giving up (Ray waits 30 s each)
# How long a local instance's GCS may take to publish its port and then to answer (Ray's defaults: 30 s and
# 20 tries a second apart). On a busy machine (load 9 on 2 cores, two test streams starting Ray at once)
# the 20 s ran out three times in a row; 120 is what Ray itself allows a RocksDB-backed GCS. A value
# already in the environment is kept.
GCS_WAIT_ENV, GCS_WAIT_S = "RAY_gcs_server_port_wait_time_s", "120"
# The niceness Ray starts a worker process at (Ray's default: 15). Our CPU workers renice to 0 once they run
# (platform/cpu.configure_host_threads), but a worker's start-up before that (imports, model build and load) ran at
# nice 15 and crawled whenever anything else kept the cores busy: a ray_gpt run from a Granite 4.0-H checkpoint
# spent 117 s starting its workers beside one 2-thread matmul loop on 2 cores, 7 s at 0. An instance we
# start gets 0; a value already in the environment is kept; a `ray start` cluster takes it from the environment of
# its `ray start` (README, Multi-node).
NICENESS_ENV, WORKER_NICENESS = "RAY_worker_niceness", "0"


class ClusterError(RuntimeError):
    """The Ray cluster could not be reached, or cannot host the plan; str(err) is one line."""


@dataclass
class ClusterInfo:
    address: str  # "local" when this process started the instance, else the address joined
    started_local: bool
    resource: str  # the device resource counted in `nodes` ("NPU" or "GPU")
    nodes: dict[str, float]  # node name (ip) -> free units of `resource`, for plan.check_cluster
    cpus: dict[str, float]  # node name (ip) -> free CPU units


def devices_needed(plan: list[RolePlacement]) -> int:
    """Devices all placement groups of the plan take together (colocated roles take none)."""
    return sum(n for _, n in placement_groups(plan))


def connect(plan: list[RolePlacement], platform, *, address: str | None = None,
            timeout_s: float = 30.0, dashboard: bool = False) -> ClusterInfo:
    """Attach this driver to a Ray cluster (or start a local one) and describe its free devices.

    Args:
        plan: the placement plan; on CPU a local instance gets devices_needed(plan) logical NPUs.
        platform: a mindspeed_rl.platform.Platform (uses .name and .ray_resource).
        address: "host:port" of a running cluster, "local" to start one; None = RAY_ADDRESS,
            else the `ray start` cluster of this machine, else local.
        timeout_s: how long the address may take to answer.
        dashboard: start Ray's dashboard with a local instance (training.ray_dashboard); a cluster
            that is joined keeps what its `ray start` set.
    Returns:
        ClusterInfo with per-node free units of platform.ray_resource.
    Raises:
        ClusterError: the address did not answer within timeout_s, or is malformed.
    """
    resource = platform.ray_resource
    if ray.is_initialized():  # the caller (or a test) already connected: describe what is there
        return _describe("connected", False, resource)
    address = address if address is not None else os.environ.get("RAY_ADDRESS") or _recorded_address()
    if address == "auto":
        address = _recorded_address()
        if not address:
            raise ClusterError("Ray address 'auto' but no `ray start` cluster is recorded on this machine; run "
                               "`ray start --head`, give its HEAD_IP:PORT, or use RAY_ADDRESS=local.")
    if address and address != "local":
        _probe(address, timeout_s)
        log.info("joining the Ray cluster at %s", address)
        ray.init(address=address, logging_level=logging.WARNING)
        return _describe(address, False, resource)
    if address == "local":
        os.environ.pop("RAY_ADDRESS", None)  # ray.init reads it too; "local" must mean local
    need = devices_needed(plan)
    # The dashboard of an instance we start is off unless asked for (its server and agent cost up to ~5 s
    # of start-up on a busy host and two processes on the CPUs the workers use) and then listens on loopback only (it can
    # run jobs: no open port by default); a `ray start --head` cluster binds it where its
    # --dashboard-host says (Ray's default is loopback too), e.g. `--dashboard-host 0.0.0.0`.
    kwargs: dict = dict(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=dashboard,
                        dashboard_host="127.0.0.1", logging_level=logging.WARNING)
    if platform.name == "cpu":
        # Logical NPUs: pure bookkeeping so placement groups look as they do on a real node. One
        # logical CPU per logical NPU at least, so every {NPU: 1, CPU: 1} bundle fits.
        kwargs["resources"] = {resource: need}
    log.info("starting a local Ray instance (%s)", ", ".join(f"{k}={v}" for k, v in kwargs.items()))
    os.environ.setdefault(GCS_WAIT_ENV, GCS_WAIT_S)
    os.environ.setdefault(NICENESS_ENV, WORKER_NICENESS)
    with _quiet_npu_probe(platform.name == "cpu"):
        for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
            try:
                ray.init(address="local", **kwargs)
                break
            except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception when its daemons start too slowly
                # Ray waits a fixed 30 s for its raylet; on a busy machine a second start usually makes it
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
                first_line = str(err).strip().splitlines()[0]
                ray.shutdown()  # the half-started daemons of this attempt
                if attempt < LOCAL_START_ATTEMPTS:
                    log.warning("starting a local Ray instance failed (%s, load average %.1f); trying again (%d/%d)",
                                first_line, load, attempt + 1, LOCAL_START_ATTEMPTS)
                    continue
                raise ClusterError(f"starting a local Ray instance failed {LOCAL_START_ATTEMPTS} times: {first_line} "
                                   f"(load average {load:.1f} on {os.cpu_count()} cores); retry when the machine is "
                                   f"less busy, or start Ray first with `ray start --head` and set RAY_ADDRESS.") from None
    return _describe("local", True, resource)


def describe_nodes(resource: str) -> tuple[dict[str, float], dict[str, float]]:
    """Free units of `resource` and of CPU per alive node, read from the live cluster.

    Returns:
        (devices, cpus): node name (see node_names) -> free units.
    """
    free = available_per_node()
    names = node_names()
    devices, cpus = {}, {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        node_id = node["NodeID"]
        name = names.get(node_id, node["NodeManagerAddress"])  # joined between the two reads
        avail = free.get(node_id, node.get("Resources", {}))
        devices[name] = float(avail.get(resource, 0.0))
        cpus[name] = float(avail.get("CPU", 0.0))
    return devices, cpus


def node_names() -> dict[str, str]:
    """Node id -> the name messages use for it: its ip, or "ip#<node id prefix>" for every alive
    node that shares its ip with another (containers, or a ray.cluster_utils test cluster)."""
    alive = [(n["NodeID"], n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive")]
    ips = [ip for _, ip in alive]
    return {node_id: ip if ips.count(ip) == 1 else f"{ip}#{node_id[:6]}" for node_id, ip in alive}


def node_ips() -> dict[str, str]:
    """Node id -> ip of every node Ray knows (alive or not)."""
    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}


def logs_dir() -> str:
    """Ray's log folder of this session (the same path on every node of a `ray start` cluster)."""
    try:
        return ray._private.worker._global_node.get_logs_dir_path()  # private; fall back below
    except AttributeError:
        return "/tmp/ray/session_latest/logs"


# ---------------------------------------------------------------------------------------------


def _describe(address: str, started: bool, resource: str) -> ClusterInfo:
    devices, cpus = describe_nodes(resource)
    return ClusterInfo(address, started, resource, devices, cpus)


def available_per_node() -> dict[str, dict[str, float]]:
    """Node id -> available resources. Ray exposes this only privately; without it the totals
    are used (then a busy cluster is caught by the placement-group timeout instead)."""
    try:
        from ray._private.state import available_resources_per_node
        return available_resources_per_node()
    except (ImportError, AttributeError):
        return {}


def _recorded_address() -> str | None:
    """The address a `ray start --head` on this machine wrote to Ray's address file, if any."""
    try:
        from ray._private.services import find_bootstrap_address
        # Not ray.init(address="auto"): that also attaches to any GCS process found by pgrep.
        return find_bootstrap_address(None) or None
    except (ImportError, AttributeError, OSError):
        return None


def _probe(address: str, timeout_s: float) -> None:
    """TCP-connect to the GCS at `address` so a dead address fails in timeout_s, by name."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"Ray address {address!r} is not host:port; set RAY_ADDRESS=HEAD_IP:PORT "
                           f"(the port of `ray start --head --port PORT`), or RAY_ADDRESS=local.")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise ClusterError(f"no Ray cluster answered at {address} within {timeout_s:g} s ({err}); start it "
                           f"with `ray start --head --port {port}` or set RAY_ADDRESS to the head's "
                           f"address (RAY_ADDRESS=local starts a local instance).") from None


@contextlib.contextmanager
def _quiet_npu_probe(quiet: bool):
    """On CPU, Ray's NPU accelerator manager logs a traceback because `acl` (CANN) is missing
    when it sees logical "NPU" resources; that is expected here, so silence that logger."""
    logger = logging.getLogger("ray._private.accelerators.npu")
    old = logger.level
    if quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)
