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
