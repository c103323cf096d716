"""Mixture-of-experts placement rules: one sentence per problem, in dry_run, before anything starts;
a valid EP layout dry-runs and the Megatron MoE keys reach the builder's TransformerConfig."""
import pytest
import torch

import ray_gpt
from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.config.validate import validate

A = "actor_rollout_ref.actor_rollout"
TINY = "grpo_trainer_tiny"
MOE = ["training.num_experts=4", "training.moe_ffn_hidden_size=64", "training.moe_router_topk=2"]


def test_ep2_dry_runs_and_both_roles_get_the_experts(capsys):
    over = MOE + [f"{A}.expert_model_parallel_size=2", "resource_pool.actor_rollout=[2]"]
    assert ray_gpt.main(["--config-name", TINY, *over, "dry_run=true"]) == 0
    assert "dry_run: the config is valid" in capsys.readouterr().out
    cfg = build_config(compose_yaml(TINY, over))
    assert (cfg.actor.arch.num_experts, cfg.ref.arch.num_experts, cfg.actor.parallel.expert_model_parallel_size) == (4, 4, 2)


@pytest.mark.parametrize("overrides,fragment", [
    ([f"{A}.expert_model_parallel_size=3", "resource_pool.actor_rollout=[3]"],
     "expert_model_parallel_size: 3` does not divide num_experts 4"),
    ([f"{A}.expert_tensor_parallel_size=3", "resource_pool.actor_rollout=[3]"],
     "expert_tensor_parallel_size: 3` does not divide moe_ffn_hidden_size 64"),
    ([f"{A}.expert_model_parallel_size=2", "resource_pool.actor_rollout=[3]"],
     "its 3 device(s) are not a multiple of expert_tensor_parallel_size 1 x expert_model_parallel_size 2"),
    ([f"{A}.tensor_model_parallel_size=2", "resource_pool.actor_rollout=[2]"],
     "an MoE model at tensor_model_parallel_size 2 needs sequence_parallel: true"),
    (["training.platform=cpu", "training.moe_token_dispatcher_type=alltoall"],
     "moe_token_dispatcher_type: alltoall` does not run on CPU"),
    (["training.moe_token_dispatcher_type=a2a"], "moe_token_dispatcher_type: a2a` is not supported"),
    (["training.moe_router_topk=1", "training.norm_topk_prob=true"], "moe_router_topk: 1` with renormalised"),
    (["training.moe_router_topk=5"], "moe_router_topk: 5` exceeds num_experts 4"),
    ([f"{A}.num_gpus_for_infer=2", "resource_pool.actor_rollout=[4]", f"{A}.num_gpus_for_train=2",
      f"{A}.tensor_model_parallel_size=2", f"{A}.sequence_parallel=true"],
     "the train/infer split's megatron engine decodes an MoE model at the actor's tensor_model_parallel_size 2"),
    ([f"{A}.num_gpus_for_infer=1", "resource_pool.actor_rollout=[2]", f"{A}.num_gpus_for_train=1",
      f"{A}.moe_enable_routing_replay=true"], "the train/infer split does not hand them back"),
    ([f"{A}.moe_enable_routing_replay=true", f"{A}.rollout_engine=vllm", "training.qk_layernorm=true"],
     "vLLM does not hand them back here"),
    ([f"{A}.rollout_engine=vllm"], "vLLM's Qwen3-MoE, which has q/k norms, but model tiny has none"),
    (["training.moe_shared_expert_intermediate_size=63", f"{A}.tensor_model_parallel_size=2",
      f"{A}.sequence_parallel=true", "resource_pool.actor_rollout=[2]"],
     "tensor_model_parallel_size: 2` does not divide moe_shared_expert_intermediate_size 63"),
    (["training.moe_shared_expert_intermediate_size=64", f"{A}.rollout_engine=vllm"],
     "as vLLM's Qwen2-MoE, which gates it (shared_expert_gate: true)"),
    ([f"{A}.moe_enable_routing_replay=true", "training.moe_router_load_balancing_type=sinkhorn"],
     "moe_enable_routing_replay: true` cannot replay sinkhorn routing"),
    ([f"{A}.moe_enable_routing_replay=true", f"{A}.recompute_granularity=full"],
     "moe_enable_routing_replay: true` with recompute_granularity: full"),
    (["training.moe_layer_freq=[0,1,1]"], "moe_layer_freq [0, 1, 1] must hold one 0 or 1 per layer (2)"),
    (["training.moe_router_enable_expert_bias=true", "training.moe_router_pre_softmax=true"],
     "moe_router_enable_expert_bias with softmax routing (ERNIE 4.5 MoE's) needs the top-k renormalised"),
    (["training.moe_router_num_groups=2"], "moe_router_num_groups and moe_router_group_topk go together"),
    (["training.moe_router_num_groups=3", "training.moe_router_group_topk=1"],
     "moe_router_num_groups 3 must divide num_experts 4"),
    (["training.moe_router_score_function=softplus"], "moe_router_score_function: softplus` is not supported"),
    # gpt-oss's switches (models/gpt_oss.py)
    (["training.quick_geglu=true", "training.disable_bias_linear=false", f"{A}.tensor_model_parallel_size=2",
      f"{A}.sequence_parallel=true", "resource_pool.actor_rollout=[2]"],
     "expert_tensor_parallel_size: 2` with gpt-oss's expert biases is not supported"),
    (["training.softmax_type=off-by-one"], "softmax_type 'off-by-one' is not supported; use vanilla or learnable"),
    (["training.softmax_type=learnable", "training.platform=npu"],
     "softmax_type learnable (gpt-oss's attention sinks) is not supported on npu"),
    (["training.glu_linear_offset=1.0"], "activation_func_clamp_value / glu_linear_offset apply to quick_geglu"),
    (["training.disable_bias_linear=false"], "disable_bias_linear: false in an MoE model is supported with gpt-oss's"),
    (["training.quick_geglu=true", "training.activation_func_clamp_value=5.0", f"{A}.rollout_engine=vllm"],
     "vLLM's gpt-oss clamps its experts at 7.0 whatever config.json says"),
], ids=["ep-divides-experts", "etp-divides-ffn", "devices-hold-expert-groups", "tp-needs-sp", "cpu-dispatcher",
        "unknown-dispatcher", "top1-renormalised", "topk-over-experts", "split-native-tp2", "split-replay",
        "replay-vllm", "vllm-needs-qk-norm", "shared-expert-tp", "vllm-shared-expert-gate", "replay-sinkhorn", "replay-full-recompute",
        "moe-layer-pattern", "softmax-expert-bias-renormalised", "groups-together", "groups-divide", "score-function",
        "gpt-oss-etp", "softmax-type", "sinks-on-npu", "offset-needs-quick-geglu", "moe-bias-needs-gpt-oss", "vllm-gpt-oss-limit"])
