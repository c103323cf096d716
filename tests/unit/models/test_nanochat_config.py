"""nanochat (model_type nanochat: karpathy/nanochat-d32 and the models nanochat's scripts train, in transformers'
NanoChatForCausalLM form): Llama's layer with weightless RMSNorms (layers, final, per-head q / k, the embeddings), RoPE by
minus the angle, relu(x)^2 without a gate and logits soft-capped at 15 (models/hf_nanochat_config.py, models/nanochat.py).
The numbers against transformers are in test_forward_logprobs / test_native_engine (nanochat: a tiny random one, each of
its pieces checked to matter: without the negated RoPE the logits differ by 0.9, without the embedding norm by 3.5).
"""
from __future__ import annotations

import pytest
import torch

from mindspeed_rl.models.hf_config import model_config_from_hf
from mindspeed_rl.models.hf_export_config import hf_config_from_args

# nanochat-d32's sizes (depth 32, width 64 x depth, heads of 128, 4x MLP, 65536 tokens) as transformers' NanoChatConfig
# writes a config.json (the hub file is not downloadable here)
D32 = {"architectures": ["NanoChatForCausalLM"], "model_type": "nanochat", "hidden_size": 2048,
       "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 16,
       "max_position_embeddings": 2048, "hidden_act": "relu2", "rms_norm_eps": 1e-06,
       "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "final_logit_softcapping": 15.0,
       "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 65527, "eos_token_id": 65531,
       "pad_token_id": 65531, "tie_word_embeddings": False, "vocab_size": 65536, "dtype": "bfloat16"}


def test_d32_reads_as_weightless_norms_negated_rope_and_relu2_and_writes_back_the_same():
    args = model_config_from_hf(D32)
    assert (args["num_layers"], args["hidden_size"], args["ffn_hidden_size"], args["kv_channels"]) == (32, 2048, 8192, 128)
    assert not args["group_query_attention"] and args["untie_embeddings_and_output_weights"]
    assert {k: args[k] for k in ("layernorm_affine", "embedding_norm", "rotary_negated", "qk_layernorm", "swiglu",
                                 "squared_relu", "output_logit_softcapping", "norm_epsilon")} == \
        dict(layernorm_affine=False, embedding_norm=True, rotary_negated=True, qk_layernorm=True, swiglu=False,
             squared_relu=True, output_logit_softcapping=15.0, norm_epsilon=1e-6)
    written = hf_config_from_args(args, vocab_size=65536, dtype=torch.bfloat16)
    assert (written["model_type"], written["architectures"], written["hidden_act"], written["final_logit_softcapping"]) \
        == ("nanochat", ["NanoChatForCausalLM"], "relu2", 15.0)
    assert model_config_from_hf(written) == args


def test_soft_cap_as_config_json_says():
    """Absent: transformers' default 15; null: none (and written back null)."""
    assert model_config_from_hf({k: v for k, v in D32.items() if k != "final_logit_softcapping"})[
        "output_logit_softcapping"] == 15.0
    args = model_config_from_hf(dict(D32, final_logit_softcapping=None))
    assert "output_logit_softcapping" not in args
    assert hf_config_from_args(args, vocab_size=65536)["final_logit_softcapping"] is None


@pytest.mark.parametrize("change,message", [
    ({"attention_bias": True}, "attention_bias=true for nanochat (bias on o_proj) is not supported"),
    ({"hidden_act": "silu"}, "hidden_act 'silu' is not supported for nanochat; only relu2 (squared ReLU)"),
])
def test_what_nanochat_releases_never_have_is_refused_in_one_sentence(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model_config_from_hf(dict(D32, **change))


@pytest.mark.parametrize("change,need", [
    ({"swiglu": True, "squared_relu": False}, "swiglu: false; squared_relu: true"),
    ({"embedding_norm": False}, "embedding_norm: true"),
    ({"rotary_negated": False}, "rotary_negated: true"),
    ({"qk_layernorm": False}, "qk_layernorm: true"),
    ({"add_qkv_bias": True}, "no biases"),
    ({"rotary_percent": 0.5}, "full attention with RoPE on the whole head in every layer"),
])
def test_what_its_config_json_cannot_say_is_refused(change, need):
    args = dict(model_config_from_hf(D32), **change)
    with pytest.raises(ValueError, match="have a config.json form only as nanochat, which needs") as err:
        hf_config_from_args(args, vocab_size=65536)
    assert need in str(err.value)


def test_weightless_rmsnorm_without_the_rest_is_refused_too():
    """layernorm_affine: false on an RMSNorm Llama: no config.json but nanochat's has weightless RMSNorms."""
    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 120}
    args = dict(model_config_from_hf(llama), layernorm_affine=False)
    with pytest.raises(ValueError, match="only as nanochat, which needs swiglu: false; squared_relu: true; qk_layernorm: "
                                         "true; embedding_norm: true; rotary_negated: true"):
        hf_config_from_args(args, vocab_size=120)


def test_weightless_norms_have_no_parameters_and_compute_in_fp32(gloo_world1):
    """Every norm of a built nanochat (final, pre-attention, pre-MLP, per-head q / k) is weightless, and in bf16 each gives
    transformers' NanoChatRMSNorm's bits (x in fp32 times rsqrt(mean(x^2) + eps), cast once)."""
    from transformers.models.nanochat.modeling_nanochat import NanoChatRMSNorm

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state

    args = dict(model_config_from_hf(dict(D32, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=120)),
                padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args, params_dtype=torch.bfloat16)
    assert not [n for n, _ in model.named_parameters() if "norm" in n]
    layer = model.decoder.layers[0]
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16) * 4
    theirs = NanoChatRMSNorm(eps=1e-6)
    for norm in (model.decoder.final_layernorm, layer.input_layernorm, layer.pre_mlp_layernorm):
        assert torch.equal(norm(x), theirs(x))
    q = x.reshape(3, 5, 4, 16)
    assert torch.equal(layer.self_attention.q_layernorm(q), theirs(q))
    assert torch.equal(layer.self_attention.k_layernorm(q), theirs(q))
    assert (model.rotary_pos_emb.inv_freq < 0).all()  # RoPE by minus the angle
