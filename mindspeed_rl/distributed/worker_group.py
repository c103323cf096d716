"""Worker groups: N Ray actors of one role on a resource pool, called explicitly from the driver.

    group = WorkerGroup("actor", ActorWorker, pools["actor_rollout"], plan_of["actor_rollout"], args=(cfg,),
                        env_vars=platform.ray_worker_env(True))
    group.run_all("load_checkpoint", path)                    # every rank, list of results
    layout = DPLayout.from_rank_info(group.run_all("rank_info"))
    logp = group.run_sharded("compute_log_prob", batch, layout=layout)   # split by DP, gathered
    ref = ref_group.run_sharded_async("compute_ref_log_prob", batch, layout=ref_layout)
    scores = reward.score(batch); ref_logp = ref.result()     # overlap
    group.shutdown()

Each rank is an actor pinned to one bundle of the pool, with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT in its environment (MASTER_* = rank 0's node ip and a port found free ON
that node), so its __init__ can call worker_env.init_distributed(platform). A colocated role's
group uses the shared pool's bundles at the same indices (see pools.py for the fraction scheme).

Visible devices: Ray 2.x treats "NPU" like "GPU" (ray/_private/accelerators/npu.py): by default it
sets ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES of each worker to the device it assigned, so
the worker sees one device. Pass env_vars=platform.ray_worker_env(True) (RAY_EXPERIMENTAL_NOSET_*)
when workers must see every device of the node; worker_env.device_index() picks the right index
in both modes. On CPU the logical NPU ids are bookkeeping and the variable is never read.

Like NeMo-RL (run_all_workers_sharded_data), not verl: calls are explicit methods on the group,
no @register dispatch decorators. Unlike both, every wait has a timeout and every failure is a
WorkerGroupError whose one-line message names role, method, rank(s), node ip, the cause and the
worker's log file; a dead worker is reported as soon as its call returns, without waiting for
the ranks that may now hang in a collective. After a WorkerGroupError the group is in an
unknown state: shut it down.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import ray
import torch
from ray.exceptions import GetTimeoutError, OutOfMemoryError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from mindspeed_rl.distributed.cluster import logs_dir, node_ips
from mindspeed_rl.distributed.plan import RolePlacement
from mindspeed_rl.distributed.pools import ResourcePool
from mindspeed_rl.distributed.worker_env import HOST_CPUS_ENV, ROLE_ENV, free_port
from mindspeed_rl.utils.logging import get_logger, python_warnings_env

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class WorkerGroupError(RuntimeError):
    """A worker call failed, died or timed out; str(err) is one line naming role, method, rank(s)."""


@dataclass(frozen=True)
class DPLayout:
    """How a group's ranks map onto data-parallel shards."""

    dp_of_rank: list[int]  # (world,) DP index of each rank; ranks with one index get the same shard
    output_ranks: list[int]  # (dp,) the rank whose output stands for DP index d, in DP order

    @property
    def dp_size(self) -> int:
        return len(self.output_ranks)

    @staticmethod
    def pure(world_size: int) -> "DPLayout":
        """Every rank its own DP shard (no TP/PP)."""
        return DPLayout(list(range(world_size)), list(range(world_size)))

    @staticmethod
    def from_rank_info(infos: list[dict]) -> "DPLayout":
        """From worker_env.rank_info() of every rank, in rank order (dp_rank, is_output_rank)."""
        dp_of_rank = [int(i["dp_rank"]) for i in infos]
        out: dict[int, int] = {}
        for rank, info in enumerate(infos):
            if info.get("is_output_rank", True):
                out.setdefault(int(info["dp_rank"]), rank)
        dp = sorted(set(dp_of_rank))
        if dp != list(range(len(dp))) or sorted(out) != dp:
            raise ValueError(f"rank info gives DP indices {dp} and output ranks for {sorted(out)}; "
                             f"expected 0..D-1, each with one output rank")
        return DPLayout(dp_of_rank, [out[d] for d in dp])


@dataclass
class RankSlot:
    """Where one rank of a group lives."""

    rank: int
    entry: int  # resource_pool list entry (placement group) of the pool
    bundle: int  # bundle index in that placement group
    node_id: str
    node_ip: str
    local_rank: int  # rank among this group's ranks on the same node
    pid: int | None = None  # known once the actor is ready
    device_ids: tuple = ()  # Ray-assigned device ids (same for colocated ranks on one bundle)


