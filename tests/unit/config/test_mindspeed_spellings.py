"""MindSpeed-LLM's own spellings of model keys (config/compat.ALIASES and DERIVED).

A MindSpeed-LLM MoE yaml writes first_k_dense_replace, n_group, topk_group, routed_scaling_factor,
moe_intermediate_size, n_shared_experts, seq_aux, beta_fast, use_glm_rope, ...; before they were
accepted as "no effect" and the model was built without them (all layers MoE, no groups, no
scale). Now each becomes the schema key it means, so the same model results as from Megatron-LM's
names; both spellings with different values in one section, and MindSpeed-LLM model switches that
are not implemented, are refused with one sentence.
"""
import dataclasses
from pathlib import Path

import pytest

import ray_gpt
from mindspeed_rl.config import build_config, compat, compose_yaml, schema
from testing_utils import make_tiny_hf

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "ray_gpt_configs"

TINY = "grpo_trainer_tiny"
A = "actor_rollout_ref.actor_rollout"
MOE = ["training.num_experts=4", "training.moe_router_topk=2", "training.moe_router_score_function=sigmoid",
       "training.moe_router_enable_expert_bias=true"]
# MindSpeed-LLM's names ...
MINDSPEED = ["training.first_k_dense_replace=1", "training.n_group=2", "training.topk_group=1",
             "training.routed_scaling_factor=2.5", "training.moe_intermediate_size=32", "training.n_shared_experts=2",
             "training.seq_aux=true", "training.beta_fast=16", "training.beta_slow=2", "training.use_glm_rope=true",
             "training.rope_scaling_original_max_position_embeddings=1024"]
# ... and Megatron-LM's / ours for the same model (the tiny task has 2 layers)
MEGATRON = ["training.moe_layer_freq=[0,1]", "training.moe_router_num_groups=2", "training.moe_router_group_topk=1",
            "training.moe_router_topk_scaling_factor=2.5", "training.moe_ffn_hidden_size=32",
            "training.moe_shared_expert_intermediate_size=64", "training.moe_router_load_balancing_type=seq_aux_loss",
            "training.rope_scaling_beta_fast=16", "training.rope_scaling_beta_slow=2", "training.rotary_interleaved=true",
            "training.original_max_position_embeddings=1024"]


def _arch(overrides):
    cfg = build_config(compose_yaml(TINY, overrides))
    return cfg, dataclasses.asdict(cfg.actor.arch)


def test_mindspeed_names_build_the_model_megatron_names_build(capsys):
    cfg, ours = _arch(MOE + MINDSPEED)
    _, theirs = _arch(MOE + MEGATRON)
    assert ours == theirs
    a = cfg.actor.arch
    assert (a.moe_layer_freq, a.moe_router_num_groups, a.moe_router_group_topk, a.moe_router_topk_scaling_factor,
            a.moe_ffn_hidden_size, a.moe_shared_expert_intermediate_size, a.moe_router_load_balancing_type,
            a.rope_scaling_beta_fast, a.rotary_interleaved, a.original_max_position_embeddings) == \
        ([0, 1], 2, 1, 2.5, 32, 64, "seq_aux_loss", 16.0, True, 1024)
    assert dataclasses.asdict(cfg.ref.arch) == ours  # every role: the keys sit in `training`
    assert not set(cfg.ignored) & (set(compat.ALIASES) | set(compat.DERIVED))  # none reported as "no effect"
    # where a value came from is the key the user wrote (for arch_check's and validate's sentences)
    assert cfg.actor.arch_set["moe_router_num_groups"] == "training.n_group"
    assert cfg.actor.arch_set["moe_layer_freq"] == "training.first_k_dense_replace"
    assert ray_gpt.main(["--config-name", TINY, *MOE, *MINDSPEED, "dry_run=true"]) == 0, capsys.readouterr().err


def test_first_k_dense_replace_follows_mindspeed_llm_with_an_interval():
    """MindSpeed-LLM: layer i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0."""
    over = MOE + ["training.num_layers=6", "training.first_k_dense_replace=1", "training.moe_layer_freq=2"]
    assert _arch(over)[1]["moe_layer_freq"] == [0, 0, 1, 0, 1, 0]
    # a dense model: the key has no effect there, as in MindSpeed-LLM; 0 means no dense layers
    assert _arch(["training.first_k_dense_replace=1"])[1]["moe_layer_freq"] == 1
    assert _arch(MOE + ["training.first_k_dense_replace=0"])[1]["moe_layer_freq"] == 1


def test_a_later_section_overrides_either_spelling():
    """role > training > model holds across the spellings: the role's megatron name beats training's alias."""
    cfg, _ = _arch(MOE + ["training.n_group=2", "training.topk_group=1", f"{A}.moe_router_num_groups=4"])
    assert cfg.actor.arch.moe_router_num_groups == 4 and cfg.ref.arch.moe_router_num_groups == 2


