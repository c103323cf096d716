"""MiMo-7B (model_type mimo: XiaomiMiMo/MiMo-7B-Base, -SFT, -RL, -RL-Zero): Qwen2's layers under a model type of its own,
its checkpoint also holding one multi-token-prediction layer (model.mtp_layers.0.*) that GRPO does not train. Read,
served and exported as the Qwen2 it is (hf_config.SAME_AS), without its remote-code auto_map. The numbers against
transformers are in test_forward_logprobs (mimo: a tiny Qwen2 saved as the release stores it, MTP tensors included).
"""
from __future__ import annotations

import pytest

from mindspeed_rl.models.hf_config import model_config_from_hf, text_model_config
from mindspeed_rl.models.hf_export_config import hf_config_from_args
from mindspeed_rl.rollout.vllm_hf_config import vllm_config

# MiMo-7B-RL's config.json keys as the release publishes them (not downloadable here)
MIMO_7B = {"architectures": ["MiMoForCausalLM"], "model_type": "mimo", "attention_bias": True, "attention_dropout": 0.0,
           "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig",
                        "AutoModel": "modeling_mimo.MiMoModel", "AutoModelForCausalLM": "modeling_mimo.MiMoForCausalLM"},
           "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 32768,
           "max_window_layers": 36, "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
           "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-05, "rope_theta": 640000, "sliding_window": 32768,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
           "vocab_size": 151680}


def test_release_config_is_the_qwen2_it_is():
    as_qwen2 = text_model_config(MIMO_7B)
    assert (as_qwen2["model_type"], as_qwen2["architectures"], "auto_map" in as_qwen2) == \
        ("qwen2", ["Qwen2ForCausalLM"], False)
    args = model_config_from_hf(MIMO_7B)
    assert (args["num_layers"], args["hidden_size"], args["num_query_groups"], args["rotary_base"]) == (36, 4096, 8, 640000.0)
    assert args["add_qkv_bias"] and args["untie_embeddings_and_output_weights"] and "sliding_window" not in args
    written = hf_config_from_args(args, vocab_size=151680)
    assert written["model_type"] == "qwen2" and model_config_from_hf(written) == args
    served = vllm_config(as_qwen2)  # vLLM is handed the Qwen2 its layers are (Qwen2ForCausalLM)
    assert (served["model_type"], served["architectures"]) == ("qwen2", ["Qwen2ForCausalLM"])


def test_a_mimo_without_qkv_biases_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match="attention_bias false is not supported for mimo"):
        model_config_from_hf(dict(MIMO_7B, attention_bias=False))
