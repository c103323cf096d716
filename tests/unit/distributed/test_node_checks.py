"""Node checks before spawning: what each node must see, the sentences, loopback MASTER_ADDR."""
import os

import pytest

from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.distributed.node_checks import (NodeReport, PathCheck, code_problem, format_node_placement,
                                                  inspect_node, is_loopback, loopback_problem,
                                                  missing_paths_problem, paths_to_check)

A = "actor_rollout_ref.actor_rollout"


def config(*overrides):
    return build_config(compose_yaml("grpo_trainer_tiny", list(overrides)), "grpo_trainer_tiny")


def test_paths_each_role_opens(tmp_path):
    cfg = config(f"{A}.load={tmp_path}/actor_ckpt", f"actor_rollout_ref.ref.load={tmp_path}/ref_ckpt",
                 f"{A}.save={tmp_path}/out/ckpt")
    tok = cfg.run.tokenizer_name_or_path  # the tiny task's, absolute, in the package
    assert os.path.isabs(tok)
    assert paths_to_check(cfg, ["actor_rollout", "ref"]) == [
        PathCheck("training.tokenizer_name_or_path", tok, "dir"),
        PathCheck(f"{A}.load", f"{tmp_path}/actor_ckpt", "exists"),
        PathCheck(f"{A}.save", f"{tmp_path}/out/ckpt", "parent"),
        PathCheck("actor_rollout_ref.ref.load", f"{tmp_path}/ref_ckpt", "exists")]
    resumed = config(f"{A}.save={tmp_path}/out/ckpt", f"training.resume={tmp_path}/out/ckpt/iter_0000002")
    assert paths_to_check(resumed, ["actor_rollout"])[-1] == PathCheck(
        "training.resume", f"{tmp_path}/out/ckpt/iter_0000002", "exists")
    # a node hosting only the reference neither loads the actor's checkpoint nor writes its saves
    assert [c.key for c in paths_to_check(cfg, ["ref"])] == ["training.tokenizer_name_or_path",
                                                            "actor_rollout_ref.ref.load"]


def test_inspect_node_resolves_relative_paths_against_this_process_cwd(tmp_path, monkeypatch):
    (tmp_path / "tok").mkdir()
    (tmp_path / "ckpt.pt").write_text("x")
    monkeypatch.chdir(tmp_path)
    checks = [PathCheck("training.tokenizer_name_or_path", "tok", "dir"),
              PathCheck(f"{A}.load", "ckpt.pt", "exists"),
              PathCheck(f"{A}.save", "out/checkpoints", "parent"),  # out/ does not exist
              PathCheck("actor_rollout_ref.ref.load", str(tmp_path / "nope"), "exists"),
              PathCheck("training.tokenizer_name_or_path", "ckpt.pt", "dir")]  # a file is not a tokenizer dir
    report = inspect_node(checks)
    assert report.cwd == str(tmp_path)
    assert [(c.path, there) for c, there in report.missing] == [
        ("out/checkpoints", str(tmp_path / "out")), (str(tmp_path / "nope"), str(tmp_path / "nope")),
        ("ckpt.pt", str(tmp_path / "ckpt.pt"))]
    assert report.ip and report.digest and report.package.endswith("mindspeed_rl")


def test_missing_paths_are_one_sentence_naming_every_node_and_path():
    tok = PathCheck("training.tokenizer_name_or_path", "tok", "dir")
    load = PathCheck(f"{A}.load", "/ckpt/qwen", "exists")
    save = PathCheck(f"{A}.save", "/shared/run/ckpt", "parent")
    msg = missing_paths_problem({
        "10.0.0.1 (actor_rollout)": NodeReport("10.0.0.1", "/root", []),
        "10.0.0.2 (actor_rollout)": NodeReport("10.0.0.2", "/home/me", [(tok, "/home/me/tok"), (load, "/ckpt/qwen")]),
        "10.0.0.3 (actor_rollout, ref)": NodeReport("10.0.0.3", "/", [(save, "/shared/run")])})
    assert msg == ("paths the role workers open are missing on the node that hosts them: 10.0.0.2 (actor_rollout) "
                   "lacks `training.tokenizer_name_or_path: tok` (/home/me/tok there) and "
                   "`actor_rollout_ref.actor_rollout.load: /ckpt/qwen`; 10.0.0.3 (actor_rollout, ref) lacks the "
                   "parent directory of `actor_rollout_ref.actor_rollout.save: /shared/run/ckpt` (/shared/run "
                   "there); put them on storage every node mounts at the same path, or copy them there; relative "
                   "paths resolve against the directory `ray start` ran in on each node (/home/me), so prefer "
                   "absolute ones.")
    assert "10.0.0.1" not in msg
    assert missing_paths_problem({"10.0.0.1 (ref)": NodeReport("10.0.0.1", "/", [])}) is None


@pytest.mark.parametrize("ip, loop", [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("localhost", True),
                                      ("10.0.0.1", False), ("192.0.2.2", False), ("node-7", False), ("", False)])
def test_is_loopback(ip, loop):
    assert is_loopback(ip) is loop


def test_loopback_master_addr_only_matters_when_the_nodes_differ_in_ip():
    two_hosts = [("127.0.0.1", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"), ("10.0.0.2", "10.0.0.2")]
    msg = loopback_problem("actor_rollout", two_hosts)
    assert msg == ("actor_rollout ranks span nodes with ips 127.0.0.1 and 10.0.0.2, but rank 0's node 127.0.0.1 "
                   "registered with Ray as 127.0.0.1, a loopback MASTER_ADDR the other nodes cannot reach; restart "
                   "Ray on that node with `ray start ... --node-ip-address=<its cluster ip>`.")
    # one host, several Ray nodes (ray.cluster_utils.Cluster): loopback reaches rank 0 from every rank
    assert loopback_problem("actor_rollout", [("127.0.0.1#aa", "127.0.0.1"), ("127.0.0.1#bb", "127.0.0.1")]) is None
    assert loopback_problem("ref", [("127.0.0.1", "127.0.0.1")] * 4) is None  # all ranks on one node
    assert loopback_problem("actor_rollout", [("10.0.0.1", "10.0.0.1"), ("127.0.0.1", "127.0.0.1")]) is None


def test_code_mismatch_sentence():
    msg = code_problem("10.0.0.2 (ref)", "/opt/old/mindspeed_rl", "/work/mindspeed_rl")
    assert msg.startswith("node 10.0.0.2 (ref) imports a different mindspeed_rl (/opt/old/mindspeed_rl) than "
                          "the driver (/work/mindspeed_rl); install the same checkout on every node")
    assert "\n" not in msg


def test_node_placement_lines():
    text = format_node_placement({"actor_rollout": ["a", "a", "b", "b"], "ref": ["a"]})
    assert text == "nodes: actor_rollout: ranks 0-1 on a, ranks 2-3 on b\nnodes: ref: rank 0 on a"
