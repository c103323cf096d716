"""Why a call to a worker group did not finish in time: which rank stalled and what the others wait for.

When a call passes its deadline (worker_group.WorkerGroup._wait), every pending rank's process is
looked at where it runs: its state in /proc/<pid>/stat (R running, S/D waiting, T stopped, Z dead)
and its kernel wait channel. On the driver's own node that is a file read; on another node a tiny
task pinned to that node reads it (with its own short deadline, so a dead node cannot hang the
report). The sentence then says, e.g.

    actor_rollout.update_actor timed out after 20 s (training.worker_timeout_s; ...): rank 1 of 2
    (pid 4242 on 10.0.0.2) is stopped (state T: SIGSTOP or a debugger), so it never finished
    update_actor; rank 0 is waiting (state S, in futex_wait), most likely for rank 1 in a collective.

A rank that is still computing (state R) is named as such: then the timeout is simply too short.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Optional

STATE_WORDS = {
    "R": "still running (computing)",
    "S": "waiting",
    "D": "waiting on I/O",
    "T": "stopped (state T: SIGSTOP or a debugger)",
    "t": "stopped by a debugger (state t)",
    "Z": "dead (a zombie process)",
    "X": "dead",
}


@dataclass(frozen=True)
class ProcState:
    state: str  # one letter of /proc/<pid>/stat, "?" when the process could not be read
    wchan: str = ""  # the kernel function it sleeps in, when the kernel says

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")


def read_proc_state(pid: int) -> ProcState:
    """The state of a process on this machine ("?" when it does not exist or cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ProcState("?")
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        wchan = ""
    return ProcState(state, "" if wchan == "0" else wchan)


def _local_ips() -> set[str]:
    ips = {"127.0.0.1"}
    try:
        import ray
        ips.add(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - no Ray here: the loopback and the hostname's address suffice
        pass
    try:
        ips.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    return ips


def probe_states(where: dict[int, tuple[str, str, Optional[int]]], timeout_s: float = 10.0) -> dict[int, ProcState]:
    """{rank: (node_ip, node_id, pid)} -> {rank: ProcState}; remote nodes through a pinned Ray task."""
    local = _local_ips()
    out, remote = {}, {}
    for rank, (ip, node_id, pid) in where.items():
        if pid is None:
            out[rank] = ProcState("?")
        elif ip in local and os.path.exists(f"/proc/{pid}"):
            out[rank] = read_proc_state(pid)
        else:
            remote[rank] = (node_id, pid)
    if remote:
        out.update(_probe_remote(remote, timeout_s))
    return out


def _probe_remote(remote: dict[int, tuple[str, int]], timeout_s: float) -> dict[int, ProcState]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(read_proc_state)
    refs = {rank: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(pid)
            for rank, (node_id, pid) in remote.items()}
    out = {}
    for rank, ref in refs.items():
        try:
            out[rank] = ray.get(ref, timeout=timeout_s)
        except Exception:  # noqa: BLE001 - the node itself does not answer: say so instead
            out[rank] = ProcState("?", "its node did not answer")
    return out


def describe_stall(role: str, method: str, timeout_s: float, world_size: int, pending: list[int],
                   where: dict[int, tuple[str, str, Optional[int]]], states: dict[int, ProcState],
                   timeout_key: str = "training.worker_timeout_s") -> str:
    """One sentence: who stalled, in what state, and what the other pending ranks wait for."""
    def who(rank):
        ip, _, pid = where[rank]
        return f"rank {rank} of {world_size} (pid {pid} on {ip})" if pid else f"rank {rank} of {world_size} (on {ip})"

    stopped = [r for r in pending if states.get(r, ProcState("?")).stopped]
    dead = [r for r in pending if states.get(r, ProcState("?")).state in ("Z", "X")]
    culprits = stopped + dead
    parts = []
    for r in culprits:
        parts.append(f"{who(r)} is {STATE_WORDS[states[r].state]}, so it never finished {method}")
    for r in pending:
        if r in culprits:
            continue
        st = states.get(r, ProcState("?"))
        if st.state == "?":
            desc = "in an unknown state" + (f" ({st.wchan})" if st.wchan else " (its process could not be read)")
        else:
            desc = STATE_WORDS.get(st.state, f"in state {st.state}") + (f", in {st.wchan}" if st.wchan else "")
        if culprits and st.state in ("S", "D"):
            desc += f", most likely for rank {_span(culprits)} in a collective"
        parts.append(f"{who(r)} is {desc}")
    hint = ("raise it if the step is just slow" if all(states.get(r, ProcState("?")).state == "R" for r in pending)
            else "the run stops rather than wait forever")
    return f"{role}.{method} timed out after {timeout_s:g} s (`{timeout_key}`; {hint}): " + "; ".join(parts) + "."


def _span(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


