"""The Megatron-LM / MindSpeed-LLM argument vocabulary: its data file, its provenance, its routing.

A MindSpeed-LLM model yaml written with ordinary Megatron-LM argument names parses; each name goes
to our schema, to MindSpeed (NPU), to "no effect, reported once", or, for features that would
change the model and are not implemented, to an error while switched on. Names outside the
vocabulary are errors with a suggestion.
"""
import json
import re

import pytest

import ray_gpt
from mindspeed_rl.config import compat, schema
from mindspeed_rl.config.loader import build_config, compose_yaml

A = "actor_rollout_ref.actor_rollout"


def test_data_file_provenance_and_format():
    data = json.loads(compat.VOCAB_FILE.read_text())
    assert set(data) == {"about", "sources", "names"}
    by_name = {s["name"]: s for s in data["sources"]}
    assert by_name["megatron-lm"]["repo"] == "NVIDIA/Megatron-LM" and by_name["megatron-lm"]["ref"] == "core_v0.12.1"
    assert by_name["megatron-lm"]["paths"] == ["megatron/training/arguments.py"]
    assert by_name["mindspeed-llm"]["repo"] == "Ascend/MindSpeed-LLM"
    assert "mindspeed_llm/training/arguments.py" in by_name["mindspeed-llm"]["paths"]
    assert by_name["mindspeed"]["repo"] == "Ascend/MindSpeed" and by_name["mindspeed"]["ref"] == "v2.3.0_core_r0.12.1"
    assert "mindspeed/arguments.py" in by_name["mindspeed"]["paths"]
    for s in data["sources"]:
        assert re.fullmatch(r"[0-9a-f]{40}", s["commit"]), s
        assert s["count"] == sum(1 for srcs in data["names"].values() if s["name"] in srcs)
    names = data["names"]
    assert list(names) == sorted(names)
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", n) for n in names)
    assert all(srcs and set(srcs) <= set(by_name) for srcs in names.values())
    # well-known names of both, and of the switches the issue named
    for n in ("num_layers", "hidden_size", "rotary_base", "use_flash_attn", "no_masked_softmax_fusion",
              "position_embedding_type", "recompute_granularity", "overlap_grad_reduce", "swiglu"):
        assert n in names, n
    assert len(names) > 700


def test_every_vocabulary_name_has_a_route():
    routes = {n: compat.route(n) for n in compat.vocabulary()["names"]}
    assert None not in routes.values()
    counts = {k: list(routes.values()).count(k) for k in ("schema", "mindspeed", "unsupported", "no_effect")}
    assert all(counts.values()), counts  # every kind occurs
    assert routes["num_layers"] == "schema" and routes["use_flash_attn"] == "mindspeed"
    assert routes["num_experts"] == "schema" and routes["overlap_grad_reduce"] == "no_effect"
    for key in ("recompute_granularity", "recompute_method", "recompute_num_layers", "context_parallel_size",
                "num_layers_per_virtual_pipeline_stage", "sequence_parallel"):  # models/parallel.py
        assert routes[key] == "schema", key
    assert routes["context_parallel_algo"] == "mindspeed"  # forwarded to MindSpeed on NPU
    assert routes["moe_shared_expert_intermediate_size"] == routes["shared_expert_gate"] == "schema"  # Qwen2-MoE
    assert routes["multi_latent_attention"] == "schema" and routes["multi_head_latent_attention"] == "alias"
    assert routes["mtp_num_layers"] == "unsupported"


def test_schema_keys_missing_from_the_vocabulary_are_our_own():
    """Our keys that Megatron does not have are new vocabulary (RL settings), never renamed Megatron keys."""
    ours = schema.all_flat_keys() - set(compat.vocabulary()["names"])
    renamed = {k for k in ours if k.replace("_", "") in {n.replace("_", "") for n in compat.vocabulary()["names"]}}
    assert not renamed, renamed


