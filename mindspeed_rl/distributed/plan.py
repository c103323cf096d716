"""The placement plan: which role runs on which devices, with what TP/PP/DP (pure, no Ray).

`resource_pool` lists devices per node for each role: `actor_rollout: [8, 8]` asks for two
placement groups of 8 devices, each packed on one node (STRICT_PACK), so a role's node entry is
never split across machines. A role with an empty list shares the actor's devices (the reference)
or does not exist (the reward model). `check_cluster` matches the plan against the nodes a live
Ray cluster reports, before anything is spawned, so too few devices is one sentence, never a hang.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mindspeed_rl.config.schema import Config
from mindspeed_rl.config.validate import actor_split
from mindspeed_rl.utils.errors import UserInputError


@dataclass
class Rank:
    rank: int  # rank within the role's worker group
    node: int  # index of the resource_pool list entry (a placement group on one node)
    local: int  # device index within that entry
    job: str  # "train+generate", "train", "generate", "forward"


@dataclass
class RolePlacement:
    role: str
    devices_per_node: list[int]
    shares: str | None  # role whose devices this one reuses (colocated), else None
    tp: int
    pp: int
    dp: int
    ranks: list[Rank] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return len(self.ranks)


def make_plan(cfg: Config) -> list[RolePlacement]:
    pool = cfg.resource_pool
    train, infer = actor_split(cfg)
    actor = _placement("actor_rollout", pool.actor_rollout, None, cfg.actor)
    for r in actor.ranks:
        r.job = "train+generate" if not infer else ("train" if r.rank < train else "generate")
    actor.dp = train // (actor.tp * actor.pp)
    plan = [actor]
    ref_devices = pool.ref or _train_devices(pool.actor_rollout, train)
    plan.append(_placement("ref", ref_devices, None if pool.ref else "actor_rollout", cfg.ref))
    if pool.reward:
        plan.append(_placement("reward", pool.reward, None, cfg.reward))
    return plan


def _train_devices(per_node: list[int], train: int) -> list[int]:
    """The first `train` devices of the actor pool, per node (where a colocated role lives)."""
    out, left = [], train
    for n in per_node:
        if left <= 0:
            break
        out.append(min(n, left))
        left -= n
    return out


def _placement(role: str, per_node: list[int], shares: str | None, rc) -> RolePlacement:
    tp, pp = rc.parallel.tensor_model_parallel_size, rc.parallel.pipeline_model_parallel_size
    ranks, rank = [], 0
    for node, count in enumerate(per_node):
        for local in range(count):
            ranks.append(Rank(rank, node, local, "forward"))
            rank += 1
    return RolePlacement(role, list(per_node), shares, tp, pp, max(1, rank // (tp * pp)), ranks)


def format_plan(plan: list[RolePlacement], resource: str) -> str:
    lines = [f"{'role':<14}{'ranks':>6}  {'TP':>3}{'PP':>3}{'DP':>3}  devices ({resource} per node entry)"]
    for p in plan:
        where = f"shares {p.shares}'s devices " if p.shares else ""
        nodes = ", ".join(f"node{n}: {c}" for n, c in enumerate(p.devices_per_node))
        lines.append(f"{p.role:<14}{p.world_size:>6}  {p.tp:>3}{p.pp:>3}{p.dp:>3}  {where}[{nodes}]")
        jobs = {}
        for r in p.ranks:
            jobs.setdefault(r.job, []).append(r.rank)
        for job, ranks in jobs.items():
            # generation-only ranks run the actor's TP without a pipeline (workers/rollout.py)
            layout = f" (the actor's TP {p.tp}, PP 1, DP {len(ranks) // p.tp})" if job == "generate" else ""
            lines.append(f"{'':<14}  ranks {_span(ranks)}: {job}{layout}")
    return "\n".join(lines)


def host_cpus_per_device(plan: list[RolePlacement], devices: dict[str, float], cpus: dict[str, float]) -> int:
    """CPU platform: CPU units each device bundle reserves, which its workers use as torch/OpenMP
    threads (platform/cpu.py). A node's CPUs are split evenly over the devices the plan can place
    on it; the smallest share over the nodes (at least 1), so every entry still fits any node.
    Colocated roles on one bundle (actor + reference) each take all of it: they run in turn.

    Args:
        devices: node -> free logical devices; cpus: node -> free CPU units (cluster.ClusterInfo).
    """
    need = sum(n for _, n in placement_groups(plan))
    shares = [cpus.get(node, 0.0) // min(free, need) for node, free in devices.items() if free >= 1 and need]
    return max(1, int(min(shares))) if shares else 1


def format_threads(threads: int, where: str) -> str:
    """The plan's line about CPU workers' host threads."""
    return (f"CPU workers: {threads} torch/OpenMP thread(s) each ({where}), niceness 0 "
            f"(Ray's defaults would be OMP_NUM_THREADS=num_cpus and nice 15)")


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}" if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


def placement_groups(plan: list[RolePlacement]) -> list[tuple[str, int]]:
    """(role, devices) of every placement group the plan creates; colocated roles create none."""
    return [(p.role, n) for p in plan if p.shares is None for n in p.devices_per_node]


def check_cluster(plan: list[RolePlacement], nodes: dict[str, float], resource: str,
                  cpus: dict[str, float] | None = None, cpus_per_device: float = 1.0) -> None:
    """Raise UserInputError if the placement groups cannot be placed on the nodes' free resources.

    Every resource_pool list entry is one STRICT_PACK placement group, so it needs ONE node with
    that many free `resource` units (and cpus_per_device CPUs per device when `cpus` is given).
    Args:
        nodes: node name/ip -> available units of `resource` on that node.
        cpus: node name/ip -> available CPU units; None skips the CPU check.
        cpus_per_device: CPU units each device bundle reserves (pools.create_pools).
    Best-fit-decreasing packing: it can only miss a packing that exists when several entries of
    different sizes compete for nodes of very different sizes, and then the sentence still says
    what was asked and what each node has.
    """
    groups = placement_groups(plan)
    need = sum(n for _, n in groups)
    have = sum(nodes.values())
    asked = " + ".join(f"{role} {n}" for role, n in groups)
    offer = ", ".join(f"{name}: {int(v)}" for name, v in nodes.items()) or "no nodes"
    if need > have:
        raise UserInputError(f"resource_pool asks for {asked} = {need} {resource} but the Ray cluster has {int(have)} "
                             f"({offer}); shrink the lists in resource_pool or add nodes with "
                             f"`ray start --address=HEAD:PORT --resources='{{\"{resource}\": N}}'`.")
    cpu_of = (lambda name: cpus.get(name, 0.0)) if cpus is not None else (lambda name: float("inf"))
    free = {name: [float(v), cpu_of(name)] for name, v in nodes.items()}
    largest = max(nodes.values(), default=0.0)
    for label, n in sorted(_entries(plan), key=lambda e: -e[1]):
        cpu_need = n * cpus_per_device if cpus is not None else 0.0
        fits = [name for name, (d, c) in free.items() if d >= n and c >= cpu_need - 1e-9]
        if fits:  # best fit: the node left with the fewest free devices keeps big nodes for big entries
            best = min(fits, key=lambda name: free[name][0])
            free[best][0] -= n
            free[best][1] -= cpu_need
            continue
        if n > largest:
            split = [int(largest)] * int(n // largest) + ([int(n % largest)] if n % largest else [])
            raise UserInputError(f"resource_pool.{label} needs {n} {resource} on one node (each list entry is one "
                                 f"STRICT_PACK placement group) but the largest node has {int(largest)} free "
                                 f"({offer}); split it into per-node entries of at most {int(largest)}, e.g. {split}.")
        if cpus is None:
            raise UserInputError(f"resource_pool.{label} needs {n} {resource} on one node but none is left once the "
                                 f"larger entries are placed ({offer}, placing {asked}); make each entry fit one "
                                 f"node's free {resource} (e.g. one entry per node).")
        both = ", ".join(f"{name}: {int(nodes[name])} {resource} + {cpu_of(name):g} CPU" for name in nodes)
        if not any(nodes[name] >= n and cpu_of(name) >= cpu_need - 1e-9 for name in nodes):
            raise UserInputError(f"resource_pool.{label} needs {n} {resource} and {cpu_need:g} CPU on one node but "
                                 f"no node has both free ({both}); start Ray on the nodes with more --num-cpus.")
        raise UserInputError(f"resource_pool.{label} needs {n} {resource} and {cpu_need:g} CPU on one node but no "
                             f"node has both left once the larger entries are placed ({both}, placing {asked}); "
                             f"make each entry fit one node's free {resource} and CPUs (e.g. one entry per node).")


def _entries(plan: list[RolePlacement]) -> list[tuple[str, int]]:
    """("role[i]", devices) of every placement group, i = index in the role's resource_pool list."""
    return [(f"{p.role}[{i}]", n) for p in plan if p.shares is None for i, n in enumerate(p.devices_per_node)]
