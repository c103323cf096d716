"""Before any role worker starts: does every node that hosts a role see what its workers will read?

    pools = create_pools(plan, resource)      # placement groups placed: now we know which node hosts what
    print(check_nodes(cfg, plan, pools))      # UserInputError / ClusterError, else where each role's ranks are

A tiny Ray task pinned to each such node (NodeAffinitySchedulingStrategy, soft=False; num_cpus=0
and no device resource, so it runs even when the role's bundles reserve every CPU and device of
the node) reports back:
- which paths that node's workers will open are missing there: the tokenizer (every role worker
  loads it), each role's `load:` checkpoint, the parent of the actor's `save:` directory (every
  actor node writes its part of a checkpoint into it, so it must be shared storage) and an
  explicit `training.resume:` checkpoint.
  Relative paths resolve against the directory `ray start` ran in on that node (Ray workers
  inherit the raylet's working directory), not the driver's; the message says so.
- the ip its workers see (what WorkerGroup hands every rank as MASTER_ADDR when rank 0 is there);
- a digest of the mindspeed_rl sources it imports: the workers receive the driver's Config object
  and run their own node's code, so a node with another checkout is a config mismatch waiting to happen.

Not checked on role nodes, on purpose: the experiment yaml and data_path / val_data_path are read
by the driver only (launch.run builds the prompt loaders; workers get the Config object), so
config/validate.py's check on the driver's node is the one that matters. Requiring them on every
node would reject a valid setup that keeps the data on node 0's disk.

Why after create_pools and not right after plan.check_cluster: only a placed STRICT_PACK group
says which node hosts a resource_pool entry; checking every node of the cluster would also reject
nodes the job never uses. No worker exists yet at that point.
"""
from __future__ import annotations

import hashlib
import ipaddress
import os
import time
from dataclasses import dataclass, field

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from mindspeed_rl.utils.errors import UserInputError

A = "actor_rollout_ref.actor_rollout"
ROLE_KEYS = {"actor_rollout": A, "ref": "actor_rollout_ref.ref", "reward": "reward"}


@dataclass(frozen=True)
class PathCheck:
    key: str  # config key, e.g. "actor_rollout_ref.actor_rollout.load"
    path: str  # as written in the config (may be relative)
    kind: str  # "dir": must be a directory, "exists": file or directory, "parent": its parent must be a directory


@dataclass
class NodeReport:
    """What the check task saw on one node."""

    ip: str  # ray.util.get_node_ip_address() there: the MASTER_ADDR of a rank 0 on that node
    cwd: str  # working directory of that node's Ray workers (relative paths resolve against it)
    missing: list[tuple[PathCheck, str]] = field(default_factory=list)  # (check, the absolute path tested there)
    package: str = ""  # where mindspeed_rl was imported from there
    digest: str = ""  # source_digest() there


# ---------------------------------------------------------------------------------------------
def check_nodes(cfg, plan, pools, *, timeout_s: float = 120.0) -> str:
    """Check every node hosting a role, before any role worker is spawned.

    Args:
        cfg: the validated Config.
        plan: make_plan(cfg).
        pools: create_pools(plan, ...): role -> ResourcePool with placed groups.
        timeout_s: how long the check tasks on all nodes together may take.
    Returns:
        One line per role saying which node hosts which ranks (for the log).
    Raises:
        UserInputError: a path is missing on a node, a node runs other mindspeed_rl code, or a
            role spanning nodes of different ips would get a loopback MASTER_ADDR; one sentence each.
        ClusterError: a node's check did not finish within timeout_s, or failed.
    """
    from mindspeed_rl.distributed.cluster import node_names

    rank_nodes = {p.role: [pools[p.role].node_ids(r.node)[r.local] for r in p.ranks] for p in plan}
    roles_on: dict[str, list[str]] = {}  # node id -> roles it hosts, in plan order
    for role, node_ids in rank_nodes.items():
        for node_id in dict.fromkeys(node_ids):
            roles_on.setdefault(node_id, []).append(role)
    known = node_names()
    name = {n: known.get(n, n[:8]) for n in roles_on}
    checks = {n: paths_to_check(cfg, roles) for n, roles in roles_on.items()}
    reports = run_on_nodes(checks, name, timeout_s)

    label = {n: f"{name[n]} ({', '.join(roles)})" for n, roles in roles_on.items()}
    problems = [missing_paths_problem({label[n]: r for n, r in reports.items()})]
    here, digest = package_dir(), source_digest()
    problems += [code_problem(label[n], r.package, here) for n, r in reports.items() if r.digest != digest]
    problems += [loopback_problem(role, [(name[n], reports[n].ip) for n in ids]) for role, ids in rank_nodes.items()]
    problems = [p for p in problems if p]
    if problems:
        raise UserInputError(" ".join(problems))
    return format_node_placement({role: [name[n] for n in ids] for role, ids in rank_nodes.items()})


def paths_to_check(cfg, roles: list[str]) -> list[PathCheck]:
    """The paths the workers of `roles` open on their node (deduplicated, in a stable order)."""
    role_cfg = {"actor_rollout": cfg.actor, "ref": cfg.ref, "reward": cfg.reward}
    out = []
    if cfg.run.tokenizer_name_or_path:
        out.append(PathCheck("training.tokenizer_name_or_path", cfg.run.tokenizer_name_or_path, "dir"))
    for role in roles:
        rc = role_cfg[role]
        if rc.load:
            out.append(PathCheck(f"{ROLE_KEYS[role]}.load", rc.load, "exists"))
        if role == "actor_rollout" and rc.save:
            out.append(PathCheck(f"{A}.save", rc.save, "parent"))
        resume = cfg.run.resume  # "auto" lives under save, covered by its parent check
        if role == "actor_rollout" and resume and resume != "auto":
            out.append(PathCheck("training.resume", resume, "exists"))
    return list(dict.fromkeys(out))


