"""A real two-host run on one machine: two Linux network namespaces joined by a veth pair.

Host a (namespace a, 10.R.S.1) runs `ray start --head` and the driver; host b (10.R.S.2) runs
`ray start --address`. Each has its own IP, its own working directory and its own Ray temp dir, so
paths are not shared by accident and nothing outside the namespaces can reach (or join) the
cluster: the addresses exist only inside the namespaces this test creates. ray_gpt.py then runs an
actor that spans both hosts (one rank each: MASTER_ADDR on host a, gloo across the veth), checks
the nodes, trains a few GRPO steps; a second run loses host b (every process in namespace b is
killed) and the driver must stop within 60 s naming that node. Everything (processes, namespaces
with their veths, directories) is removed in `finally`, also on failure.

Needs root and `ip netns`; skipped with the reason otherwise.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]
A = "actor_rollout_ref.actor_rollout"
PORT = 6390
# one actor rank per host (DP=2 across them), the reference colocated, 4 prompts x 4 samples
SMALL = ["resource_pool.actor_rollout=[1,1]", "training.test_freq=0", "training.global_batch_size=4",
         f"{A}.n_samples_per_prompt=4", f"{A}.ppo_mini_batch_size=4", f"{A}.micro_batch_size=8",
         f"{A}.num_samples_per_step=16", "training.save_final=false", "training.worker_timeout_s=120"]


def sh(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120, **kw)


def ns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


def pids_in(ns: str) -> list[int]:
    """Every process whose network namespace is `ns` (what `ip netns pids` lists)."""
    try:
        ino = ns_inode(ns)
    except OSError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == ino:
                    out.append(int(entry))
            except OSError:
                pass
    return out


def kill_ns(ns: str) -> None:
    for _ in range(3):  # Ray's daemons restart nothing once their raylet is gone, but be thorough
        pids = pids_in(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.5)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 (`ip netns`) to create two network namespaces")
    tag = f"{os.getpid() % 100000}"
    ns = {"a": f"msrl{tag}a", "b": f"msrl{tag}b"}
    veth = {"a": f"msrl{tag}va", "b": f"msrl{tag}vb"}
    net = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
    ip = {"a": f"{net}.1", "b": f"{net}.2"}
    root = Path(tempfile.mkdtemp(prefix="msrl", dir="/tmp"))  # short: Ray's socket paths live under it
    dirs = {h: root / h for h in ns}
    env = {}
    try:
        made = sh("ip", "netns", "add", ns["a"], check=False)
        if made.returncode != 0:
            pytest.skip(f"`ip netns add` is not permitted here: {made.stderr.strip()}")
        sh("ip", "netns", "add", ns["b"])
        sh("ip", "link", "add", veth["a"], "type", "veth", "peer", "name", veth["b"])
        for h in ns:
            sh("ip", "link", "set", veth[h], "netns", ns[h])
            sh("ip", "-n", ns[h], "addr", "add", f"{ip[h]}/24", "dev", veth[h])
            sh("ip", "-n", ns[h], "link", "set", veth[h], "up")
            sh("ip", "-n", ns[h], "link", "set", "lo", "up")
            dirs[h].mkdir()
            env[h] = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
            env[h].update(PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled", GLOO_SOCKET_IFNAME=veth[h],
                          OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
        ray = str(Path(sys.executable).with_name("ray"))
        common = ["--num-cpus", "2", "--resources", json.dumps({"NPU": 1}), "--disable-usage-stats"]
        sh("ip", "netns", "exec", ns["a"], ray, "start", "--head", "--node-ip-address", ip["a"], "--port", str(PORT),
           "--temp-dir", str(dirs["a"] / "ray"), "--include-dashboard", "false", *common, cwd=dirs["a"], env=env["a"])
        sh("ip", "netns", "exec", ns["b"], ray, "start", "--address", f"{ip['a']}:{PORT}", "--node-ip-address", ip["b"],
           "--temp-dir", str(dirs["b"] / "ray"), *common, cwd=dirs["b"], env=env["b"])
        yield {"ns": ns, "ip": ip, "dirs": dirs, "env": env, "address": f"{ip['a']}:{PORT}"}
    finally:
        for h in ("b", "a"):
            kill_ns(ns[h])
            sh("ip", "netns", "del", ns[h], check=False)  # takes its end of the veth pair with it
        shutil.rmtree(root, ignore_errors=True)
        left = [v for v in veth.values() if sh("ip", "link", "show", v, check=False).returncode == 0]
        assert not left, f"veths left behind: {left}"


def driver(hosts, *overrides, **popen):
    env = {**hosts["env"]["a"], "RAY_ADDRESS": hosts["address"]}
    out = hosts["dirs"]["a"] / "run"
    cmd = ["ip", "netns", "exec", hosts["ns"]["a"], sys.executable, str(ROOT / "ray_gpt.py"),
           f"training.output_dir={out}", *SMALL, *overrides]
    return subprocess.Popen(cmd, cwd=hosts["dirs"]["a"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **popen), out


def test_grpo_across_two_hosts_then_losing_one(two_hosts):
    ip = two_hosts["ip"]
    proc, out = driver(two_hosts, "training.train_iters=3")
    try:
        text, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, text[-4000:]
    placed = next((line for line in text.splitlines() if line.startswith("nodes: actor_rollout:")), "")
    assert ip["a"] in placed and ip["b"] in placed, text[-4000:]  # the role spans both hosts
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "done:" in text and "Traceback" not in text

    # host b goes away mid-run: the driver stops within 60 s and names the node
    proc, out = driver(two_hosts, "training.train_iters=500", f"training.output_dir={out}2")
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            if (out.with_name("run2") / "metrics.jsonl").exists() and \
                    len((out.with_name("run2") / "metrics.jsonl").read_text().splitlines()) >= 2:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        kill_ns(two_hosts["ns"]["b"])
        text, _ = proc.communicate(timeout=60)  # raises TimeoutExpired past 60 s
    finally:
        proc.kill()
    assert proc.returncode == 1, text[-4000:]
    assert ip["b"] in text.split("ray_gpt.py:")[-1], text[-4000:]
    assert "Traceback" not in text