def test_mindspeed_llm_model_yaml_with_megatron_names(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "tiny_ms.yaml").write_text(
        "tiny_ms:\n  num_layers: 2\n  hidden_size: 64\n  ffn_hidden_size: 128\n  num_attention_heads: 4\n"
        "  max_position_embeddings: 64\n  use_rotary_position_embeddings: true\n  rotary_interleaved: false\n"
        "  apply_rope_fusion: true\n  no_masked_softmax_fusion: true\n  attention_softmax_in_fp32: true\n"
        "  use_flash_attn: true\n  use_fused_rmsnorm: true\n  normalization: RMSNorm\n  swiglu: true\n"
        "  untie_embeddings_and_output_weights: true\n  num_experts: null\n  context_parallel_size: 1\n"
        "  recompute_granularity: full\n  recompute_method: block\n  overlap_grad_reduce: true\n"
        "  use-fused-swiglu: true\n  make-vocab-size-divisible-by: 1\n")
    (tmp_path / "exp.yaml").write_text(
        "defaults:\n  - model:\n    - tiny_ms\n\ntraining:\n  global_batch_size: 2\n  seq_length: 32\n  train_iters: 2\n"
        "  use_distributed_optimizer: true\n  sequence_parallel: false\n  seed: 1\n"
        "actor_rollout_ref:\n  actor_rollout:\n    model: tiny_ms\n    max_prompt_length: 16\n    micro_batch_size: 16\n"
        "reward:\n  verifier: true\nalgorithm:\n  verifier_function: [tiny_repeat]\n")
    code = ray_gpt.main(["--config-dir", str(tmp_path), "--config-name", "exp", "dry_run=true"])
    out, err = capsys.readouterr()
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    for key in ("overlap_grad_reduce", "apply_rope_fusion", "use_rotary_position_embeddings"):
        assert sum(line.startswith(f"note: {key}:") for line in notes) == 1, (key, notes)  # reported once
    assert any("MindSpeed switches" in line and "use_flash_attn" in line and "use_fused_swiglu" in line for line in notes)
    cfg = build_config(compose_yaml("exp", [], str(tmp_path)), "exp")
    assert (cfg.actor.parallel.recompute_granularity, cfg.actor.parallel.recompute_method) == ("full", "block")
    assert cfg.actor.arch.make_vocab_size_divisible_by == 1 and cfg.actor.arch.untie_embeddings_and_output_weights
    assert cfg.actor.arch.rotary_interleaved is False  # a model key now (GLM-4), taken as written
    assert cfg.actor.mindspeed_switches == {"use_flash_attn": True, "use_fused_rmsnorm": True, "use_fused_swiglu": True}


@pytest.mark.parametrize("override,fragments", [
    (f"{A}.mtp_num_layers=1", ["mtp_num_layers` is 1", "multi-token prediction layers are not implemented",
                               "set it to"]),
    (f"{A}.multi_latent_attention=true", ["model tiny: multi_latent_attention needs kv_lora_rank, qk_head_dim, "
                                          "qk_pos_emb_head_dim, v_head_dim", "load a DeepSeek-V3 checkpoint"]),
    (f"{A}.moe_shared_expert_intermediate_size=512", [f"{A}.moe_shared_expert_intermediate_size: 512` describes an "
                                                      "MoE layer's shared expert, but model tiny has no experts"]),
    (f"{A}.context_parallel_size=2", ["context_parallel_size: 2`: context parallelism is not available",
                                      "Transformer Engine", "set it to 1"]),
    (f"{A}.use_alibi_mask=true", ["use_alibi_mask` is True", "ALiBi positions are not implemented"]),
    (f"{A}.recompute_granularty=full", ["not a known key", "did you mean `recompute_granularity`"]),
    ("training.global_batch_sise=4", ["did you mean `global_batch_size`"]),
    (f"{A}.frobnicate_the_model=1", ["frobnicate_the_model` is not a known key"]),
])
def test_outside_or_unsupported(override, fragments, capsys):
    assert ray_gpt.main([override, "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in err, err


def test_no_effect_reason_names_the_source():
    assert "Megatron-LM" in compat.no_effect_reason("overlap_grad_reduce")
    assert compat.no_effect_reason("finetune") == compat.NO_EFFECT_KEYS["finetune"]
    mindspeed_only = [n for n, s in compat.vocabulary()["names"].items() if s == ["mindspeed-llm"] and compat.route(n) == "no_effect"]
    assert mindspeed_only and "MindSpeed-LLM" in compat.no_effect_reason(mindspeed_only[0])
    # MindSpeed's own switches, which MindSpeed-LLM's scripts pass too (its GLM-4.5-Air tuning script:
    # --use-ascend-coc --coc-fused-kernel), parse: forwarded to MindSpeed, or no effect with the source
    assert compat.route("use_ascend_coc") == "mindspeed"
    assert compat.route("coc_fused_kernel") == "no_effect" and "MindSpeed" in compat.no_effect_reason("coc_fused_kernel")
