"""Sequence parallel / virtual pipeline / recompute / context parallel settings: each wrong
combination is one sentence naming the key and the fix, before anything starts
(config/parallel_rules.py); the valid ones validate and reach the workers' megatron kwargs."""
import pytest

import ray_gpt
from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.config.validate import validate
from mindspeed_rl.utils.errors import UserInputError

A = "actor_rollout_ref.actor_rollout"
TINY = "grpo_trainer_tiny"
PP2 = [f"{A}.pipeline_model_parallel_size=2", "resource_pool.actor_rollout=[2]", "model.tiny.num_layers=4"]


def _problems(overrides):
    try:
        validate(build_config(compose_yaml(TINY, overrides)), check_paths=False)
    except UserInputError as err:
        return str(err)
    return ""


@pytest.mark.parametrize("overrides,fragments", [
    ([f"{A}.sequence_parallel=true"], ["sequence_parallel: true` needs tensor_model_parallel_size > 1"]),
    ([f"{A}.virtual_pipeline_model_parallel_size=2"],
     ["virtual_pipeline_model_parallel_size: 2` needs pipeline_model_parallel_size > 1", "set PP > 1"]),
    (PP2 + [f"{A}.virtual_pipeline_model_parallel_size=3"],
     ["num_layers 4 is not divisible by pipeline_model_parallel_size 2 x virtual_pipeline_model_parallel_size 3 = 6"]),
    (PP2 + [f"{A}.num_layers_per_virtual_pipeline_stage=3"],
     ["num_layers_per_virtual_pipeline_stage: 3` x pipeline_model_parallel_size 2 does not divide num_layers 4"]),
    (PP2 + [f"{A}.num_layers_per_virtual_pipeline_stage=1", f"{A}.virtual_pipeline_model_parallel_size=4"],
     ["num_layers_per_virtual_pipeline_stage 1 means 2 chunks per pipeline rank", "set only one of the two"]),
    (PP2 + [f"{A}.virtual_pipeline_model_parallel_size=2", f"{A}.micro_batch_size=128"],
     ["runs micro-batches in groups of pipeline_model_parallel_size 2, but a mini-batch has 1", "multiple of 2"]),
    ([f"{A}.recompute_granularity=partial"], ["recompute_granularity: partial` is not supported; use full, selective"]),
    ([f"{A}.recompute_granularity=full", f"{A}.recompute_method=random"],
     ["recompute_method: random` is not supported; use uniform or block"]),
    ([f"{A}.recompute_granularity=selective", f"{A}.recompute_num_layers=1"],
     ["recompute_num_layers: 1` applies only to recompute_granularity: full (it is selective)"]),
    ([f"{A}.recompute_method=block"], ["recompute_method: block` applies only to recompute_granularity: full (it is None)"]),
    ([f"{A}.recompute_granularity=full", f"{A}.recompute_num_layers=3"],
     ["recompute_num_layers: 3` is more than the 2 layers of one pipeline chunk", "use 1 to 2"]),
    (PP2 + [f"{A}.virtual_pipeline_model_parallel_size=2", f"{A}.recompute_granularity=full",
            f"{A}.recompute_num_layers=2"], ["more than the 1 layers of one pipeline chunk"]),
    (["model.tiny.num_layers=6", f"{A}.recompute_granularity=full", f"{A}.recompute_num_layers=4"],
     ["recompute_num_layers: 4` does not divide the 6 layers", "recompute_method: block"]),
    ([f"{A}.recompute_num_layers=0"], ["recompute_num_layers: 0` must be >= 1"]),
    ([f"{A}.context_parallel_size=2"], ["context_parallel_size: 2`: context parallelism is not available",
                                        "set it to 1"]),
    (["resource_pool.reward=[2]", "reward.load=/x", "reward.pipeline_model_parallel_size=2",
      "reward.virtual_pipeline_model_parallel_size=2", "model.tiny.num_layers=4"],
     ["reward.virtual_pipeline_model_parallel_size`: the reward model runs without a virtual pipeline"]),
])
def test_one_sentence_per_problem(overrides, fragments):
    err = _problems(overrides)
    for frag in fragments:
        assert frag in err, f"{frag!r} not in {err!r}"


@pytest.mark.parametrize("overrides,kwargs", [
    ([f"{A}.tensor_model_parallel_size=2", f"{A}.sequence_parallel=true", "resource_pool.actor_rollout=[2]"],
     {"sequence_parallel": True}),
    (PP2 + [f"{A}.virtual_pipeline_model_parallel_size=2"],
     {"virtual_pipeline_model_parallel_size": 2, "batch_p2p_comm": False}),
    (PP2 + [f"{A}.num_layers_per_virtual_pipeline_stage=1"], {"virtual_pipeline_model_parallel_size": 2}),
    ([f"{A}.recompute_granularity=full", f"{A}.recompute_method=block", f"{A}.recompute_num_layers=1"],
     {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1}),
    ([f"{A}.recompute_granularity=full"], {"recompute_method": "uniform", "recompute_num_layers": 1}),
    ([f"{A}.recompute_activations=true"], {"recompute_granularity": "selective"}),
])
def test_valid_settings_reach_megatron(overrides, kwargs):
    from mindspeed_rl.workers.actor import _parallel_kwargs

    cfg = build_config(compose_yaml(TINY, overrides))
    validate(cfg, check_paths=False)
    got = _parallel_kwargs(cfg.actor, cfg.actor.arch.num_layers)
    for key, value in kwargs.items():
        assert got[key] == value, (key, got)


def test_dry_run_exits_2_with_the_sentence(capsys):
    assert ray_gpt.main(["--config-name", TINY, f"{A}.virtual_pipeline_model_parallel_size=2", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "needs pipeline_model_parallel_size > 1" in err


def test_mindspeed_context_parallel_switches_are_forwarded():
    """MindSpeed's ring-attention switches travel with the role's MindSpeed switches (passed to
    MindSpeed's argument parser on NPU: platform/npu.py) and are reported as ignored elsewhere."""
    from mindspeed_rl.platform.npu import switches_to_argv

    cfg = build_config(compose_yaml(TINY, [f"{A}.context_parallel_algo=megatron_cp_algo",
                                           f"{A}.cp_attention_mask_type=causal"]))
    switches = cfg.actor.mindspeed_switches
    assert switches == {"context_parallel_algo": "megatron_cp_algo", "cp_attention_mask_type": "causal"}
    assert switches_to_argv(switches) == ["--context-parallel-algo", "megatron_cp_algo",
                                          "--cp-attention-mask-type", "causal"]
