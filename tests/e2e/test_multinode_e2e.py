"""Multi-node on one CPU host: ray_gpt.py joins a cluster of a head (no devices) and two nodes of 2
logical NPUs each (ray.cluster_utils.Cluster, the nodes `ray start --address` would add), through
RAY_ADDRESS, as it joins a real `ray start` cluster.

The two nodes' raylets are started in different directories (Cluster.add_node starts them in the
current one and Ray workers inherit it), so a relative path exists on one node and not the other,
as on real machines where `ray start` ran in different folders. What one host cannot show: nodes
with different ips (so the loopback MASTER_ADDR check is unit-tested only) and non-shared disks.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
NO_TOKEN = {"RAY_AUTH_MODE": "disabled"}  # a throwaway test cluster on this host: no token to hand around
A = "actor_rollout_ref.actor_rollout"
# 2 GRPO steps of 4 prompts x 4 samples, TP=2 on each node, DP=2 across the two nodes, no reference
SMALL = ["training.train_iters=2", "training.test_freq=0", "training.global_batch_size=4",
         f"{A}.n_samples_per_prompt=4", f"{A}.ppo_mini_batch_size=4", f"{A}.micro_batch_size=8",
         f"{A}.num_samples_per_step=8", f"{A}.use_kl_loss=false", f"{A}.tensor_model_parallel_size=2"]


@pytest.fixture(scope="module")
def multinode():
    """The Cluster and (address, node names, node directories, node ids), each {"a": ..., "b": ...}."""
    from unittest import mock

    import ray._private.utils
    from ray.cluster_utils import Cluster

    from mindspeed_rl.data.tiny_task import TOKENIZER_DIR

    root = tempfile.mkdtemp(prefix="mn", dir="/tmp")  # Ray's socket paths must stay short
    dirs = {n: os.path.join(root, n) for n in ("a", "b")}
    for d in dirs.values():
        os.makedirs(d)
    os.symlink(TOKENIZER_DIR, os.path.join(dirs["a"], "tok"))  # "tok" exists on node a only
    saved_env = {k: os.environ.get(k) for k in NO_TOKEN}
    os.environ.update(NO_TOKEN)  # the cluster's processes inherit it
    cwd, cluster = os.getcwd(), None
    try:
        # Cluster records its head in /tmp/ray/ray_current_cluster, where `ray_gpt.py` (and
        # ray.init("auto")) of anyone else on this machine would find and join it: not this one
        with mock.patch.object(ray._private.utils, "write_ray_address", lambda *a, **k: None):
            cluster = Cluster(initialize_head=True, head_node_args=dict(
                num_cpus=0, temp_dir=os.path.join(root, "ray"), include_dashboard=False))
        nodes = {}
        for n, d in dirs.items():
            os.chdir(d)  # the raylet, and so every worker of this node, runs here
            nodes[n] = cluster.add_node(num_cpus=2, resources={"NPU": 2})
        os.chdir(cwd)
        cluster.wait_for_nodes(timeout=60)
        # all three nodes share this host's ip, so messages name them ip#<node id prefix> (cluster.node_names)
        names = {n: f"{node.node_ip_address}#{node.node_id[:6]}" for n, node in nodes.items()}
        ids = {n: node.node_id for n, node in nodes.items()}
        yield cluster, (cluster.address, names, dirs, ids)
    finally:
        os.chdir(cwd)
        if cluster is not None:
            cluster.shutdown()
        for k, v in saved_env.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(multinode):
    """The module's cluster once the previous job has given everything back: address, names
    ({"a": node name, "b": ...}), dirs (each node's directory), ids (Ray node ids), actors() (how
    many actors the cluster has ever started)."""
    cluster, (address, names, dirs, ids) = multinode
    state = cluster.global_state

    def idle():  # every actor dead and all 4 NPUs free (Ray's view is eventually consistent: ask twice)
        return (all(a["State"] == "DEAD" for a in state.actor_table(None).values())
                and state.available_resources().get("NPU", 0) == 4)

    deadline, calm = time.monotonic() + 90, 0
    while calm < 3:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the previous job's workers and devices were not given back within 90 s: "
                               f"{state.available_resources()}")
        calm = calm + 1 if idle() else 0
        time.sleep(0.5)
    return SimpleNamespace(address=address, names=names, dirs=dirs, ids=ids,
                           actors=lambda: len(state.actor_table(None)))


def ray_gpt(address, *overrides, cwd, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "ray_gpt.py"), *overrides], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "RAY_ADDRESS": address, **NO_TOKEN})


def test_ranks_run_on_both_nodes(cluster, tmp_path):
    address, names, dirs = cluster.address, cluster.names, cluster.dirs
    proc = ray_gpt(address, "resource_pool.actor_rollout=[2,2]", *SMALL, f"training.output_dir={tmp_path}",
                   cwd=dirs["a"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # one placement group per node entry: ranks 0-1 (TP group 0) on one node, ranks 2-3 on the other
    placed = next(line for line in proc.stdout.splitlines() if line.startswith("nodes: actor_rollout:"))
    assert placed in {f"nodes: actor_rollout: ranks 0-1 on {names[x]}, ranks 2-3 on {names[y]}"
                      for x, y in (("a", "b"), ("b", "a"))}, placed
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2]


def test_path_missing_on_one_node_fails_before_spawning(cluster, tmp_path):
    address, names, dirs = cluster.address, cluster.names, cluster.dirs
    actors = cluster.actors()
    # the driver (in node a's directory) and node a see ./tok; node b resolves it in its own directory
    proc = ray_gpt(address, "resource_pool.actor_rollout=[2,2]", *SMALL, "training.tokenizer_name_or_path=tok",
                   f"training.output_dir={tmp_path}", cwd=dirs["a"])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    err = [line for line in proc.stderr.splitlines() if line.startswith("ray_gpt.py: ")]
    assert len(err) == 1, proc.stderr[-3000:]
    assert (f"{names['b']} (actor_rollout, ref) lacks `training.tokenizer_name_or_path: tok` "
            f"({dirs['b']}/tok there)") in err[0]
    assert names["a"] not in err[0] and f"directory `ray start` ran in on each node ({dirs['b']})" in err[0]
    assert "Traceback" not in proc.stderr
    assert cluster.actors() == actors  # no role worker was spawned


def test_entry_larger_than_any_node_fails_before_spawning(cluster, tmp_path):
    address, names, dirs = cluster.address, cluster.names, cluster.dirs
    actors = cluster.actors()
    proc = ray_gpt(address, "resource_pool.actor_rollout=[3]", "training.global_batch_size=3",
                   f"{A}.n_samples_per_prompt=4", f"{A}.ppo_mini_batch_size=3", f"{A}.micro_batch_size=4",
                   f"{A}.num_samples_per_step=4", f"training.output_dir={tmp_path}", cwd=dirs["a"])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert ("ray_gpt.py: resource_pool.actor_rollout[0] needs 3 NPU on one node (each list entry is one STRICT_PACK "
            "placement group) but the largest node has 2 free") in proc.stderr
    assert f"{names['a']}: 2" in proc.stderr and f"{names['b']}: 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert cluster.actors() == actors


def test_node_check_names_a_node_that_is_gone_or_late(cluster):
    import ray

    from mindspeed_rl.distributed.cluster import ClusterError
    from mindspeed_rl.distributed.node_checks import PathCheck, run_on_nodes

    node_a = cluster.ids["a"]
    checks = [PathCheck("training.tokenizer_name_or_path", "tok", "dir")]
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        gone = "ab" * 28  # a well-formed id no node has (one that left the cluster looks the same)
        with pytest.raises(ClusterError, match=r"^the path check on node ghost \(id abababab\) failed: "
                                               r"TaskUnschedulableError: .*the node has left the cluster"):
            run_on_nodes({gone: checks}, {gone: "ghost"}, timeout_s=60)
        with pytest.raises(ClusterError, match=rf"^the path check on node\(s\) a \(id {node_a[:8]}\) did not finish "
                                               r"within 0 s; is the node alive"):
            run_on_nodes({node_a: checks}, {node_a: "a"}, timeout_s=0)
        report = run_on_nodes({node_a: checks}, {node_a: "a"}, timeout_s=60)[node_a]
        assert report.cwd == cluster.dirs["a"] and report.missing == []  # node a's workers run in its directory
    finally:
        ray.shutdown()
