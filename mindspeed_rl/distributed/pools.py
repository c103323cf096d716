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

from mindspeed_rl.distributed.cluster import ClusterError, describe_nodes
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


def remove_pools(pools: dict[str, ResourcePool]) -> None:
    """Remove every placement group (the workers on them must be gone or are killed by Ray)."""
    done = set()
    for pool in pools.values():
        if id(pool) in done:
            continue
        done.add(id(pool))
        for pg in pool.groups:
            try:
                remove_placement_group(pg)
            except Exception as err:  # already removed or the cluster is gone: nothing to free
                log.debug("could not remove placement group %s: %s", pg.id, err)


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
