"""dry_run on every shipped config exits 0 and prints the resolved config and the placement plan."""
from pathlib import Path

import pytest

import ray_gpt
from mindspeed_rl.config import build_config, compose_yaml, load_config
from mindspeed_rl.config.loader import REPO_CONFIG_DIR

SHIPPED = sorted(p.stem for p in REPO_CONFIG_DIR.glob("grpo_trainer_*.yaml"))
USER_CONFIGS = Path(__file__).resolve().parents[2] / "data" / "ray_gpt_configs"


def make_paths(root: Path, cfg) -> None:
    """Create the checkpoint / tokenizer / data paths a config names (relative to `root`)."""
    dirs = [cfg.run.tokenizer_name_or_path] + [r.load for r in (cfg.actor, cfg.ref, cfg.reward)]
    for d in filter(None, dirs):
        (root / d).mkdir(parents=True, exist_ok=True)
    for role in (cfg.actor, cfg.ref):
        if role.load and not role.model_name and not (root / role.load / "config.json").exists():
            # no model file: the architecture must come from the checkpoint's config.json
            import json

            from testing_utils import make_tiny_hf
            make_tiny_hf("llama", str(root / role.load))
            config = root / role.load / "config.json"
            config.write_text(json.dumps(dict(json.loads(config.read_text()), max_position_embeddings=4096)))
    for prefix in filter(None, (cfg.data.data_path, cfg.data.val_data_path)):
        target = root / f"{prefix}_packed_input_ids_document.idx"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
        target.with_suffix(".bin").touch()