def test_store_true_switches_false_mean_unset():
    _, arch = _arch(["training.rotary_interleaved=true", "training.use_glm_rope=false", "training.seq_aux=false"])
    assert arch["rotary_interleaved"] is True and arch["moe_router_load_balancing_type"] == "aux_loss"


def test_an_explicit_shared_expert_width_wins_as_in_mindspeed_llm():
    _, arch = _arch(MOE + ["training.n_shared_experts=2", "training.moe_shared_expert_intermediate_size=48"])
    assert arch["moe_shared_expert_intermediate_size"] == 48
    _, arch = _arch(MOE + ["training.n_shared_experts=1"])  # no expert width: ffn_hidden_size, as there
    assert arch["moe_shared_expert_intermediate_size"] == arch["ffn_hidden_size"] == 256


@pytest.mark.parametrize("overrides,fragment", [
    (["training.n_group=2", "training.moe_router_num_groups=4"],
     "`training.n_group: 2` (another name for moe_router_num_groups: 2) disagrees with "
     "`training.moe_router_num_groups: 4`; keep one of the two."),
    (["training.add_bias_linear=true", "training.disable_bias_linear=true"],
     "`training.add_bias_linear: True` (another name for disable_bias_linear: False) disagrees with"),
    (["training.moe_z_loss_coeff=0.001"], "the router z-loss is not implemented"),
    (["training.scale_emb=12"], "MiniCPM's embedding / depth / width scalings are not implemented"),
    (MOE + ["training.first_k_dense_replace=2"], "`training.first_k_dense_replace: 2` leaves no MoE layer among "
                                                 "num_layers 2"),
    (MOE + ["training.first_k_dense_replace=1", "training.moe_layer_freq=[0,1]"],
     "with a list of 0 / 1 per layer drop first_k_dense_replace"),
    (MOE + ["training.first_k_dense_replace=-1"], "`training.first_k_dense_replace` must be an integer of at least 0"),
    (MOE + ["training.seq_aux=true", "training.moe_router_load_balancing_type=sinkhorn"],
     "`training.seq_aux: true` computes the aux loss per sequence"),
    ([f"{A}.multi_head_latent_attention=true", f"{A}.qk_rope_head_dim=64"],
     "model tiny: multi_latent_attention needs kv_lora_rank, qk_head_dim, v_head_dim"),
    (["training.rotary_scaling_factor=40"], "multi-latent attention's YaRN is spelled rope_scaling_type: yarn + "
                                            "rope_scaling_factor here"),
    ([f"{A}.multi_latent_attention=true", f"{A}.kv_lora_rank=16", f"{A}.qk_head_dim=8", f"{A}.qk_pos_emb_head_dim=8",
      f"{A}.v_head_dim=8", f"{A}.rope_scaling_type=yarn", f"{A}.rope_attention_factor=1.2"],
     "model tiny: multi_latent_attention's yarn takes its attention factor from rope_scaling_mscale"),
    (["training.moe_device_level_aux_loss_coeff=0.01"], "DeepSeek-V2's device-level balance loss is not implemented"),
    (["training.no_post_layer_norm=true"], "a model without the final norm is not implemented"),
    (["training.full_attention_interval=4"], "Qwen3-Next's linear-attention layers are not implemented"),
])
def test_refused_with_one_sentence(overrides, fragment, capsys):
    assert ray_gpt.main(["--config-name", TINY, *overrides, "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err, err


def test_off_values_of_the_unsupported_switches_pass():
    cfg, _ = _arch(["training.moe_device_level_aux_loss_coeff=0.0", "training.no_post_layer_norm=false",
                    "training.shared_expert_gate_output_dimension=1", f"{A}.multi_head_latent_attention=false"])
    assert "no_post_layer_norm" in cfg.ignored


def test_megatron_lm_spellings_with_another_value():
    """Megatron-LM's use_rope_scaling (Llama 3.1's scaling) and add_bias_linear; MindSpeed-LLM's
    partial_rotary_factor (0 = none) and query_pre_attn_scalar (Gemma 2)."""
    _, arch = _arch(["training.use_rope_scaling=true", "training.add_bias_linear=true",
                     "training.partial_rotary_factor=0.5", "training.query_pre_attn_scalar=256"])
    assert (arch["rope_scaling_type"], arch["rope_scaling_factor"], arch["disable_bias_linear"],
            arch["rotary_percent"], arch["softmax_scale"]) == ("llama3", 8.0, False, 0.5, 1 / 16)
    _, arch = _arch(["training.use_rope_scaling=false", "training.add_bias_linear=false",
                     "training.partial_rotary_factor=0.0"])
    assert (arch["rope_scaling_type"], arch["disable_bias_linear"], arch["rotary_percent"]) == (None, True, 1.0)


def test_every_alias_is_vocabulary_and_names_a_schema_key():
    names, keys = compat.vocabulary()["names"], schema.all_flat_keys()
    for alias, target in {**compat.ALIASES, **compat.DERIVED}.items():
        assert alias in names and alias not in keys and target in keys, alias
        assert compat.route(alias) == "alias"
    assert set(compat.ALIAS_VALUES) <= set(compat.ALIASES)


@pytest.fixture(scope="module")
def glm4_moe_dir(tmp_path_factory):
    """A tiny GLM-4.5 (first_k_dense_replace 1, 2 layers, n_group 2 / topk_group 1, 1 shared expert)."""
    out = tmp_path_factory.mktemp("glm4_moe")
    make_tiny_hf("glm4_moe", str(out))
    return str(out)


def test_with_a_hf_load_the_missing_sizes_come_from_config_json(glm4_moe_dir, capsys):
    """A MindSpeed-LLM yaml that names only the MoE layout: num_layers and the expert width come from
    config.json; values that agree with it dry-run, one that does not is refused naming the key written."""
    base = ["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
            f"{A}.load={glm4_moe_dir}", f"actor_rollout_ref.ref.load={glm4_moe_dir}"]
    agree = ["training.first_k_dense_replace=1", "training.n_group=2", "training.topk_group=1",
             "training.routed_scaling_factor=1.5", "training.n_shared_experts=1"]
    assert ray_gpt.main([*base, *agree]) == 0, capsys.readouterr().err
    cfg = build_config(compose_yaml("grpo_trainer_hf_any", base[5:] + agree, str(CONFIGS)))
    assert cfg.actor.arch.moe_layer_freq == [0, 1] and cfg.actor.arch.moe_shared_expert_intermediate_size == 32
    assert ray_gpt.main([*base, "training.routed_scaling_factor=2.5"]) == 2
    err = capsys.readouterr().err
    assert "training.routed_scaling_factor is 2.5 but config.json" in err and "says 1.5" in err, err


# MindSpeed-LLM's GLM-4.5-Air tuning script (examples/mcore/glm45-air/tune_glm45_air_4k_full_ptd.sh at
# its master, 2026-11), its model and MoE arguments as a model yaml: the names verbatim, the sizes
# shrunk; alltoall_seq (NPU / CUDA) becomes allgather on CPU and mtp_num_layers (not implemented) 0
GLM45_AIR_MINDSPEED = """glm45_air_tiny:
  moe_grouped_gemm: true
  moe_alltoall_overlap_comm: true
  moe_permutation_async_comm: true
  moe_tp_extend_ep: true
  moe_token_dispatcher_type: allgather
  first_k_dense_replace: 1
  moe_layer_freq: 1
  n_shared_experts: 1
  num_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 32
  moe_router_load_balancing_type: none
  moe_router_num_groups: 1
  moe_router_group_topk: 1
  norm_topk_prob: true
  moe_router_score_function: sigmoid
  moe_router_enable_expert_bias: true
  moe_router_dtype: fp32
  use_flash_attn: true
  use_fused_rmsnorm: true
  use_fused_swiglu: true
  no_masked_softmax_fusion: true
  overlap_grad_reduce: true
  overlap_param_gather: true
  recompute_activation_function: true
  mtp_mem_efficient_logits: true
  reuse_fp32_param: true
  use_ascend_coc: true
  coc_fused_kernel: true
  use_mcore_models: true
  mtp_num_layers: 0
  kv_channels: 16
  num_layers: 3
  hidden_size: 64
  ffn_hidden_size: 128
  num_attention_heads: 4
  make_vocab_size_divisible_by: 1
  group_query_attention: true
  num_query_groups: 2
  disable_bias_linear: true
  add_qkv_bias: true
  position_embedding_type: rope
  rotary_percent: 0.5
  rotary_base: 1000000
  no_rope_fusion: true
  normalization: RMSNorm
  swiglu: true
  norm_epsilon: 1e-05
"""


def test_mindspeed_llm_glm45_air_arguments_dry_run(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "glm45_air_tiny.yaml").write_text(GLM45_AIR_MINDSPEED)
    (tmp_path / "exp.yaml").write_text(
        "defaults:\n  - model:\n    - glm45_air_tiny\n\ntraining:\n  global_batch_size: 2\n  seq_length: 32\n"
        "  train_iters: 2\nactor_rollout_ref:\n  actor_rollout:\n    model: glm45_air_tiny\n    max_prompt_length: 16\n"
        "reward:\n  verifier: true\nalgorithm:\n  verifier_function: [tiny_repeat]\n")
    assert ray_gpt.main(["--config-dir", str(tmp_path), "--config-name", "exp", "dry_run=true"]) == 0, \
        capsys.readouterr().err
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert any(line.startswith("note: coc_fused_kernel:") and "MindSpeed" in line for line in notes), notes
    assert any(line.startswith("note: moe_router_dtype:") and "model's dtype" in line for line in notes), notes
    a = build_config(compose_yaml("exp", [], str(tmp_path)), "exp").actor.arch
    assert (a.moe_layer_freq, a.moe_shared_expert_intermediate_size, a.moe_router_num_groups,
            a.moe_router_score_function, a.rotary_percent) == ([0, 1, 1], 32, 1, "sigmoid", 0.5)
