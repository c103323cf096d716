"""Youtu-LLM (model_type youtu: Youtu-LLM-2B and -Base): DeepSeek-V3's multi-latent attention with a dense SwiGLU MLP in
every layer. Read from its config.json (hf_config: MLA_ARCHS), written back as youtu (hf_youtu_config.youtu_config, the
one config.json form a dense MLA model has), and handed to vLLM, which has no Youtu module, as the DeepSeek-V3 whose
every layer is dense (vllm_hf_config.vllm_config). The numbers against transformers are in test_forward_logprobs
(youtu), the native engine's in test_native_engine, the vLLM engine's in tests/vllm/test_vllm_more_archs.py.
"""
from __future__ import annotations

import pytest

from mindspeed_rl.models.hf_config import model_config_from_hf
from mindspeed_rl.models.hf_export_config import hf_config_from_args
from mindspeed_rl.rollout.vllm_hf_config import vllm_config

# tencent/Youtu-LLM-2B's config.json keys as its model card and transformers' YoutuConfig give them (not downloadable
# here); the rest (q_lora_rank 1536, 128 + 64 query / key dimensions, values 128, tied) are YoutuConfig's defaults
YOUTU_2B = {"architectures": ["YoutuForCausalLM"], "model_type": "youtu", "hidden_size": 2048, "intermediate_size": 6144,
            "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "rope_interleave": True, "rope_parameters": {"rope_theta": 1600000, "rope_type": "default"},
            "vocab_size": 128256, "rms_norm_eps": 1e-6, "hidden_act": "silu", "bos_token_id": 128000,
            "eos_token_id": 128001}


def test_release_config_reads_as_dense_multi_latent_attention_and_writes_back_the_same():
    args = model_config_from_hf(YOUTU_2B)
    assert (args["multi_latent_attention"], args["q_lora_rank"], args["kv_lora_rank"], args["qk_head_dim"],
            args["qk_pos_emb_head_dim"], args["v_head_dim"], args["kv_channels"]) == (True, 1536, 512, 128, 64, 128, 128)
    assert (args["num_layers"], args["ffn_hidden_size"], args["rotary_base"], args["max_position_embeddings"]) == \
        (32, 6144, 1600000.0, 131072)  # (max_position_embeddings: YoutuConfig's default)
    assert args["untie_embeddings_and_output_weights"] is False and args["swiglu"] and args["qk_layernorm"]
    assert not args.get("num_experts") and "moe_layer_freq" not in args
    written = hf_config_from_args(args, vocab_size=128256)
    assert (written["model_type"], written["architectures"], written["rope_interleave"]) == \
        ("youtu", ["YoutuForCausalLM"], True)
    assert model_config_from_hf(written) == args
    from transformers import YoutuConfig

    config = YoutuConfig(**written)  # transformers reads what was written as the model it is
    assert (config.q_lora_rank, config.qk_head_dim, config.v_head_dim, config.tie_word_embeddings) == (1536, 192, 128, True)


def test_vllm_is_handed_the_deepseek_v3_whose_every_layer_is_dense():
    served = vllm_config(dict(YOUTU_2B, q_lora_rank=None))
    assert (served["model_type"], served["architectures"]) == ("deepseek_v3", ["DeepseekV3ForCausalLM"])
    assert served["first_k_dense_replace"] == 32 and served["num_nextn_predict_layers"] == 0
    assert served["q_lora_rank"] is None and served["kv_lora_rank"] == 512 and served["tie_word_embeddings"] is True
    # YoutuConfig's defaults where the release leaves a key out (DeepSeek-V3's differ: untied)
    bare = vllm_config({k: v for k, v in YOUTU_2B.items() if k not in ("kv_lora_rank", "v_head_dim")})
    assert bare["kv_lora_rank"] == 512 and bare["v_head_dim"] == 128 and bare["tie_word_embeddings"] is True
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(**{k: v for k, v in served.items() if k not in ("architectures", "model_type")})
    assert config.first_k_dense_replace == config.num_hidden_layers  # vLLM's test for an MoE layer never holds


@pytest.mark.parametrize("change, need", [
    (dict(qk_layernorm=False), "RMSNorms on the compressed query and key / value"),
    (dict(attn_logit_softcapping=50.0), "no multipliers or soft caps"),
    (dict(add_qkv_bias=True), "no biases"),
    (dict(sliding_window=64), "full attention with RoPE in every layer"),
    (dict(swiglu=False, squared_relu=True), "a SwiGLU MLP"),
    (dict(residual_multiplier=0.5), "no multipliers or soft caps"),
])
def test_what_youtu_cannot_say_is_refused(change, need):
    args = dict(model_config_from_hf(YOUTU_2B), **change)
    with pytest.raises(ValueError, match=f"dense model with multi-latent attention has a config.json form only as "
                                         f"Youtu-LLM \\(youtu\\), which needs {need}"):
        hf_config_from_args(args, vocab_size=128256)


@pytest.mark.parametrize("change", [dict(post_norm=True), dict(pre_norm=False), dict(normalization="LayerNorm")])
def test_other_norms_are_refused_by_the_family_that_has_them(change):
    """Norm layouts other models have are refused earlier, naming the one model type that can say them."""
    with pytest.raises(ValueError, match="ha(s|ve) a config.json form (here )?only as"):
        hf_config_from_args(dict(model_config_from_hf(YOUTU_2B), **change), vocab_size=128256)


def test_release_spellings_refused_in_one_sentence():
    with pytest.raises(ValueError, match="rope_interleave false"):
        model_config_from_hf(dict(YOUTU_2B, rope_interleave=False))
    with pytest.raises(ValueError, match="attention_bias=true"):
        model_config_from_hf(dict(YOUTU_2B, attention_bias=True))