def test_moe_rules(overrides, fragment, capsys):
    assert ray_gpt.main(["--config-name", TINY, *MOE, *overrides, "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert fragment in err, f"{fragment!r} not in {err!r}"


@pytest.mark.parametrize("engine", [[f"{A}.expert_model_parallel_size=2"],
                                    [f"{A}.rollout_engine=vllm", "training.qk_layernorm=true",
                                     f"{A}.tensor_model_parallel_size=2", f"{A}.sequence_parallel=true"]],
                         ids=["native-ep2", "vllm-tp2"])
def test_moe_on_the_train_infer_split_dry_runs(engine, capsys):
    over = MOE + ["resource_pool.actor_rollout=[4]", f"{A}.num_gpus_for_train=2", f"{A}.num_gpus_for_infer=2", *engine]
    assert ray_gpt.main(["--config-name", TINY, *over, "dry_run=true"]) == 0, capsys.readouterr().err


def test_moe_with_the_vllm_engine_colocated_dry_runs(capsys):
    over = MOE + [f"{A}.expert_model_parallel_size=2", "resource_pool.actor_rollout=[2]", f"{A}.rollout_engine=vllm",
                  "training.qk_layernorm=true"]
    assert ray_gpt.main(["--config-name", TINY, *over, "dry_run=true"]) == 0, capsys.readouterr().err



def test_hunyuan_moe_with_the_vllm_engine_dry_runs(capsys):
    """HunYuan-MoE's ungated shared expert with per-head q / k norms is not vLLM's Qwen2-MoE, but vLLM serves it as
    itself (HunYuanMoEV1ForCausalLM, its Transformers backend): no Qwen-MoE rule applies (ran end to end in the vLLM
    environment: docs/models.md, HunYuan-MoE)."""
    over = MOE + ["training.moe_shared_expert_intermediate_size=64", "training.qk_layernorm=true",
                  "training.qk_layernorm_after_rope=true", f"{A}.rollout_engine=vllm"]
    assert ray_gpt.main(["--config-name", TINY, *over, "dry_run=true"]) == 0, capsys.readouterr().err
    code = ray_gpt.main(["--config-name", TINY, *over, "training.rotary_percent=0.5", "dry_run=true"])
    assert code == 2 and "qk_layernorm_after_rope takes plain RoPE only" in capsys.readouterr().err



def test_granite_moe_with_the_vllm_engine_dry_runs(capsys):
    """Granite's multipliers around experts without q / k norms, with a shared MLP without a gate or none, are neither
    vLLM's Qwen3-MoE nor its Qwen2-MoE, but vLLM serves them as Granite MoE (GraniteMoeSharedForCausalLM /
    GraniteMoeForCausalLM; hf_granite_config.granite_moe_config): no Qwen-MoE rule applies (ran end to end in the vLLM
    environment: docs/moe.md, Granite MoE and Granite 4.0). Without the multipliers the rule still names the mismatch."""
    granite = ["training.embedding_multiplier_scale=2.0", f"{A}.rollout_engine=vllm"]
    for shared in ([], ["training.moe_shared_expert_intermediate_size=64"]):
        assert ray_gpt.main(["--config-name", TINY, *MOE, *granite, *shared, "dry_run=true"]) == 0, \
            capsys.readouterr().err
    code = ray_gpt.main(["--config-name", TINY, *MOE, f"{A}.rollout_engine=vllm",
                         "training.moe_shared_expert_intermediate_size=64", "dry_run=true"])
    assert code == 2 and "runs an MoE model with a shared expert as vLLM's Qwen2-MoE" in capsys.readouterr().err


def test_expert_parallel_without_experts_is_named(capsys):
    code = ray_gpt.main(["--config-name", TINY, f"{A}.expert_model_parallel_size=2", "resource_pool.actor_rollout=[2]",
                         "dry_run=true"])
    assert code == 2 and "need an MoE model, but model tiny has no experts" in capsys.readouterr().err


def test_routing_replay_on_a_dense_model_is_named_and_on_moe_dry_runs(capsys):
    code = ray_gpt.main(["--config-name", TINY, f"{A}.moe_enable_routing_replay=true", "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2 and "moe_enable_routing_replay: true` replays MoE expert choices, but model tiny has no experts" in err
    assert "Traceback" not in err
    assert ray_gpt.main(["--config-name", TINY, *MOE, f"{A}.moe_enable_routing_replay=true", "dry_run=true"]) == 0
    assert build_config(compose_yaml(TINY, MOE)).actor.ppo.moe_enable_routing_replay is False  # off by default


def test_transformer_config_gets_the_moe_fields(gloo_world1):
    """The Megatron MoE keys become TransformerConfig fields; norm_topk_prob is the inverse of
    pre-softmax routing (HF renormalises the top-k; megatron's softmax over the top-k logits)."""
    from mindspeed_rl.models.arch_check import model_args
    from mindspeed_rl.models.builder import init_parallel_state, transformer_config

    cfg = build_config(compose_yaml(TINY, MOE + ["training.norm_topk_prob=true", "training.moe_aux_loss_coeff=0.01"]))
    validate(cfg, check_paths=False)
    init_parallel_state(1, 1)
    tc = transformer_config(model_args(cfg.actor, 100))
    assert (tc.num_moe_experts, tc.moe_router_topk, tc.moe_ffn_hidden_size) == (4, 2, 64)
    assert tc.moe_router_pre_softmax is False and tc.moe_aux_loss_coeff == 0.01
    assert tc.moe_token_dispatcher_type == "allgather" and tc.moe_grouped_gemm is False
    tc = transformer_config(dict(model_args(cfg.actor, 100), norm_topk_prob=False))
    assert tc.moe_router_pre_softmax is True
    dense = transformer_config(model_args(build_config(compose_yaml(TINY)).actor, 100))
    assert dense.num_moe_experts is None


def test_moe_grouped_gemm_reaches_the_builder_as_grouped_experts_on_cpu(gloo_world1):
    """`moe_grouped_gemm: true` dry-runs on CPU and builds models/grouped_experts.py's experts (megatron's
    GroupedMLP, with its grouped_gemm package and stacked weights, is never built)."""
    from mindspeed_rl.models.arch_check import model_args
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, transformer_config

    cfg = build_config(compose_yaml(TINY, MOE + ["training.platform=cpu", "training.moe_grouped_gemm=true"]))
    validate(cfg, check_paths=False)
    init_parallel_state(1, 1)
    args = model_args(cfg.actor, 100)
    assert args["moe_grouped_gemm"] is True and transformer_config(args).moe_grouped_gemm is False
    kinds = {type(m).__name__ for n, m in build_gpt_model(args).named_modules() if n.endswith("mlp.experts")}
    assert kinds == {"GroupedExperts"}


def test_glm4_style_routing_dry_runs_and_reaches_the_builder(capsys):
    """Dense first layers, sigmoid scores with the expert bias, groups and a weight scale (GLM-4.5's
    routing, megatron's keys) dry-run, vLLM included (its GLM-4.5), and reach TransformerConfig."""
    from mindspeed_rl.models.builder import moe_config_fields

    over = MOE + ["training.moe_layer_freq=[0,1]", "training.moe_router_score_function=sigmoid",
                  "training.moe_router_enable_expert_bias=true", "training.moe_router_num_groups=2",
                  "training.moe_router_group_topk=1", "training.moe_router_topk_scaling_factor=2.5",
                  f"{A}.rollout_engine=vllm", "training.moe_shared_expert_intermediate_size=64"]
    assert ray_gpt.main(["--config-name", TINY, *over, "dry_run=true"]) == 0, capsys.readouterr().err
    cfg = build_config(compose_yaml(TINY, over))
    fields = moe_config_fields({**cfg.actor.arch.__dict__})
    assert (fields["moe_layer_freq"], fields["moe_router_score_function"], fields["moe_router_enable_expert_bias"],
            fields["moe_router_bias_update_rate"], fields["moe_router_num_groups"], fields["moe_router_group_topk"],
            fields["moe_router_topk_scaling_factor"]) == ([0, 1], "sigmoid", True, 0.0, 2, 1, 2.5)


def test_ernie_style_routing_dry_runs_and_reaches_the_builder(capsys, gloo_world1):
    """Softmax routing with the expert bias (ERNIE 4.5 MoE's, megatron's keys) dry-runs, vLLM included (its
    ERNIE 4.5 MoE), exports as ernie4_5_moe, and builds: megatron's config never sees the bias (it refuses
    it with softmax), every router gets it from models/moe_replay.install_softmax_bias."""
    from mindspeed_rl.models.arch_check import model_args
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, moe_config_fields
    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    over = MOE + ["training.moe_layer_freq=[0,1]", "training.moe_router_enable_expert_bias=true",
                  "training.rotary_interleaved=true", "training.add_qkv_bias=false", f"{A}.rollout_engine=vllm",
                  "training.moe_shared_expert_intermediate_size=128"]
    assert ray_gpt.main(["--config-name", TINY, *over, "dry_run=true"]) == 0, capsys.readouterr().err
    init_parallel_state(1, 1)
    args = model_args(build_config(compose_yaml(TINY, over)).actor, 100)
    fields = moe_config_fields(args)
    assert (fields["moe_router_score_function"], fields["moe_router_enable_expert_bias"]) == ("softmax", False)
    config = hf_config_from_args(args, 100)
    assert (config["model_type"], config["moe_layer_start_index"], config["moe_layer_interval"],
            config["moe_layer_end_index"], config["moe_num_shared_experts"]) == ("ernie4_5_moe", 1, 1, 1, 2)
    model = build_gpt_model(args)
    routers = [layer.mlp.router for layer in model.decoder.layers if hasattr(layer.mlp, "router")]
    assert len(routers) == 1 and routers[0].expert_bias.dtype == torch.float32
    assert "decoder.layers.1.mlp.router.expert_bias" in model.state_dict()