def test_ships_the_promised_configs():
    assert {"grpo_trainer_tiny", "grpo_trainer_qwen25_05b", "grpo_trainer_qwen25_15b",
            "grpo_trainer_qwen25_7b", "grpo_trainer_llama32_1b"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_dry_run_shipped(name, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    make_paths(tmp_path, build_config(compose_yaml(name), name))
    assert ray_gpt.main(["--config-name", name, "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "# placement plan" in out and "actor_rollout" in out and "dry_run: the config is valid" in out


def test_the_moe_config_with_vllm_as_its_comment_says_dry_runs(tmp_path, monkeypatch, capsys):
    """grpo_trainer_qwen3_30b_a3b.yaml's comment: the same config generating on vllm-ascend."""
    name, over = "grpo_trainer_qwen3_30b_a3b", ["actor_rollout_ref.actor_rollout.rollout_engine=vllm",
                                                 "actor_rollout_ref.actor_rollout.infer_tensor_parallel_size=4"]
    text = (REPO_CONFIG_DIR / f"{name}.yaml").read_text()
    assert all(o in text for o in over)
    monkeypatch.chdir(tmp_path)
    make_paths(tmp_path, build_config(compose_yaml(name), name))
    assert ray_gpt.main(["--config-name", name, *over, "dry_run=true"]) == 0, capsys.readouterr().err


def test_ray_gpt_user_config_parses(tmp_path, monkeypatch, capsys):
    """A MindSpeed-LLM ray_gpt GRPO config (reward model, Megatron-only keys) from the user's own dir."""
    monkeypatch.chdir(tmp_path)
    cfg = build_config(compose_yaml("grpo_trainer_llama32_1b_rm", config_dir=str(USER_CONFIGS)), "x")
    make_paths(tmp_path, cfg)
    code = ray_gpt.main(["--config-dir", str(USER_CONFIGS), "--config-name", "grpo_trainer_llama32_1b_rm", "dry_run=true"])
    out = capsys.readouterr().out
    assert code == 0
    assert "reward" in out.split("# placement plan")[1]
    assert "MindSpeed switches, used on NPU only" in out and "no effect here" in out


def test_precedence_role_over_training_over_model():
    raw = compose_yaml("grpo_trainer_qwen25_7b", ["training.adam_beta2=0.98"])
    cfg = build_config(raw, "x")
    # model file sets adam_beta2 0.95 < training 0.98 < actor_rollout 0.999
    assert cfg.actor.optim.adam_beta2 == 0.999
    assert cfg.ref.optim.adam_beta2 == 0.98
    # seq_length: model file 4096, training 2048
    assert cfg.run.seq_length == 2048


def test_hyphenated_ray_gpt_keys_and_derived_fields():
    cfg = build_config(compose_yaml("grpo_trainer_tiny", ["++actor_rollout_ref.actor_rollout.max-tokens-to-oom=5000"]), "t")
    assert cfg.actor.rollout.max_tokens_to_oom == 5000
    assert cfg.actor.ppo.clip_ratio_low == cfg.actor.ppo.clip_ratio_high == 0.2
    assert cfg.actor.rollout.max_new_tokens == cfg.run.seq_length - cfg.data.max_prompt_length
    assert cfg.run.output_dir.endswith("t")


def test_load_config_validates(tmp_path):
    cfg = load_config("grpo_trainer_tiny", ["training.train_iters=3"])
    assert cfg.run.train_iters == 3 and cfg.actor.params_dtype == "fp32"


def test_config_key_reference_is_current():
    """docs/config_keys.md is generated from the schema; regenerate with python -m mindspeed_rl.config.docs."""
    from mindspeed_rl.config.docs import render

    assert (REPO_CONFIG_DIR.parents[1] / "docs" / "config_keys.md").read_text() == render()


def test_model_yaml_disagreeing_with_hf_checkpoint(tmp_path, capsys):
    """load: a HF directory whose config.json says intermediate_size 128; the tiny yaml says 256."""
    from testing_utils import make_tiny_hf

    make_tiny_hf("qwen2", str(tmp_path / "hf"))
    code = ray_gpt.main(["--config-name", "grpo_trainer_tiny", f"actor_rollout_ref.actor_rollout.load={tmp_path / 'hf'}",
                         "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2 and "ffn_hidden_size" in err and "config.json" in err and "Traceback" not in err


def _resolved_against(name, config_json, tmp_path, monkeypatch):
    """The shipped experiment `name` with its actor's `load:` directory holding `config_json` (the
    published config.json of its model), resolved against it."""
    import json

    monkeypatch.chdir(tmp_path)
    cfg = build_config(compose_yaml(name), name)
    (tmp_path / cfg.actor.load).mkdir(parents=True)
    (tmp_path / cfg.actor.load / "config.json").write_text(json.dumps(config_json))
    return build_config(compose_yaml(name), name)  # now resolved against config.json


def test_the_deepseek2_lite_model_yaml_agrees_with_its_config_json(tmp_path, monkeypatch):
    """model/deepseek2-lite.yaml, written in MindSpeed-LLM's DeepSeek2-Lite script names (Megatron's MLA
    keys, MindSpeed-LLM's YaRN and MoE keys: first_k_dense_replace, n_shared_experts, beta_fast, ...),
    against DeepSeek-V2-Lite's published config.json: every key it sets means what config.json says, so
    `load:` of the real checkpoint passes the check (a key that disagreed would stop the run naming it)."""
    import dataclasses

    from mindspeed_rl.models.arch_check import check_arch_against_hf
    from testing_utils import DEEPSEEK_V2_LITE

    a = _resolved_against("grpo_trainer_deepseek2_lite", DEEPSEEK_V2_LITE, tmp_path, monkeypatch).actor
    assert {"multi_latent_attention", "qk_pos_emb_head_dim", "moe_shared_expert_intermediate_size",
            "moe_layer_freq", "original_max_position_embeddings"} <= set(a.arch_set)  # from the MindSpeed-LLM names
    assert (a.arch.moe_layer_freq, a.arch.moe_shared_expert_intermediate_size) == ([0] + [1] * 26, 2816)
    check_arch_against_hf(dataclasses.asdict(a.arch), a.load, a.model_name, a.arch_set)


def test_the_gpt_oss_20b_model_yaml_agrees_with_its_config_json(tmp_path, monkeypatch, capsys):
    """model/gpt-oss-20b.yaml, in megatron-core 0.16's gpt-oss names (softmax_type, quick_geglu, ...) and
    MindSpeed-LLM's YaRN names, against gpt-oss-20b's published config.json (its MXFP4 quantization
    included): every key it sets means what config.json says; on NPU the attention sinks are refused in
    one sentence."""
    import dataclasses

    from mindspeed_rl.models.arch_check import check_arch_against_hf
    from testing_utils import GPT_OSS_20B

    name = "grpo_trainer_gpt_oss_20b"
    a = _resolved_against(name, GPT_OSS_20B, tmp_path, monkeypatch).actor
    assert {"softmax_type", "quick_geglu", "activation_func_clamp_value", "window_attn_skip_freq",
            "rope_scaling_truncate", "original_max_position_embeddings"} <= set(a.arch_set)
    check_arch_against_hf(dataclasses.asdict(a.arch), a.load, a.model_name, a.arch_set)
    assert ray_gpt.main(["--config-name", name, "training.platform=npu", "dry_run=true"]) == 2
    assert "softmax_type learnable (gpt-oss's attention sinks) is not supported on npu" in capsys.readouterr().err
