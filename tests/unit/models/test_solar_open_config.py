"""Solar Open (model_type solar_open: upstage/Solar-Open-100B): Llama's attention with GLM-4.5's MoE in every layer, read,
served and exported as the GLM-4.5 it is (hf_config.SAME_AS, hf_moe_config.solar_open_config). The numbers against
transformers' SolarOpenForCausalLM are in test_forward_logprobs / test_native_engine / test_convert_ckpt (solar_open)."""
from __future__ import annotations

from mindspeed_rl.models.hf_config import model_config_from_hf, text_model_config
from mindspeed_rl.models.hf_export_config import hf_config_from_args

# a config.json as transformers' SolarOpenConfig writes Solar-Open-100B's (its defaults; the hub file is not
# downloadable here): the sizes come from the class, so only what says the model type is given
SOLAR = {"architectures": ["SolarOpenForCausalLM"], "model_type": "solar_open"}


def test_defaults_read_as_glm4_moe_without_qk_norms_and_written_back_as_it():
    as_glm = text_model_config(SOLAR)
    assert (as_glm["model_type"], as_glm["use_qk_norm"], as_glm["first_k_dense_replace"]) == ("glm4_moe", False, 0)
    args = model_config_from_hf(SOLAR)
    assert (args["num_layers"], args["hidden_size"], args["num_attention_heads"], args["num_query_groups"],
            args["kv_channels"]) == (48, 4096, 64, 8, 128)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"],
            args["moe_shared_expert_intermediate_size"]) == (128, 8, 1280, 1280)
    assert not args["qk_layernorm"] and "rotary_percent" not in args and args["rotary_base"] == 1e6
    assert args.get("moe_layer_freq", 1) in (1, [1] * 48) and args["moe_router_score_function"] == "sigmoid"
    written = hf_config_from_args(args, vocab_size=196608)
    assert written["model_type"] == "glm4_moe" and model_config_from_hf(written) == args


def test_partial_rotary_where_rope_parameters_say_it():
    args = model_config_from_hf(dict(SOLAR, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                             "partial_rotary_factor": 0.5}))
    assert args["rotary_percent"] == 0.5
