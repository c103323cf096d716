"""Config rules of the reward-model role and of ray_gpt's train/infer split: one sentence each,
before anything starts; the valid layouts plan as promised."""
import pytest

import ray_gpt
from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.config.validate import validate

A = "actor_rollout_ref.actor_rollout"
TINY = "grpo_trainer_tiny"


@pytest.mark.parametrize("overrides,fragments", [
    (["resource_pool.reward=[3]", "reward.load=/nonexistent/rm"],
     ["`resource_pool.reward: [3]` gives the reward model 3 data-parallel groups", "global_batch_size: 16",
      "multiple of 3"]),
    (["resource_pool.reward=[2]", "reward.load=/nonexistent/rm", "reward.tensor_model_parallel_size=2",
      "reward.sequence_parallel=true"],
     ["`reward.sequence_parallel: true`: the reward model's scalar head", "set reward.sequence_parallel: false"]),
    (["algorithm.reward_model_weight=abc"], ["`algorithm.reward_model_weight` must be a number"]),
], ids=["rm-dp-vs-batch", "rm-sequence-parallel", "rm-weight-type"])
def test_reward_model_rules(overrides, fragments, capsys):
    assert ray_gpt.main(["--config-name", TINY, *overrides, "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in err, f"{frag!r} not in {err!r}"


def test_reward_model_alone_or_with_verifiers_validates(tmp_path):
    (tmp_path / "rm").mkdir()
    for verifier in ("true", "false"):
        cfg = build_config(compose_yaml(TINY, ["resource_pool.reward=[2]", f"reward.load={tmp_path / 'rm'}",
                                               f"reward.verifier={verifier}", "algorithm.reward_model_weight=0.5"]))
        validate(cfg)
        assert cfg.algorithm.reward_model_weight == 0.5 and cfg.reward.load == str(tmp_path / "rm")


def test_split_validates_with_a_pipelined_sequence_parallel_trainer():
    """Generation ranks never pipeline nor split sequences, so PP 2 + sequence parallelism on the
    training ranks validate when the split is on; colocated too (the native engine decodes with
    SP switched off: models/parallel.sequence_parallel_off)."""
    split = [f"{A}.pipeline_model_parallel_size=2", f"{A}.tensor_model_parallel_size=2", f"{A}.sequence_parallel=true",
             "resource_pool.actor_rollout=[6]", f"{A}.num_gpus_for_train=4", f"{A}.num_gpus_for_infer=2"]
    validate(build_config(compose_yaml(TINY, split)), check_paths=False)
    validate(build_config(compose_yaml(TINY, split[:3] + ["resource_pool.actor_rollout=[4]"])), check_paths=False)


def test_split_generation_ranks_hold_whole_tp_groups(capsys):
    code = ray_gpt.main(["--config-name", TINY, f"{A}.tensor_model_parallel_size=2", "resource_pool.actor_rollout=[5]",
                         f"{A}.num_gpus_for_train=2", f"{A}.num_gpus_for_infer=3", "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2 and "num_gpus_for_infer: 3` is not a multiple of tensor_model_parallel_size 2" in err


def test_split_plan_is_printed(capsys):
    code = ray_gpt.main(["--config-name", TINY, "resource_pool.actor_rollout=[2]", f"{A}.num_gpus_for_train=1",
                         f"{A}.num_gpus_for_infer=1", "dry_run=true"])
    out = capsys.readouterr().out
    assert code == 0 and "ranks 0: train" in out and "ranks 1: generate" in out