def run_on_nodes(checks: dict[str, list[PathCheck]], names: dict[str, str], timeout_s: float) -> dict[str, NodeReport]:
    """Run inspect_node on every node id of `checks` at once; one deadline for all of them."""
    from mindspeed_rl.distributed.cluster import ClusterError

    refs = {}
    for node_id, paths in checks.items():
        task = _inspect_node_task.options(num_cpus=0, max_retries=0,
                                          scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        refs[task.remote(paths)] = node_id
    deadline, reports = time.monotonic() + timeout_s, {}
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
        for ref in ready:
            node_id = refs.pop(ref)
            try:
                reports[node_id] = ray.get(ref)
            except Exception as err:  # the task could not run there: say which node and why
                cause = _first_line(err)
                fix = ("install this checkout of mindspeed_rl in the Python that `ray start` runs there"
                       if "No module named" in cause else "the node has left the cluster (`ray status`)"
                       if "Unschedulable" in cause else "its Ray logs (raylet.out, worker-*.err) say more")
                raise ClusterError(f"the path check on node {names[node_id]} (id {node_id[:8]}) failed: "
                                   f"{cause}; {fix}.") from None
        if refs and time.monotonic() >= deadline:
            late = ", ".join(f"{names[n]} (id {n[:8]})" for n in refs.values())
            raise ClusterError(f"the path check on node(s) {late} did not finish within {timeout_s:g} s; is the "
                               f"node alive and can it start a Ray worker (`ray status`, its raylet.out)?")
    return reports


# ---- pure: what a node report means ----------------------------------------------------------
def missing_paths_problem(reports: dict[str, NodeReport]) -> str | None:
    """One sentence naming every node (label -> its report) and the paths it lacks; None if none."""
    parts, relative = [], []
    for label, r in reports.items():
        if not r.missing:
            continue
        items = [("the parent directory of " if c.kind == "parent" else "") + f"`{c.key}: {c.path}`"
                 + (f" ({there} there)" if c.kind == "parent" or not os.path.isabs(c.path) else "")
                 for c, there in r.missing]
        parts.append(f"{label} lacks {_and(items)}")
        relative += [r.cwd for c, _ in r.missing if not os.path.isabs(c.path)]
    if not parts:
        return None
    why = (f"; relative paths resolve against the directory `ray start` ran in on each node "
           f"({', '.join(dict.fromkeys(relative))}), so prefer absolute ones") if relative else ""
    return (f"paths the role workers open are missing on the node that hosts them: {'; '.join(parts)}; put them on "
            f"storage every node mounts at the same path, or copy them there{why}.")


def loopback_problem(role: str, rank_nodes: list[tuple[str, str]]) -> str | None:
    """A sentence when `role`'s ranks span nodes of different ips and rank 0's ip is loopback.

    Args:
        rank_nodes: (node name, ip its workers see) of every rank, in rank order.
    Ranks get MASTER_ADDR = rank 0's node ip. All nodes of a single-host cluster (a
    ray.cluster_utils.Cluster, containers sharing the host network) have the SAME ip, and there
    loopback reaches rank 0 from every rank: only nodes with different ips make it fatal.
    """
    ips = {ip for _, ip in rank_nodes}
    name0, ip0 = rank_nodes[0]
    if len({name for name, _ in rank_nodes}) < 2 or len(ips) < 2 or not is_loopback(ip0):
        return None
    others = ", ".join(sorted(ips - {ip0}))
    return (f"{role} ranks span nodes with ips {ip0} and {others}, but rank 0's node {name0} registered with Ray "
            f"as {ip0}, a loopback MASTER_ADDR the other nodes cannot reach; restart Ray on that node with "
            f"`ray start ... --node-ip-address=<its cluster ip>`.")


def code_problem(label: str, package: str, here: str) -> str:
    return (f"node {label} imports a different mindspeed_rl ({package}) than the driver ({here}); install the "
            f"same checkout on every node, since workers run their node's code on the driver's config.")


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1 or the name localhost."""
    if ip.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip.strip()).is_loopback
    except ValueError:
        return False


def format_node_placement(rank_nodes: dict[str, list[str]]) -> str:
    """"role: ranks 0-1 on NODE, ranks 2-3 on NODE2" per role, from the node name of each rank."""
    lines = []
    for role, names in rank_nodes.items():
        runs: list[list] = []  # [node, first rank, last rank]
        for rank, name in enumerate(names):
            if runs and runs[-1][0] == name and runs[-1][2] == rank - 1:
                runs[-1][2] = rank
            else:
                runs.append([name, rank, rank])
        spans = ", ".join(f"rank{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''} on {n}" for n, a, b in runs)
        lines.append(f"nodes: {role}: {spans}")
    return "\n".join(lines)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _first_line(err: Exception) -> str:
    cause = getattr(err, "cause", None) or err
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"[:300]


# ---- runs on the node ------------------------------------------------------------------------
def inspect_node(paths: list[PathCheck]) -> NodeReport:
    """What this process's node sees: missing paths, its ip, where mindspeed_rl comes from."""
    missing = []
    for p in paths:
        there = os.path.abspath(p.path)
        if p.kind == "parent":
            there = os.path.dirname(there)
        if not (os.path.exists(there) if p.kind == "exists" else os.path.isdir(there)):
            missing.append((p, there))
    return NodeReport(ray.util.get_node_ip_address(), os.getcwd(), missing, package_dir(), source_digest())


_inspect_node_task = ray.remote(inspect_node)


def package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_digest() -> str:
    """sha256 over the relative path and bytes of every .py file of the imported mindspeed_rl."""
    root, h = package_dir(), hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(f for f in filenames if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()