class Pending:
    """The futures of one call on some ranks. result() waits up to timeout_s (counted from the
    result() call) and returns the combined value; errors are WorkerGroupError."""

    def __init__(self, group: "WorkerGroup", method: str, refs: dict[int, Any],
                 combine: Callable[[dict[int, Any]], Any], timeout_s: float):
        self.group, self.method, self.refs, self.combine, self.timeout_s = group, method, refs, combine, timeout_s

    def done(self) -> bool:
        ready, _ = ray.wait(list(self.refs.values()), num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def result(self, timeout_s: float | None = None) -> Any:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        return self.combine(self.group._wait(self.method, self.refs, timeout_s))


class WorkerGroup:
    def __init__(self, role: str, worker_cls, pool: ResourcePool, placement: RolePlacement, *,
                 args: tuple = (), kwargs: dict | None = None, env_vars: dict | None = None,
                 ready_timeout_s: float = 600.0, call_timeout_s: float = 3600.0,
                 oom_advice: Callable[[str], str] | None = None):
        """Spawn one actor per rank of `placement` on `pool` and wait until every __init__ returned.

        Args:
            role: name in messages and in the workers' MINDSPEED_RL_ROLE.
            worker_cls: a plain class (or a ray.remote actor class); built as worker_cls(*args, **kwargs).
            pool: the role's ResourcePool (the shared pool for a colocated role).
            placement: the role's RolePlacement; rank r goes to bundle (ranks[r].node, ranks[r].local).
            env_vars: extra environment for every worker, e.g. platform.ray_worker_env(True).
            ready_timeout_s: how long spawning plus every __init__ (model load, dist init) may take.
            call_timeout_s: default timeout of run_* calls.
            oom_advice: method name -> what to change when a rank runs out of device memory in it
                (trainer/oom_advice.py: the config keys, with their values); appended to the sentence.
        """
        self.role, self.pool, self.call_timeout_s, self.oom_advice = role, pool, call_timeout_s, oom_advice
        self.worker_name = getattr(worker_cls, "__name__", None) or worker_cls.__ray_metadata__.class_name
        self.world_size = placement.world_size
        ids = node_ips()
        node_of_entry = {e: pool.node_ids(e) for e in {r.node for r in placement.ranks}}
        self.slots: list[RankSlot] = []
        for r in placement.ranks:
            node_id = node_of_entry[r.node][r.local]
            local = sum(1 for s in self.slots if s.node_id == node_id)
            self.slots.append(RankSlot(r.rank, r.node, r.local, node_id, ids.get(node_id, "?"), local))
        master_addr, master_port = self._free_port_on_rank0(ready_timeout_s)
        actor_cls = worker_cls if isinstance(worker_cls, ray.actor.ActorClass) else ray.remote(worker_cls)
        self.actors = []
        try:
            for s in self.slots:
                env = {**(env_vars or {}), ROLE_ENV: role, HOST_CPUS_ENV: f"{pool.cpus_per_device:g}",
                       "RANK": str(s.rank), "WORLD_SIZE": str(self.world_size),
                       "LOCAL_RANK": str(s.local_rank), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                       # library warnings that say nothing to the user, filtered in the worker too
                       "PYTHONWARNINGS": python_warnings_env((env_vars or {}).get("PYTHONWARNINGS")
                                                             or os.environ.get("PYTHONWARNINGS"))}
                opts = dict(num_cpus=pool.cpus_per_device * pool.share, runtime_env={"env_vars": env},
                            scheduling_strategy=PlacementGroupSchedulingStrategy(pool.groups[s.entry], s.bundle))
                if pool.resource == "GPU":  # Ray's built-in GPU resource has its own option
                    opts["num_gpus"] = pool.share
                else:
                    opts["resources"] = {pool.resource: pool.share}
                self.actors.append(actor_cls.options(**opts).remote(*args, **(kwargs or {})))
            refs = {s.rank: a.__ray_call__.remote(_whoami, pool.resource) for s, a in zip(self.slots, self.actors)}
            for rank, (pid, device_ids) in self._wait("__init__", refs, ready_timeout_s).items():
                self.slots[rank].pid, self.slots[rank].device_ids = pid, tuple(device_ids)
        except BaseException:
            self.shutdown()
            raise

    # ---- calls -------------------------------------------------------------------------------
    def run_all(self, method: str, *args, timeout_s: float | None = None, **kwargs) -> list:
        """Call `method` on every rank; its results in rank order."""
        return self.run_all_async(method, *args, timeout_s=timeout_s, **kwargs).result()

    def run_all_async(self, method: str, *args, timeout_s: float | None = None, **kwargs) -> Pending:
        self._check_open(method)
        refs = {r: self._method(a, method).remote(*args, **kwargs) for r, a in enumerate(self.actors)}
        return Pending(self, method, refs, lambda v: [v[r] for r in range(self.world_size)], self._t(timeout_s))

    def run_rank0(self, method: str, *args, timeout_s: float | None = None, **kwargs) -> Any:
        """Call `method` on rank 0 only (nothing collective) and return its result."""
        return self.run_rank0_async(method, *args, timeout_s=timeout_s, **kwargs).result()

    def run_rank0_async(self, method: str, *args, timeout_s: float | None = None, **kwargs) -> Pending:
        self._check_open(method)
        refs = {0: self._method(self.actors[0], method).remote(*args, **kwargs)}
        return Pending(self, method, refs, lambda v: v[0], self._t(timeout_s))

    def run_sharded(self, method: str, batch, *args, layout: DPLayout | None = None,
                    timeout_s: float | None = None, combine: Callable[[list], Any] = None, **kwargs) -> Any:
        """Split `batch` over the DP shards, call method(shard, *args, **kwargs) on every rank and
        concatenate the output ranks' results in DP order (see split_batch / concat_batches).

        Args:
            batch: dict of tensors/lists with B rows each (or a TensorDict); B % dp == 0.
            layout: rank -> DP index and output rank per DP index; default: DPLayout.pure(world).
            combine: joins the output ranks' results (a list in DP order); default concat_batches.
        """
        return self.run_sharded_async(method, batch, *args, layout=layout, timeout_s=timeout_s, combine=combine,
                                      **kwargs).result()

    def run_sharded_async(self, method: str, batch, *args, layout: DPLayout | None = None,
                          timeout_s: float | None = None, combine: Callable[[list], Any] = None,
                          **kwargs) -> Pending:
        self._check_open(method)
        layout = layout or DPLayout.pure(self.world_size)
        if len(layout.dp_of_rank) != self.world_size:
            raise ValueError(f"{self.role}.{method}: the layout maps {len(layout.dp_of_rank)} ranks; "
                             f"the group has {self.world_size}")
        shards = [ray.put(s) for s in split_batch(batch, layout.dp_size)]  # one copy per DP shard, not per rank
        refs = {r: self._method(a, method).remote(shards[layout.dp_of_rank[r]], *args, **kwargs)
                for r, a in enumerate(self.actors)}
        join = combine or concat_batches
        return Pending(self, method, refs, lambda v: join([v[r] for r in layout.output_ranks]),
                       self._t(timeout_s))

    def shutdown(self) -> None:
        """Kill every actor of the group (the pool stays; remove it with remove_pools)."""
        for a in getattr(self, "actors", []):
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass
        self.actors = []

    # ---- waiting and errors ------------------------------------------------------------------
    def _t(self, timeout_s: float | None) -> float:
        return self.call_timeout_s if timeout_s is None else timeout_s

    def _check_open(self, method: str) -> None:
        if not self.actors:
            raise WorkerGroupError(f"{self.role}.{method} called after the group was shut down")

    def _method(self, actor, name: str):
        try:
            return getattr(actor, name)
        except AttributeError:
            raise WorkerGroupError(f"{self.role} workers ({self.worker_name}) have no method {name!r}") from None

    def _wait(self, method: str, refs: dict[int, Any], timeout_s: float) -> dict[int, Any]:
        """Results by rank; the first failure raises at once, the deadline names who is pending."""
        deadline, pending, out = time.monotonic() + timeout_s, {ref: r for r, ref in refs.items()}, {}
        while pending:
            left = deadline - time.monotonic()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, left))
            if not ready:
                raise WorkerGroupError(self._stall_message(method, timeout_s, sorted(pending.values())))
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    out[rank] = ray.get(ref)
                except (RayActorError, RayTaskError, GetTimeoutError, OutOfMemoryError) as err:
                    raise self._failure(rank, method, err) from err
        return out

    def _stall_message(self, method: str, timeout_s: float, ranks: list[int]) -> str:
        """Which pending rank stalled (stopped, dead, computing, waiting) and what the others wait for."""
        from mindspeed_rl.distributed.stall import describe_stall, probe_states

        where = {r: (self.slots[r].node_ip, self.slots[r].node_id, self.slots[r].pid) for r in ranks}
        try:
            states = probe_states(where)
        except Exception:  # noqa: BLE001 - the report must not fail; without states it names the ranks
            states = {}
        key = "training.worker_start_timeout_s" if method == "__init__" else "training.worker_timeout_s"
        return (describe_stall(self.role, method, timeout_s, self.world_size, ranks, where, states, key)
                + f" Their stacks: `ray stack` on those nodes; logs under {logs_dir()}.")

    def _failure(self, rank: int, method: str, err: Exception) -> WorkerGroupError:
        s = self.slots[rank]
        msg = _ANSI.sub("", str(err))
        pid = s.pid or _int(re.search(r"pid[:=]\s*(\d+)", msg))
        log = f"{s.node_ip}:{logs_dir()}/worker-*-{pid if pid else '*'}.err"
        if isinstance(err, OutOfMemoryError):  # not a RayActorError: Ray's memory monitor killed it
            return WorkerGroupError(f"{self.role} rank {rank} on {s.node_ip} was killed during {method} by "
                                    f"Ray's memory monitor: {_memory_report(msg)}")
        cause = getattr(err, "cause", None)
        oom = device_oom(cause if cause is not None else msg)
        if oom is not None:  # the device's allocator, not the host: what ran out, and what to change
            advice = self.oom_advice(method) if self.oom_advice else ""
            return WorkerGroupError(f"{self.role} rank {rank} on {s.node_ip} ran out of device memory in {method}: "
                                    f"{oom}{'; ' + advice if advice else ''} (log: {log})")
        if isinstance(err, RayActorError):
            return WorkerGroupError(f"{self.role} rank {rank} on {s.node_ip} died during {method}: "
                                    f"{_death_cause(err, msg)}; its log: {log}{_log_tail(pid)}")
        what = f"{type(cause).__name__}: {_first_line(str(cause))}" if cause is not None else _first_line(msg)
        # the worker's traceback, for whoever debugs it: Ray hands it back with the error, and prints it nowhere
        get_logger(__name__).error("%s rank %d raised in %s; its traceback:\n%s", self.role, rank, method, msg)
        return WorkerGroupError(f"{self.role} rank {rank} on {s.node_ip} raised in {method}: {what} "
                                f"(traceback above; log: {log})")

    def _free_port_on_rank0(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0's node ip and a port free there, found by a task on rank 0's bundle."""
        s = self.slots[0]
        task = _ip_and_free_port.options(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.pool.groups[s.entry], s.bundle))
        try:
            return ray.get(task.remote(), timeout=timeout_s)
        except GetTimeoutError:
            raise WorkerGroupError(f"{self.role}: finding a free port on rank 0's node {s.node_ip} took over "
                                   f"{timeout_s:g} s; is the node alive (`ray status`)?") from None


# ---- batches --------------------------------------------------------------------------------
def split_batch(batch, n: int) -> list:
    """Split a dict of tensors/lists (B rows each) or a TensorDict into n equal row blocks.

    Unequal shards are refused: DP ranks with different micro-batch counts hang Megatron.
    """
    rows = _rows(batch)
    if rows % n:
        raise ValueError(f"a batch of {rows} rows cannot be split evenly over {n} data-parallel shards; "
                         f"make the global batch (prompts x n_samples_per_prompt) a multiple of {n}")
    size = rows // n
    if isinstance(batch, dict):
        return [{k: v[i * size:(i + 1) * size] for k, v in batch.items()} for i in range(n)]
    return [batch[i * size:(i + 1) * size] for i in range(n)]


def concat_batches(parts: list) -> Any:
    """Concatenate per-shard outputs in order: dicts per key, tensors/TensorDicts with torch.cat,
    lists/tuples end to end; anything else (scalars, None) comes back as the list of parts."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: concat_batches([p[k] for p in parts]) for k in first}
    if isinstance(first, torch.Tensor) or hasattr(first, "batch_size"):
        return torch.cat(parts, dim=0)
    if isinstance(first, (list, tuple)):
        return type(first)(x for p in parts for x in p)
    return list(parts)


def _rows(batch) -> int:
    if not isinstance(batch, dict):
        return len(batch)
    lens = {k: len(v) for k, v in batch.items()}
    if not lens or len(set(lens.values())) != 1:
        raise ValueError(f"batch values must all have the same number of rows; got {lens}")
    return next(iter(lens.values()))


# ---- run inside workers ---------------------------------------------------------------------
def _whoami(self, resource: str) -> tuple[int, list]:
    """Runs on an actor via __ray_call__ once its __init__ is done: pid and assigned device ids."""
    return os.getpid(), list(ray.get_runtime_context().get_accelerator_ids().get(resource, []))


@ray.remote
def _ip_and_free_port() -> tuple[str, int]:
    return ray.util.get_node_ip_address(), free_port()


# ---- messages -------------------------------------------------------------------------------
def _death_cause(err: Exception, msg: str) -> str:
    if getattr(err, "_actor_init_failed", False) or "creation task" in msg:
        lines = [ln.strip() for ln in msg.splitlines() if ln.strip() and set(ln.strip()) - set("^~ ")]
        return f"its __init__ raised {lines[-1][:300]}"
    detail = re.search(r"Worker exit detail: (.*?\.)(?:\s|$)", msg)
    return detail.group(1) if detail else _first_line(msg)


def _memory_report(msg: str) -> str:
    """One sentence from Ray's OutOfMemoryError text: how full the node was, and what to change."""
    used = re.search(r"was ([\d.]+\s*GB) used / ([\d.]+\s*GB) limit", msg)
    level = f"the node's memory reached {used.group(1)} of {used.group(2)}" if used else "the node ran low on memory"
    return (f"{level} (Ray kills a worker above 95 %, `RAY_memory_usage_threshold`). Lower the memory per "
            f"worker (smaller micro_batch_size, max_new_tokens or n_samples_per_prompt) "
            f"or stop what else runs on that node; `ray logs raylet.out` lists the largest processes.")


def _log_tail(pid: int | None, lines: int = 8) -> str:
    """The last lines of a dead worker's stderr/stdout log when it is readable from the driver
    (same node or a shared log dir); "" otherwise, the message then names the file only."""
    if not pid:
        return ""
    import glob

    out = []
    for path in sorted(glob.glob(os.path.join(logs_dir(), f"worker-*-{pid}.err")) +
                       glob.glob(os.path.join(logs_dir(), f"worker-*-{pid}.out"))):
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                text = [ln for ln in f.read().decode("utf-8", "replace").splitlines()
                        if ln.strip() and not ln.startswith((":actor_name", ":task_name", ":job_id"))]
        except OSError:
            continue
        out += [f"    [{path.rsplit('.', 1)[-1]}] {ln[:300]}" for ln in text[-lines:]]
    return ("\n  last lines of its log:\n" + "\n".join(out)) if out else ""


_DEVICE_OOM = re.compile(r"\b(?:CUDA|NPU|XPU|HIP)\b[^.\n]{0,40}out of memory", re.IGNORECASE)
_OOM_DETAIL_END = re.compile(r"\s+(?:Including non-PyTorch|Of the allocated|If reserved|See documentation)")


def device_oom(err: BaseException | str | None) -> str | None:
    """The allocator's own sentences when `err` is a device out-of-memory error (torch's
    OutOfMemoryError on CUDA, torch_npu's RuntimeError "NPU out of memory. ..."), else None:
    what it tried to allocate and what the device had, without the tuning hints that follow."""
    if err is None:
        return None
    text = _ANSI.sub("", str(err))
    found = _DEVICE_OOM.search(text)
    if found is None:
        return None
    line = text[found.start():].splitlines()[0]  # the allocator's message is one line
    return _OOM_DETAIL_END.split(line, maxsplit=1)[0][:300].rstrip(" ;,.")


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[0] if lines else "no message")[:300]


def _int(match) -> int | None:
    return int(match.group(1)) if match else None


