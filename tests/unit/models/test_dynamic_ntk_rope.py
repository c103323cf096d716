"""Dynamic NTK RoPE (rope type `dynamic` with a factor: InternLM3) and InternLM3's config.json.

transformers computes dynamic NTK as the default RoPE for sequences up to max_position_embeddings and rescales its base
past them; vLLM would scale its max_model_len. The reader takes it as the default RoPE with max_position_embeddings as the
length limit (hf_rope_config.dynamic_ntk_as_default), and the vLLM engine is handed the default RoPE
(vllm_hf_config.without_dynamic_ntk). These tests hold the three to transformers' numbers.
"""
from __future__ import annotations

import pytest
import torch

from mindspeed_rl.models.hf_config import model_config_from_hf
from mindspeed_rl.rollout.vllm_hf_config import vllm_config

# internlm/internlm3-8b-instruct's config.json as published (not downloadable here; its auto_map left out)
INTERNLM3_8B = {"architectures": ["InternLM3ForCausalLM"], "bias": False, "bos_token_id": 1, "eos_token_id": 2,
                "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                "intermediate_size": 10240, "max_position_embeddings": 32768, "model_type": "internlm3",
                "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 2, "pad_token_id": 2,
                "qkv_bias": False, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 6.0, "rope_type": "dynamic"},
                "rope_theta": 50000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
                "vocab_size": 128512}


def _cos(config, positions):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(LlamaConfig(**config))
    x = torch.zeros(1, len(positions), 8)
    cos, _ = rotary(x, torch.tensor([positions]))
    return cos[0]


def test_dynamic_ntk_is_the_default_rope_up_to_max_position_embeddings():
    """transformers' dynamic NTK cos equals the default RoPE's at every position below max_position_embeddings (128
    here), and differs once a sequence passes it: the reader's default RoPE is exact within the limit it sets."""
    base = dict(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=128, rope_theta=10000.0)
    dynamic = dict(base, rope_scaling={"rope_type": "dynamic", "factor": 6.0})
    args = model_config_from_hf(dict(dynamic, model_type="llama", num_hidden_layers=2, intermediate_size=128,
                                     vocab_size=120))
    assert (args["rotary_base"], args["max_position_embeddings"]) == (10000.0, 128)
    assert "rope_scaling_type" not in args
    inside = list(range(128))
    assert torch.equal(_cos(dynamic, inside), _cos(base, inside))
    beyond = list(range(200))
    assert (_cos(dynamic, beyond) - _cos(base, beyond)).abs().max() > 1e-2  # past the limit it rescales


def test_internlm3_release_config_json():
    """InternLM3-8B-Instruct: Llama with head_dim 128, 2 KV heads, theta 5e7, untied, its dynamic NTK read as the default
    RoPE with 32768 positions as the limit; handed to vLLM as Llama (its registry serves InternLM3 so) with the default
    RoPE; biases (qkv_bias / bias) refused in one sentence."""
    args = model_config_from_hf(INTERNLM3_8B)
    assert (args["kv_channels"], args["num_query_groups"], args["rotary_base"], args["max_position_embeddings"],
            args["untie_embeddings_and_output_weights"], args["add_qkv_bias"]) == (128, 2, 5e7, 32768, True, False)
    assert "rope_scaling_type" not in args
    engine = vllm_config(INTERNLM3_8B)
    assert (engine["model_type"], engine["architectures"], engine["head_dim"], engine["attention_bias"]) == (
        "llama", ["LlamaForCausalLM"], 128, False)
    assert engine["rope_scaling"] is None and engine["rope_theta"] == 50000000
    assert model_config_from_hf({k: v for k, v in INTERNLM3_8B.items() if k != "head_dim"})["kv_channels"] == 128
    for key in ("qkv_bias", "bias"):
        with pytest.raises(ValueError, match="qkv_bias / bias true .* not supported for internlm3"):
            model_config_from_hf(dict(INTERNLM3_8B, **{key: True}))


def test_vllm_is_handed_the_default_rope_for_dynamic_ntk_in_both_spellings():
    """transformers 5's rope_parameters keep the theta and other keys (partial rotary) with the default type; 4.x's
    rope_scaling is dropped (its rope_theta stays); an NTK alpha (HunYuan) is left as it is."""
    v5 = {"model_type": "llama", "rope_parameters": {"rope_type": "dynamic", "factor": 6.0, "rope_theta": 5e7,
                                                     "partial_rotary_factor": 0.5}}
    assert vllm_config(v5)["rope_parameters"] == {"rope_type": "default", "rope_theta": 5e7,
                                                   "partial_rotary_factor": 0.5}
    v4 = {"model_type": "llama", "rope_theta": 1e6, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    assert vllm_config(v4) == {"model_type": "llama", "rope_theta": 1e6, "rope_scaling": None}
    alpha = {"model_type": "hunyuan_v1_dense", "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}
    assert vllm_config(alpha) == alpha
    assert v5["rope_parameters"]["rope_type"] == "dynamic"  # the caller's dict is not changed


def test_dynamic_ntk_limit_is_said_before_any_worker(tmp_path, capsys):
    """A prompt + response longer than a dynamic-NTK model's max_position_embeddings is refused in dry_run with why."""
    from pathlib import Path

    import ray_gpt
    from testing_utils import make_tiny_hf

    make_tiny_hf("internlm3", str(tmp_path), max_position_embeddings=24)
    configs = Path(__file__).resolve().parents[2] / "data" / "ray_gpt_configs"
    code = ray_gpt.main(["--config-dir", str(configs), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         f"actor_rollout_ref.actor_rollout.load={tmp_path}", f"actor_rollout_ref.ref.load={tmp_path}",
                         "actor_rollout_ref.actor_rollout.max_new_tokens=16"])
    err = capsys.readouterr().err
    assert code == 2 and ("exceeds max_position_embeddings 24 of model from_checkpoint (its dynamic NTK RoPE is no "
                          "scaling up to that length and is not computed past it); shorten one.") in err, err
