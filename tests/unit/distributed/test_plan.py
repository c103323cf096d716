"""Placement plan and the check against a (fake) Ray cluster's nodes."""
import pytest

from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.distributed.plan import check_cluster, format_plan, make_plan, placement_groups
from mindspeed_rl.utils.errors import UserInputError


def plan_of(name, *overrides):
    return make_plan(build_config(compose_yaml(name, list(overrides)), name))


def test_separated_plan_qwen7b():
    plan = {p.role: p for p in plan_of("grpo_trainer_qwen25_7b")}
    actor = plan["actor_rollout"]
    assert (actor.tp, actor.pp, actor.dp, actor.world_size) == (2, 2, 2, 14)
    assert [r.job for r in actor.ranks].count("train") == 8 and [r.job for r in actor.ranks].count("generate") == 6
    assert [r.node for r in actor.ranks] == [0] * 8 + [1] * 6
    assert plan["ref"].shares is None and plan["ref"].world_size == 2
    assert "reward" not in plan
    assert placement_groups(list(plan.values())) == [("actor_rollout", 8), ("actor_rollout", 6), ("ref", 2)]


def test_colocated_reference_shares_actor_devices():
    plan = {p.role: p for p in plan_of("grpo_trainer_qwen25_15b")}
    assert plan["ref"].shares == "actor_rollout" and plan["ref"].world_size == 8
    assert plan["actor_rollout"].dp == 4
    assert placement_groups(list(plan.values())) == [("actor_rollout", 8)]
    text = format_plan(list(plan.values()), "NPU")
    assert "shares actor_rollout's devices" in text and "train+generate" in text


def test_cluster_with_too_few_devices_is_one_sentence():
    plan = plan_of("grpo_trainer_qwen25_7b")
    with pytest.raises(UserInputError) as err:
        check_cluster(plan, {"10.0.0.1": 8.0}, "NPU")
    msg = str(err.value)
    assert "actor_rollout 8 + actor_rollout 6 + ref 2 = 16 NPU" in msg and "has 8" in msg and "ray start --address" in msg
    assert "\n" not in msg


def test_cluster_packing_per_node():
    plan = plan_of("grpo_trainer_qwen25_7b")
    check_cluster(plan, {"a": 8.0, "b": 8.0}, "NPU")  # 8 | 6 + 2
    with pytest.raises(UserInputError, match="needs 8 NPU on one node"):
        check_cluster(plan, {"a": 6.0, "b": 6.0, "c": 4.0}, "NPU")


def test_an_entry_larger_than_every_node_names_the_entry_and_a_split():
    plan = plan_of("grpo_trainer_tiny", "resource_pool.actor_rollout=[3]")
    with pytest.raises(UserInputError) as err:
        check_cluster(plan, {"head": 0.0, "a": 2.0, "b": 2.0}, "NPU")  # 4 in total: the totals fit
    assert str(err.value) == ("resource_pool.actor_rollout[0] needs 3 NPU on one node (each list entry is one "
                              "STRICT_PACK placement group) but the largest node has 2 free (head: 0, a: 2, b: 2); "
                              "split it into per-node entries of at most 2, e.g. [2, 1].")


def test_entries_compete_for_nodes():
    plan = plan_of("grpo_trainer_tiny", "resource_pool.actor_rollout=[2,2]", "resource_pool.ref=[2]")
    check_cluster(plan, {"a": 2.0, "b": 2.0, "c": 2.0}, "NPU")
    with pytest.raises(UserInputError, match=r"resource_pool\.\w+\[\d\] needs 2 NPU on one node but none is left "
                                             r"once the larger entries are placed \(a: 4, b: 1, c: 1, placing "
                                             r"actor_rollout 2 \+ actor_rollout 2 \+ ref 2\)"):
        check_cluster(plan, {"a": 4.0, "b": 1.0, "c": 1.0}, "NPU")  # 6 in total, but 2+2 fit only on a


def test_best_fit_keeps_the_big_node_for_the_big_entry():
    plan = plan_of("grpo_trainer_tiny", "resource_pool.actor_rollout=[3,2]", "resource_pool.ref=[2]")
    # first fit, largest node first, would put 3 on "big" (1 left) and 2 on "small" (1 left): no room for the
    # last 2; best fit puts 3 on "small" and both 2s on "big"
    check_cluster(plan, {"big": 4.0, "small": 3.0}, "NPU")


def test_each_entry_needs_its_cpus_on_the_same_node():
    plan = plan_of("grpo_trainer_tiny", "resource_pool.actor_rollout=[2,2]")
    check_cluster(plan, {"a": 2.0, "b": 2.0}, "NPU", {"a": 2.0, "b": 2.0})
    check_cluster(plan, {"a": 2.0, "b": 2.0}, "NPU", {"a": 1.0, "b": 1.0}, cpus_per_device=0.5)
    with pytest.raises(UserInputError) as err:
        check_cluster(plan, {"a": 2.0, "b": 2.0}, "NPU", {"a": 1.0, "b": 1.0})
    assert str(err.value) == ("resource_pool.actor_rollout[0] needs 2 NPU and 2 CPU on one node but no node has "
                              "both free (a: 2 NPU + 1 CPU, b: 2 NPU + 1 CPU); start Ray on the nodes with more "
                              "--num-cpus.")
    with pytest.raises(UserInputError) as err:  # 9 CPUs in total, but only b has 2 of them next to 2 NPU
        check_cluster(plan, {"a": 2.0, "b": 2.0}, "NPU", {"a": 1.0, "b": 8.0})
    assert str(err.value) == ("resource_pool.actor_rollout[1] needs 2 NPU and 2 CPU on one node but no node has "
                              "both left once the larger entries are placed (a: 2 NPU + 1 CPU, b: 2 NPU + 8 CPU, "
                              "placing actor_rollout 2 + actor_rollout 2); make each entry fit one node's free NPU "
                              "and CPUs (e.g. one entry per node).")
