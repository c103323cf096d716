"""Resource pools: the placement groups a plan asks for, checked against the live cluster first.

    pools = create_pools(plan, "NPU")        # role -> ResourcePool; colocated roles share one
    pg, index = pools["ref"].bundle(node=0, local=3)
    remove_pools(pools)

Every `resource_pool` list entry of a role is one placement group of that many bundles
{NPU: 1, CPU: k}, STRICT_PACK (one node). A role with `shares` set gets the SAME ResourcePool
object as the role it shares, and its workers are placed on the same bundle indices.

Colocation scheme (as verl's max_colocate_count): every worker on a pool asks for 1/c of a bundle
(device and CPU), c = number of roles on the pool. Ray hands fractional requests inside one bundle
the same accelerator id, so the actor and reference rank i see the same physical NPU/GPU (on CPU
the logical NPU is bookkeeping). The fraction is scheduling only: memory is not divided, so a
colocated role must offload what the other needs (the workers' job, not Ray's).

Where it departs from verl: the plan is validated against per-node free devices before any
placement group exists (plan.check_cluster's sentence, never a pending group), and readiness is
waited for with a timeout naming the role and bundle shape; groups of a failed attempt are removed.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from mindspeed_rl.distributed.cluster import ClusterError, available_per_node, describe_nodes
from mindspeed_rl.distributed.plan import RolePlacement, check_cluster
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)


@dataclass
class ResourcePool:
    role: str  # the role whose resource_pool entry created it
    groups: list[PlacementGroup]  # one per resource_pool list entry, each on one node
    devices_per_node: list[int]
    resource: str  # "NPU" or "GPU"
    cpus_per_device: float
    roles: list[str] = field(default_factory=list)  # roles placed on it, owner first

    @property
    def share(self) -> float:
        """Fraction of a bundle each worker of a role on this pool asks for."""
        return 1.0 / max(1, len(self.roles))

    @property
    def bundle_shape(self) -> dict[str, float]:
        return {self.resource: 1, "CPU": self.cpus_per_device}

    def bundle(self, node: int, local: int) -> tuple[PlacementGroup, int]:
        """(placement group, bundle index) of device `local` of list entry `node`."""
        if not (0 <= node < len(self.groups) and 0 <= local < self.devices_per_node[node]):
            raise IndexError(f"pool of {self.role} has entries {self.devices_per_node}; "
                             f"no device {local} in entry {node}")
        return self.groups[node], local

    def node_ids(self, node: int) -> list[str]:
        """Ray node id of every bundle of list entry `node` (all equal: STRICT_PACK)."""
        table = ray.util.placement_group_table(self.groups[node])
        mapping = table.get("bundles_to_node_id", {})
        return [mapping[i] for i in range(self.devices_per_node[node])]


def create_pools(plan: list[RolePlacement], resource: str, *, cpus_per_device: float = 1.0,
                 timeout_s: float = 120.0) -> dict[str, ResourcePool]:
    """Create every placement group of the plan and wait until all are placed.

    Args:
        plan: make_plan(cfg).
        resource: device resource of the platform ("NPU" on NPU and CPU, "GPU" on CUDA).
        cpus_per_device: CPU units reserved with each device bundle.
        timeout_s: how long all placement groups together may take to be placed.
    Returns:
        role -> ResourcePool for every role of the plan (colocated roles map to the shared pool).
    Raises:
        UserInputError: no node has the free devices + CPUs of an entry (plan.check_cluster).
        ClusterError: a placement group was not placed within timeout_s (others hold devices).
    """
    devices, cpus = describe_nodes(resource)
    check_cluster(plan, devices, resource, cpus, cpus_per_device)  # each entry must fit one node
    pools: dict[str, ResourcePool] = {}
    waits: dict = {}  # ready ref -> (role, entry index)
    try:
        for p in plan:
            if p.shares is not None:
                continue
            pool = ResourcePool(p.role, [], list(p.devices_per_node), resource, cpus_per_device, [p.role])
            for i, n in enumerate(p.devices_per_node):
                pg = placement_group([dict(pool.bundle_shape) for _ in range(n)], strategy="STRICT_PACK",
                                     name=f"mindspeed_rl:{p.role}:{i}:{secrets.token_hex(3)}")  # unique per namespace
                pool.groups.append(pg)
                waits[pg.ready()] = (p.role, i)
            pools[p.role] = pool
        _wait_placed(waits, pools, timeout_s)
    except BaseException:
        remove_pools(pools)
        raise
    for p in plan:
        if p.shares is not None:
            if p.shares not in pools:
                raise ValueError(f"plan: {p.role} shares {p.shares!r}, which has no pool")
            pools[p.shares].roles.append(p.role)
            pools[p.role] = pools[p.shares]
    return pools


def remove_pools(pools: dict[str, ResourcePool], timeout_s: float = 30.0) -> None:
    """Remove every placement group (the workers on them must be gone or are killed by Ray) and wait
    until their nodes have the devices back.

    Ray removes a group at once but hands its bundles back to the node asynchronously (tens of ms
    idle, seconds on a loaded machine): without the wait, pools created right after this call (a
    second run in the same driver, the next test) can be refused by check_cluster for devices that
    are on their way back. A wait longer than timeout_s is logged, naming the nodes, not raised:
    this runs on the way out, often while another error is being reported.
    """
    done, returning = set(), {}  # node id -> devices on their way back
    try:
        free_before = available_per_node()
    except Exception:  # the cluster is gone: nothing to wait for
        free_before = {}
    for pool in pools.values():
        if id(pool) in done:
            continue
        done.add(id(pool))
        for pg in pool.groups:
            try:
                nodes = ray.util.placement_group_table(pg).get("bundles_to_node_id", {})
                remove_placement_group(pg)
            except Exception as err:  # already removed or the cluster is gone: nothing to free
                log.debug("could not remove placement group %s: %s", pg.id, err)
                continue
            for node in nodes.values():
                returning[node] = returning.get(node, 0) + 1
    if not returning:
        return
    resource = next(iter(pools.values())).resource
    expected = {node: float(free_before[node].get(resource, 0.0)) + n
                for node, n in returning.items() if node in free_before}
    _wait_returned(resource, expected, timeout_s)


def _wait_returned(resource: str, expected: dict[str, float], timeout_s: float) -> None:
    """Wait until every node has at least `expected` free units of `resource` (or is gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            free = available_per_node()
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        except Exception as err:  # the cluster went away meanwhile: nothing holds the devices
            log.debug("cluster state unreadable while removing placement groups: %s", err)
            return
        short = {node: want for node, want in expected.items()
                 if node in alive and float(free.get(node, {}).get(resource, 0.0)) < want}
        if not short:
            return
        if time.monotonic() >= deadline:
            log.warning("the removed placement groups' %s devices were not back on node(s) %s within %.0f s "
                        "(another job may have taken them); a run started now may find too few free devices.",
                        resource, ", ".join(n[:12] for n in short), timeout_s)
            return
        time.sleep(0.05)


def _wait_placed(waits: dict, pools: dict[str, ResourcePool], timeout_s: float) -> None:
    """Wait for every placement group; on timeout name the first role/entry still pending."""
    deadline = time.monotonic() + timeout_s
    pending = dict(waits)
    while pending:
        left = deadline - time.monotonic()
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=max(0.0, left))
        for ref in ready:
            ray.get(ref)
            pending.pop(ref)
        if pending and time.monotonic() >= deadline:
            role, i = next(iter(pending.values()))
            pool = pools[role]
            shape = ", ".join(f"{k}: {v:g}" for k, v in pool.bundle_shape.items())
            devices, _ = describe_nodes(pool.resource)
            free = ", ".join(f"{k}: {v:g}" for k, v in devices.items())
            raise ClusterError(f"placement group {i} of {role} ({pool.devices_per_node[i]} bundles of "
                               f"{{{shape}}}, STRICT_PACK on one node) was not placed within {timeout_s:g} s "
                               f"({len(pending)} group(s) pending; free {pool.resource} per node now: {free}); "
                               f"another job may hold the devices (`ray status`).")
