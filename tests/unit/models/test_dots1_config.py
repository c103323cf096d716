"""dots.llm1 (model_type dots1: rednote-hilab/dots.llm1.base / .inst): Qwen3's attention with DeepSeek-V3's MoE, read,
served and exported as the GLM-4.5 it is (hf_config.SAME_AS, hf_moe_config.dots1_config). The numbers against transformers'
Dots1ForCausalLM are in test_forward_logprobs / test_native_engine / test_convert_ckpt (dots1)."""
from __future__ import annotations

import pytest

from mindspeed_rl.models.hf_config import model_config_from_hf, text_model_config
from mindspeed_rl.models.hf_export_config import hf_config_from_args

# dots.llm1's sizes (62 layers of 4608, 32 heads, 128 experts of 1408 with top-6 and 2 shared, the first layer dense)
# as a transformers 4.x config.json spells them (no layer_types; the hub file is not downloadable here)
DOTS1 = {"architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "hidden_size": 4608, "intermediate_size": 10944,
         "moe_intermediate_size": 1408, "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 32,
         "n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
         "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "rms_norm_eps": 1e-5,
         "rope_theta": 10000000.0, "max_position_embeddings": 32768, "sliding_window": None, "max_window_layers": 62,
         "use_sliding_window": False, "tie_word_embeddings": False, "vocab_size": 152064, "hidden_act": "silu"}


def test_read_as_glm4_moe_with_whole_head_rope_and_qk_norms_and_written_back_as_it():
    as_glm = text_model_config(DOTS1)
    assert (as_glm["model_type"], as_glm["architectures"], as_glm["use_qk_norm"]) == \
        ("glm4_moe", ["Glm4MoeForCausalLM"], True)
    args = model_config_from_hf(DOTS1)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_shared_expert_intermediate_size"]) == (128, 6, 2816)
    assert args["qk_layernorm"] and not args["add_qkv_bias"] and "rotary_percent" not in args
    assert (args["moe_router_score_function"], args["moe_router_topk_scaling_factor"]) == ("sigmoid", 2.5)
    assert args["moe_layer_freq"] == [0] + [1] * 61
    written = hf_config_from_args(args, vocab_size=152064)
    assert written["model_type"] == "glm4_moe" and model_config_from_hf(written) == args


def test_dots1_defaults_where_config_json_is_silent():
    """Dots1Config's defaults, not GLM-4.5's: no dense first layers; top-k weights not renormalised, which megatron's
    sigmoid routing cannot do: refused in one sentence (the releases renormalise)."""
    args = model_config_from_hf({k: v for k, v in DOTS1.items() if k != "first_k_dense_replace"})
    assert args.get("moe_layer_freq", 1) in (1, [1] * 62)
    with pytest.raises(ValueError, match="norm_topk_prob false with sigmoid routing"):
        model_config_from_hf({k: v for k, v in DOTS1.items() if k != "norm_topk_prob"})


def test_sliding_window_layers_are_refused_in_one_sentence():
    with pytest.raises(ValueError, match=r"makes layers \[60, 61\] of this dots1 model sliding-window layers .* set "
                                         r"max_window_layers to num_hidden_layers \(62\)"):
        model_config_from_hf(dict(DOTS1, sliding_window=4096, max_window_layers=60, use_sliding_window=True))
    with pytest.raises(ValueError, match=r"makes layers \[0\] of this dots1 model"):
        model_config_from_hf(dict(DOTS1, layer_types=["sliding_attention"] + ["full_attention"] * 61))
