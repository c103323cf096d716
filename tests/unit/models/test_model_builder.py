"""models.builder: HF config.json -> Megatron args, the transformer config, llama3 rope scaling."""

import math

import pytest
import torch

from mindspeed_rl.models.builder import llama3_inv_freq, model_config_from_hf, transformer_config
from testing_utils import (DEEPSEEK_V2_LITE, DEEPSEEK_V3, GPT_OSS_20B, GRANITE_3B_A800M, GRANITE_4_MICRO, HUNYUAN_7B,
                           HUNYUAN_A13B, MINIMAX_M2, OLMOE_1B_7B, PYTHIA_70M, FALCON_7B, FALCON_40B, OLMO_7B_0424)

LLAMA32_1B = {  # transformers 4.x spelling (rope_theta + rope_scaling)
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "head_dim": 64,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


def test_llama32_config_matches_the_shipped_model_yaml():
    args = model_config_from_hf(LLAMA32_1B)
    assert args == {
        "num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_attention_heads": 32,
        "group_query_attention": True, "num_query_groups": 8, "kv_channels": 64,
        "padded_vocab_size": 128256, "max_position_embeddings": 131072, "rotary_base": 500000.0,
        "normalization": "RMSNorm", "norm_epsilon": 1e-5, "swiglu": True, "add_qkv_bias": False,
        "disable_bias_linear": True, "untie_embeddings_and_output_weights": False,
        "qk_layernorm": False, "position_embedding_type": "rope", "rope_scaling_type": "llama3",
        "rope_scaling_factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}


def test_qwen2_and_qwen3_in_transformers5_spelling():
    qwen2 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
             "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "rms_norm_eps": 1e-6,
             "tie_word_embeddings": True, "use_sliding_window": False}
    args = model_config_from_hf(qwen2)
    assert args["add_qkv_bias"] and not args["qk_layernorm"] and args["rotary_base"] == 1e6
    assert args["kv_channels"] == 64 and args["num_query_groups"] == 2 and "rope_scaling_type" not in args
    qwen3 = dict(qwen2, model_type="qwen3", head_dim=128, tie_word_embeddings=False)
    args = model_config_from_hf(qwen3)
    assert args["qk_layernorm"] and not args["add_qkv_bias"] and args["kv_channels"] == 128
    assert args["untie_embeddings_and_output_weights"]


def test_pythia_config_json_as_released():
    """EleutherAI/pythia-70m's config.json (transformers 4.24: rotary_pct, rotary_emb_base; no rope_parameters) reads
    as GPT-NeoX's layer; its refusals name the key."""
    args = model_config_from_hf(PYTHIA_70M)
    assert (args["rotary_percent"], args["rotary_base"], args["kv_channels"], args["num_query_groups"]) == (0.25, 1e4, 64, 8)
    assert args["parallel_residual"] and args["parallel_residual_mlp_norm"] and not args["openai_gelu"]
    assert not args["swiglu"] and args["add_qkv_bias"] and args["disable_bias_linear"] is False
    assert args["normalization"] == "LayerNorm" and args["norm_epsilon"] == 1e-5 and not args["group_query_attention"]
    assert args["untie_embeddings_and_output_weights"] and args["padded_vocab_size"] == 50304
    neox20b = dict(PYTHIA_70M, hidden_act="gelu_fast", use_parallel_residual=False, num_key_value_heads=2)
    args = model_config_from_hf(neox20b)  # transformers reads no num_key_value_heads for gpt_neox: multi-head
    assert args["openai_gelu"] and not args["parallel_residual"] and args["num_query_groups"] == 8
    v5 = dict(PYTHIA_70M, rope_parameters={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5})
    assert (model_config_from_hf(v5)["rotary_percent"], model_config_from_hf(v5)["rotary_base"]) == (0.5, 5e5)
    with pytest.raises(ValueError, match="attention_bias=false is not supported for gpt_neox"):
        model_config_from_hf(dict(PYTHIA_70M, attention_bias=False))
    with pytest.raises(ValueError, match="hidden_act 'relu' is not supported for gpt_neox"):
        model_config_from_hf(dict(PYTHIA_70M, hidden_act="relu"))


def test_olmo_config_json_and_its_export():
    """OLMo-7B-0424's config.json reads as Llama's layout with LayerNorms without weights (eps 1e-5, not Llama's
    1e-6 default) and its q / k / v clamp; the export from those args writes OLMo's config.json back, and a clamp in a
    model config.json cannot say elsewhere is refused in one sentence."""
    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(OLMO_7B_0424)
    assert (args["normalization"], args["layernorm_affine"], args["norm_epsilon"], args["clip_qkv"]) == \
        ("LayerNorm", False, 1e-5, 8.0)
    assert args["swiglu"] and args["disable_bias_linear"] and not args["add_qkv_bias"] and not args["group_query_attention"]
    written = hf_config_from_args(args, 50304)
    assert (written["model_type"], written["clip_qkv"], written["architectures"]) == ("olmo", 8.0, ["OlmoForCausalLM"])
    assert model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="clip_qkv 8.0 has a config.json form only in an OLMo model"):
        hf_config_from_args(dict(model_config_from_hf(LLAMA32_1B), clip_qkv=8.0), 128256)
    with pytest.raises(ValueError, match="attention_bias=true for olmo"):
        model_config_from_hf(dict(OLMO_7B_0424, attention_bias=True))


def test_falcon_config_json_as_released():
    """Falcon-7B's and Falcon-40B's config.json (transformers 4.27) read as their layers; its old size names
    (n_head, n_layer, n_head_kv) too; ALiBi (Falcon-RW) and another activation are refused naming the key."""
    args = model_config_from_hf(FALCON_7B)
    assert (args["num_query_groups"], args["kv_channels"], args["ffn_hidden_size"]) == (1, 64, 4 * 4544)
    assert args["group_query_attention"] and args["parallel_residual"] and not args["parallel_residual_mlp_norm"]
    assert not args["untie_embeddings_and_output_weights"] and args["disable_bias_linear"] and not args["add_qkv_bias"]
    assert args["normalization"] == "LayerNorm" and not args["swiglu"] and not args["openai_gelu"]
    big = model_config_from_hf(FALCON_40B)
    assert (big["num_query_groups"], big["parallel_residual_mlp_norm"], big["ffn_hidden_size"]) == (8, True, 32768)
    old = {"n_head" if k == "num_attention_heads" else "n_layer" if k == "num_hidden_layers" else
           "n_head_kv" if k == "num_kv_heads" else k: v for k, v in FALCON_40B.items()}
    assert model_config_from_hf(old) == big
    with pytest.raises(ValueError, match="alibi=true .* is not supported"):
        model_config_from_hf(dict(FALCON_7B, alibi=True))
    with pytest.raises(ValueError, match="activation 'gelu_new' is not supported for falcon; only gelu"):
        model_config_from_hf(dict(FALCON_7B, activation="gelu_new"))


@pytest.mark.parametrize("change,match", [
    ({"model_type": "deepseek_v32"}, "model_type .deepseek_v32. is not supported"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "dynamic"}}, "rope type 'dynamic' without a factor is not supported"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 8192}},
     "'dynamic' with original_max_position_embeddings 8192 != max_position_embeddings 131072 is not supported"),
    ({"rope_scaling": {"rope_type": "su", "factor": 4.0}}, "rope type 'su' is not supported; use one of"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is supported for phi3, glm, glm4, glm4_moe, sarvam_moe, stablelm, nemotron, phi, gpt_neox, mellum, minimax_m2, qwen3_5_text and qwen3_next models only, not llama"),
])
def test_unsupported_hf_features_raise(change, match):
    with pytest.raises(ValueError, match=match):
        model_config_from_hf(dict(LLAMA32_1B, **change))


def test_llama3_inv_freq_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=5000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    torch.testing.assert_close(llama3_inv_freq(16, 5000.0, 4.0, 1.0, 4.0, 32), expected.float())


@pytest.mark.parametrize("rope", [
    {"factor": 4.0, "original_max_position_embeddings": 32},
    {"factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    {"factor": 8.0, "original_max_position_embeddings": 512, "mscale": 0.707, "mscale_all_dim": 1.0},
    {"factor": 2.0, "original_max_position_embeddings": 64, "attention_factor": 1.3},
])
def test_yarn_frequencies_and_attention_factor_match_transformers(rope):
    """The inverse frequencies and the cos/sin factor of our YaRN against transformers' own
    (`_compute_yarn_parameters`) over its parameters: betas, truncation, DeepSeek's mscale ratio, a
    given attention factor. The MindSpeed-LLM names round-trip through config.json."""
    from transformers import Qwen2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mindspeed_rl.models.builder import rope_attention_factor, rotary_inv_freq
    from mindspeed_rl.models.hf_export_config import rope_parameters

    params = {"rope_type": "yarn", "rope_theta": 1e6, **rope}
    cfg = Qwen2Config(hidden_size=256, num_attention_heads=2, max_position_embeddings=131072, rope_parameters=params)
    expected, attention = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    args = model_config_from_hf({**LLAMA32_1B, "model_type": "qwen2", "hidden_size": 256, "num_attention_heads": 2,
                                 "head_dim": 128, "rope_scaling": params})
    assert args["rope_scaling_type"] == "yarn" and args["rotary_base"] == 1e6
    torch.testing.assert_close(rotary_inv_freq(args, torch.zeros(64)), expected.float(), rtol=1e-6, atol=0)
    assert rope_attention_factor(args) == pytest.approx(attention, rel=1e-12)
    assert attention != 1.0  # the factor matters in every case here
    again = model_config_from_hf({**LLAMA32_1B, "rope_scaling": rope_parameters(args)})
    assert {k: v for k, v in again.items() if "rope" in k} == {k: v for k, v in args.items() if "rope" in k}


def test_linear_and_longrope_survive_an_export_round_trip():
    """config.json written from Megatron args (yaml-built models) keeps linear and LongRoPE scaling;
    LongRoPE's original length is written as the length limit, so readers keep its short factors."""
    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    linear = model_config_from_hf(dict(LLAMA32_1B, rope_scaling={"rope_type": "linear", "factor": 2.5}))
    assert (linear["rope_scaling_type"], linear["rope_scaling_factor"]) == ("linear", 2.5)
    longrope = dict(linear, rope_scaling_type="longrope", rope_short_factor=[1.5] * 32, rope_attention_factor=1.2,
                    max_position_embeddings=4096)
    for args in (linear, longrope):
        again = model_config_from_hf(hf_config_from_args(args, vocab_size=128256))
        for key in ("rope_scaling_type", "rope_scaling_factor", "rope_short_factor", "rope_attention_factor",
                    "max_position_embeddings"):
            if key in args and (key != "rope_scaling_factor" or args["rope_scaling_type"] == "linear"):
                assert again[key] == args[key], key


def test_partial_rotary_attention_factor_stays_on_the_rotation(gloo_world1, monkeypatch):
    """A longrope / yarn attention factor is softmax_scale x factor^2 with full rotary, rope_mscale
    on the rotation with partial rotary or NoPE layers, and refused with a sentence where the platform rotates
    with a fused kernel that takes no factor (NPU)."""
    from mindspeed_rl.models import builder

    builder.init_parallel_state(1, 1)
    args = dict(model_config_from_hf(LLAMA32_1B), rope_scaling_type="longrope", rope_short_factor=[1.0] * 32,
                rope_attention_factor=1.5)
    full = transformer_config(args)
    assert full.softmax_scale == pytest.approx(1.5 ** 2 / 64 ** 0.5) and full.rope_mscale == 1.0
    partial = transformer_config(dict(args, rotary_percent=0.5))
    assert partial.softmax_scale is None and partial.rope_mscale == 1.5
    monkeypatch.setattr(builder, "own_rotary", lambda name: False)
    with pytest.raises(ValueError, match="rotary_percent 0.5, e.g. Phi-4-mini.* not supported on cpu: its fused"):
        transformer_config(dict(args, rotary_percent=0.5))
    monkeypatch.undo()
    nope = transformer_config(dict(args, no_rope_freq=2))  # SmolLM3 with YaRN: NoPE layers' scores unscaled
    assert nope.softmax_scale is None and nope.rope_mscale == 1.5


def test_transformer_config_from_args(gloo_world1):
    from mindspeed_rl.models.builder import init_parallel_state

    init_parallel_state(1, 1)
    cfg = transformer_config(model_config_from_hf(LLAMA32_1B), params_dtype=torch.bfloat16)
    assert (cfg.num_query_groups, cfg.kv_channels, cfg.gated_linear_unit, cfg.add_bias_linear) == (8, 64, True, False)
    assert cfg.bf16 and cfg.normalization == "RMSNorm" and cfg.layernorm_epsilon == 1e-5
    with pytest.raises(ValueError, match="missing num_layers"):
        transformer_config({"hidden_size": 8, "num_attention_heads": 2, "padded_vocab_size": 16})


def test_reinitialising_parallel_state_shuts_down_the_previous_groups(gloo_world1):
    """megatron's destroy_model_parallel only forgets its groups; torch keeps every one registered,
    each gloo group with 3 threads. A process that re-initialised ~100 times (the unit tests on
    megatron-core 0.16) ran 5,700 threads and starved the Ray tests after it. Re-initialising must
    leave the group count and the thread count where one initialisation left them."""
    import os

    import torch.distributed.distributed_c10d as c10d

    from mindspeed_rl.models.builder import destroy_parallel_state, init_parallel_state

    def threads():
        return len(os.listdir(f"/proc/{os.getpid()}/task"))

    init_parallel_state(1, 1)
    groups, nthreads = len(c10d._world.pg_map), threads()
    assert groups > 1  # megatron made groups, so the check below can see a leak
    for _ in range(3):
        init_parallel_state(1, 1)
        assert len(c10d._world.pg_map) == groups
    assert threads() <= nthreads
    made = groups - 1  # every group but the world
    assert destroy_parallel_state() == made
    assert len(c10d._world.pg_map) == 1 and c10d.GroupMember.WORLD in c10d._world.pg_map
    init_parallel_state(1, 1)  # the usual state for the tests after this one


def test_smollm3_nope_layers_and_no_rope_freq():
    """SmolLM3's no_rope_layers (1 = RoPE; default every 4th layer without) is megatron-core's
    no_rope_freq (1 = no RoPE); an int N means every N-th layer; config.json written from the args
    says it in SmolLM3's spelling, and transformers reads that back."""
    from transformers import SmolLM3Config

    from mindspeed_rl.models.hf_config import no_rope_pattern
    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    smol = dict(LLAMA32_1B, model_type="smollm3", num_hidden_layers=8, rope_scaling=None)
    del smol["tie_word_embeddings"], smol["rope_theta"]  # transformers' defaults: tied, theta 2e6
    args = model_config_from_hf(smol)
    assert args["no_rope_freq"] == [0, 0, 0, 1, 0, 0, 0, 1] == no_rope_pattern(4, 8)
    assert not args["untie_embeddings_and_output_weights"] and args["rotary_base"] == 2e6
    assert model_config_from_hf(dict(smol, no_rope_layers=[1, 0] * 4))["no_rope_freq"] == [0, 1] * 4
    assert "no_rope_freq" not in model_config_from_hf(dict(smol, no_rope_layers=[1] * 8))
    written = hf_config_from_args(dict(args, no_rope_freq=2), vocab_size=128256)
    assert written["model_type"] == "smollm3" and written["no_rope_layers"] == [1, 0] * 4
    assert SmolLM3Config(**{k: v for k, v in written.items() if k != "model_type"}).no_rope_layers == [1, 0] * 4
    assert model_config_from_hf(written)["no_rope_freq"] == [0, 1] * 4
    for bad, match in ((3, "must divide num_layers 8"), ([0, 1], "one 0 or 1 per layer"), ("x", "an integer N")):
        with pytest.raises(ValueError, match=match):
            no_rope_pattern(bad, 8)
    with pytest.raises(ValueError, match="no config.json form for a qwen2 model"):
        hf_config_from_args(dict(args, no_rope_freq=2, add_qkv_bias=True), vocab_size=128256)


def test_granite_multipliers_round_trip_through_config_json():
    """Granite's four scalars: config.json -> MindSpeed-LLM-named args -> config.json (yaml-built
    models export them under Granite's names) -> the same args; transformers reads the export."""
    from transformers import GraniteConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    granite = dict(LLAMA32_1B, model_type="granite", embedding_multiplier=12.0, residual_multiplier=0.22,
                   attention_multiplier=0.015625, logits_scaling=8.0, rope_scaling=None)
    args = model_config_from_hf(granite)
    assert (args["embedding_multiplier_scale"], args["residual_multiplier"], args["output_multiplier_scale"],
            args["softmax_scale"]) == (12.0, 0.22, 0.125, 0.015625)
    written = hf_config_from_args(args, vocab_size=128256)
    assert written["model_type"] == "granite" and written["logits_scaling"] == 8.0
    assert GraniteConfig(**{k: v for k, v in written.items() if k != "model_type"}).residual_multiplier == 0.22
    again = model_config_from_hf(written)
    assert {k: again[k] for k in ("embedding_multiplier_scale", "residual_multiplier", "output_multiplier_scale",
                                  "softmax_scale")} == {k: args[k] for k in ("embedding_multiplier_scale",
                                                                             "residual_multiplier",
                                                                             "output_multiplier_scale", "softmax_scale")}
    with pytest.raises(ValueError, match="attention_bias=true for granite"):
        model_config_from_hf(dict(granite, attention_bias=True))


# gemma-3-1b-it's config.json (transformers 4.50: sliding_window_pattern, rope_local_base_freq)
GEMMA3_1B = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": None,
             "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
             "hidden_size": 1152, "intermediate_size": 6912, "max_position_embeddings": 32768,
             "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
             "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None,
             "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144}


def test_gemma3_config_json_round_trip_and_refusals():
    """Gemma 3 1B's config.json: MindSpeed-LLM's Gemma keys, every 6th layer full attention (the
    others a 512 window with theta 1e4), tied; config.json written from the args (a yaml-built
    model) is Gemma 3's in transformers 5's spelling, transformers reads it, and it reads back to the
    same args; Gemma 3 4B's image-text config.json gives its text model. Gemma keys on another layout
    are refused in one sentence."""
    from transformers import Gemma3TextConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(GEMMA3_1B)
    assert args["window_attn_skip_freq"] == ([1] * 5 + [0]) * 4 + [1, 1]
    assert (args["sliding_window"], args["rope_local_base_freq"], args["rotary_base"]) == (512, 1e4, 1e6)
    assert args["softmax_scale"] == 256 ** -0.5 and not args["untie_embeddings_and_output_weights"]
    assert all(args[k] for k in ("geglu", "add_rmsnorm_offset", "post_norm", "input_embeds_norm", "qk_layernorm"))
    assert not args["swiglu"]
    written = hf_config_from_args(dict(args, softmax_scale=24 ** -0.5), vocab_size=262144)
    assert written["model_type"] == "gemma3_text" and written["query_pre_attn_scalar"] == 24
    read = Gemma3TextConfig(**{k: v for k, v in written.items() if k != "model_type"})
    assert read.layer_types == ["sliding_attention"] * 5 + ["full_attention"] + read.layer_types[6:]
    assert read.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    again = model_config_from_hf(written)
    assert again == dict(args, softmax_scale=again["softmax_scale"]) and again["softmax_scale"] == pytest.approx(24 ** -0.5)
    linear = model_config_from_hf(dict(GEMMA3_1B, rope_scaling={"rope_type": "linear", "factor": 8.0}))  # 4B and up
    assert (linear["rope_scaling_type"], linear["rope_scaling_factor"]) == ("linear", 8.0)
    assert model_config_from_hf(hf_config_from_args(linear, vocab_size=262144)) == linear
    # Gemma 3 4B's image-text config.json: its sparse text_config, completed with transformers' defaults
    image_text = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}, "vision_config": {}}
    four_b = model_config_from_hf(image_text)
    assert (four_b["num_attention_heads"], four_b["num_query_groups"], four_b["kv_channels"], four_b["rotary_base"],
            four_b["rope_local_base_freq"], four_b["rope_scaling_factor"], four_b["sliding_window"]) == \
        (8, 4, 256, 1e6, 1e4, 8.0, 1024)
    assert four_b["window_attn_skip_freq"] == ([1] * 5 + [0]) * 5 + [1] * 4 and four_b["padded_vocab_size"] == 262208
    with pytest.raises(ValueError, match="this model also sets add_qkv_bias"):
        hf_config_from_args(dict(args, add_qkv_bias=True), vocab_size=262144)
    with pytest.raises(ValueError, match="this model lacks input_embeds_norm"):
        hf_config_from_args(dict(args, input_embeds_norm=False), vocab_size=262144)


def test_mistral_small_3_image_text_config_gives_its_text_model():
    """Mistral Small 3.1's config.json (mistral3, Mistral3ForConditionalGeneration): its text_config
    is a Mistral (MistralForCausalLM), untied, its vision tower ignored."""
    from mindspeed_rl.models.hf_config import text_model_config

    small = {"architectures": ["Mistral3ForConditionalGeneration"], "image_token_index": 10, "model_type": "mistral3",
             "text_config": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 32768,
                             "max_position_embeddings": 131072, "model_type": "mistral", "num_attention_heads": 32,
                             "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                             "rope_theta": 1000000000.0, "sliding_window": None, "vocab_size": 131072},
             "vision_config": {"model_type": "pixtral"}, "torch_dtype": "bfloat16"}
    text = text_model_config(small)
    assert (text["model_type"], text["architectures"], text["tie_word_embeddings"]) == \
        ("mistral", ["MistralForCausalLM"], False)
    args = model_config_from_hf(small)
    assert (args["num_layers"], args["hidden_size"], args["num_query_groups"], args["kv_channels"], args["rotary_base"],
            args["padded_vocab_size"]) == (40, 5120, 8, 128, 1e9, 131072)
    assert args["untie_embeddings_and_output_weights"] and "sliding_window" not in args


@pytest.mark.parametrize("release", ["qwen2.5-vl-7b", "qwen3-vl-4b"])
def test_qwen_vl_config_gives_its_text_model(release):
    """config.json in the layouts of Qwen2.5-VL-7B-Instruct (transformers 4.x: the text keys at the top
    level, M-RoPE as rope_scaling type "mrope") and Qwen3-VL-4B-Instruct (a text_config, interleaved
    M-RoPE sections, tied): the text model is a Qwen2 / Qwen3 with the plain RoPE."""
    from mindspeed_rl.models.hf_config import text_model_config

    vision = {"depth": 32, "hidden_size": 1280, "out_hidden_size": 3584}
    if release == "qwen2.5-vl-7b":
        config = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
                  "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 128000,
                  "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
                  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
                  "torch_dtype": "bfloat16", "use_sliding_window": False, "vision_config": vision,
                  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}, "vocab_size": 152064,
                  "image_token_id": 151655, "vision_start_token_id": 151652}
        want = ("qwen2", ["Qwen2ForCausalLM"], False, 28, 3584, 4, 128, 1e6, 152064)
    else:
        config = {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "image_token_id": 151655,
                  "text_config": {"attention_bias": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
                                  "intermediate_size": 9728, "max_position_embeddings": 262144,
                                  "model_type": "qwen3_vl_text", "num_attention_heads": 32, "num_hidden_layers": 36,
                                  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": {
                                      "mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
                                  "rope_theta": 5000000, "tie_word_embeddings": True, "vocab_size": 151936},
                  "tie_word_embeddings": True, "vision_config": vision}
        want = ("qwen3", ["Qwen3ForCausalLM"], True, 36, 2560, 8, 128, 5e6, 151936)
    text = text_model_config(config)
    assert (text["model_type"], text["architectures"], text["tie_word_embeddings"]) == want[:3]
    args = model_config_from_hf(config)
    assert (args["num_layers"], args["hidden_size"], args["num_query_groups"], args["kv_channels"], args["rotary_base"],
            args["padded_vocab_size"]) == want[3:]
    assert "rope_scaling_type" not in args and "sliding_window" not in args
    assert args["add_qkv_bias"] == (release == "qwen2.5-vl-7b") and args["qk_layernorm"] == (release == "qwen3-vl-4b")


def test_exaone4_config_json_hybrid_and_plain():
    """config.json in the layout of EXAONE 4.0 32B's (sliding_window_pattern "LLLG", no layer_types):
    three sliding layers with RoPE, then a full one without; 1.2B's (no sliding_window): every layer
    full, with RoPE. Both: post norms only, per-head q / k norms. A pattern of other letters is refused."""
    big = {"architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "hidden_size": 5120,
           "intermediate_size": 27392, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
           "num_hidden_layers": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
           "rope_scaling": {"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
           "sliding_window": 4096, "sliding_window_pattern": "LLLG", "tie_word_embeddings": False, "vocab_size": 102400}
    args = model_config_from_hf(big)
    assert (args["pre_norm"], args["post_norm"], args["qk_layernorm"]) == (False, True, True)
    assert "qk_layernorm_across_heads" not in args and args["sliding_window"] == 4096
    assert args["window_attn_skip_freq"] == [1, 1, 1, 0] * 16 and args["no_rope_freq"] == [0, 0, 0, 1] * 16
    small = dict(big, num_hidden_layers=30, sliding_window=None, sliding_window_pattern=None)
    args = model_config_from_hf(small)
    assert not ({"window_attn_skip_freq", "no_rope_freq", "sliding_window"} & set(args)) and args["post_norm"]
    with pytest.raises(ValueError, match="sliding_window_pattern 'LLXG' must be a string of L .* e.g. LLLG"):
        model_config_from_hf(dict(big, sliding_window_pattern="LLXG"))


def test_seed_oss_config_json():
    """config.json in the layout of Seed-OSS-36B-Instruct's: q / k / v biases (also when the key is
    left out: SeedOssConfig's default), head_dim 128 != 5120 / 80, no dropout taken; a bias on o_proj
    (attention_out_bias) is refused in one sentence."""
    seed = {"architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss", "attention_bias": True,
            "attention_out_bias": False, "attention_dropout": 0.1, "residual_dropout": 0.1, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 27648, "max_position_embeddings": 524288,
            "num_attention_heads": 80, "num_hidden_layers": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_theta": 10000000.0, "tie_word_embeddings": False, "vocab_size": 155136}
    args = model_config_from_hf(seed)
    assert (args["add_qkv_bias"], args["kv_channels"], args["num_query_groups"], args["rotary_base"]) == (True, 128, 8, 1e7)
    assert "attention_dropout" not in args and "hidden_dropout" not in args
    assert model_config_from_hf({k: v for k, v in seed.items() if k != "attention_bias"})["add_qkv_bias"]
    with pytest.raises(ValueError, match="attention_out_bias=true .* is not supported"):
        model_config_from_hf(dict(seed, attention_out_bias=True))


def test_gemma1_config_json_round_trip():
    """gemma-2b's config.json (hidden_act "gelu", which transformers reads as the tanh GELU): Gemma's
    norms, embedding scale and GeGLU on a pre-norm model, MQA, tied; exported as Gemma 1 and read back."""
    from transformers import GemmaConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    gemma = {"architectures": ["GemmaForCausalLM"], "head_dim": 256, "hidden_act": "gelu", "hidden_size": 2048,
             "intermediate_size": 16384, "max_position_embeddings": 8192, "model_type": "gemma",
             "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1, "rms_norm_eps": 1e-06,
             "rope_theta": 10000.0, "vocab_size": 256000}
    args = model_config_from_hf(gemma)
    assert all(args[k] for k in ("geglu", "add_rmsnorm_offset", "input_embeds_norm")) and not args["swiglu"]
    assert "post_norm" not in args and not args["qk_layernorm"] and not args["untie_embeddings_and_output_weights"]
    written = hf_config_from_args(args, vocab_size=256000)
    assert (written["model_type"], written["architectures"]) == ("gemma", ["GemmaForCausalLM"])
    assert GemmaConfig(**{k: v for k, v in written.items() if k != "model_type"}).num_key_value_heads == 1
    assert model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="only as Gemma 1 .* also sets qk_layernorm"):
        hf_config_from_args(dict(args, qk_layernorm=True), vocab_size=256000)


def test_olmo2_config_json_round_trip():
    """OLMo-2-0425-1B's config.json: norms after attention and MLP only, q / k norms across heads;
    exported as OLMo 2 (transformers reads it) and read back; the keys on another layout are refused."""
    from transformers import Olmo2Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    olmo = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 2048,
            "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2",
            "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False, "vocab_size": 100352}
    args = model_config_from_hf(olmo)
    assert (args["pre_norm"], args["post_norm"], args["qk_layernorm"], args["qk_layernorm_across_heads"]) == \
        (False, True, True, True)
    written = hf_config_from_args(args, vocab_size=100352)
    assert (written["model_type"], written["architectures"]) == ("olmo2", ["Olmo2ForCausalLM"])
    assert Olmo2Config(**{k: v for k, v in written.items() if k != "model_type"}).rope_parameters["rope_theta"] == 5e5
    assert model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="only as OLMo 2 .* this model has pre_norm: true"):
        hf_config_from_args(dict(args, pre_norm=True), vocab_size=100352)


def test_olmo3_config_json_round_trip():
    """A config.json in the layout of OLMo 3 7B's 65k-context releases (transformers 4.57: rope_theta and the full
    layers' YaRN as rope_scaling, three sliding layers of every four): OLMo 2's keys, the window
    pattern, the sliding layers' default rope at the same theta and the full layers' YaRN with its
    attention factor; exported as OLMo 3 (transformers reads the same rotary tables) and read back."""
    from transformers import Olmo3Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    types = (["sliding_attention"] * 3 + ["full_attention"]) * 8
    olmo = {"architectures": ["Olmo3ForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 11008, "layer_types": types, "max_position_embeddings": 65536, "model_type": "olmo3",
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-06,
            "rope_scaling": {"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1, "factor": 8.0,
                             "original_max_position_embeddings": 8192, "rope_type": "yarn"},
            "rope_theta": 500000, "sliding_window": 4096, "tie_word_embeddings": False, "vocab_size": 100278}
    args = model_config_from_hf(olmo)
    assert (args["pre_norm"], args["qk_layernorm_across_heads"], args["sliding_window"]) == (False, True, 4096)
    assert args["window_attn_skip_freq"] == [1, 1, 1, 0] * 8 and args["rope_local_base_freq"] == 5e5
    assert (args["rope_scaling_type"], args["rope_scaling_factor"], args["rope_attention_factor"]) == \
        ("yarn", 8.0, 1.2079441541679836)
    written = hf_config_from_args(args, vocab_size=100278)
    assert (written["model_type"], written["architectures"]) == ("olmo3", ["Olmo3ForCausalLM"])
    assert written["layer_types"] == types and written["sliding_window"] == 4096
    from transformers.models.olmo3.modeling_olmo3 import Olmo3RotaryEmbedding

    ours, theirs = (Olmo3RotaryEmbedding(Olmo3Config(**{k: v for k, v in c.items() if k != "model_type"}))
                    for c in (written, olmo))
    for kind in ("sliding_attention", "full_attention"):
        assert torch.equal(getattr(ours, f"{kind}_inv_freq"), getattr(theirs, f"{kind}_inv_freq")), kind
        assert getattr(ours, f"{kind}_attention_scaling") == getattr(theirs, f"{kind}_attention_scaling"), kind
    assert theirs.full_attention_attention_scaling == 1.2079441541679836 != theirs.sliding_attention_attention_scaling
    assert model_config_from_hf(written) == args
    without = dict(olmo, rope_scaling=None)  # no scaling: one rotary table serves both layer types
    assert "rope_local_base_freq" not in model_config_from_hf(without)


# gemma-2-2b-it's config.json (transformers 4.42: no layer_types, every second layer full)
GEMMA2_2B = {"architectures": ["Gemma2ForCausalLM"], "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
             "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
             "hidden_size": 2304, "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
             "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "query_pre_attn_scalar": 256,
             "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000}


def test_gemma2_config_json_round_trip():
    """Gemma 2 2B's config.json: Gemma's keys without q/k norms or a local theta, even layers sliding
    (4096), its soft caps; the export writes Gemma 2's config.json, which transformers reads and
    which reads back to the same args."""
    from transformers import Gemma2Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(GEMMA2_2B)
    assert args["window_attn_skip_freq"] == [1, 0] * 13 and args["sliding_window"] == 4096
    assert (args["attn_logit_softcapping"], args["output_logit_softcapping"]) == (50.0, 30.0)
    assert not args["qk_layernorm"] and "rope_local_base_freq" not in args and args["rotary_base"] == 1e4
    written = hf_config_from_args(args, vocab_size=256000)
    assert (written["model_type"], written["architectures"]) == ("gemma2", ["Gemma2ForCausalLM"])
    assert Gemma2Config(**{k: v for k, v in written.items() if k != "model_type"}).layer_types[:3] == \
        ["sliding_attention", "full_attention", "sliding_attention"]
    assert model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="also sets rope_local_base_freq without qk_layernorm"):
        hf_config_from_args(dict(args, rope_local_base_freq=1e4), vocab_size=256000)


def test_vaultgemma_config_json_round_trip():
    """VaultGemma (Gemma 2 2B's keys under model_type vaultgemma): Gemma 2 without its norms after attention and MLP; the
    export writes VaultGemma's config.json, which transformers reads and which reads back to the same args; without
    Gemma 2's attention keys (layer types, caps, score scale) the same norms are Gemma 1's."""
    from transformers import VaultGemmaConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(dict(GEMMA2_2B, model_type="vaultgemma", architectures=["VaultGemmaForCausalLM"]))
    assert args == dict(model_config_from_hf(GEMMA2_2B), post_norm=False)
    written = hf_config_from_args(args, vocab_size=256000)
    assert (written["model_type"], written["architectures"]) == ("vaultgemma", ["VaultGemmaForCausalLM"])
    assert VaultGemmaConfig(**{k: v for k, v in written.items() if k != "model_type"}).layer_types[:2] == \
        ["sliding_attention", "full_attention"]
    assert model_config_from_hf(written) == args
    plain = {k: v for k, v in args.items() if k not in ("window_attn_skip_freq", "sliding_window", "softmax_scale",
                                                        "attn_logit_softcapping", "output_logit_softcapping")}
    assert hf_config_from_args(plain, vocab_size=256000)["model_type"] == "gemma"


def test_windowed_moe_exports_as_mixtral_and_variants_do_not_combine():
    """A Megatron checkpoint of a windowed Mixtral (no config.json kept) exports a Mixtral config.json
    with its window (or null), which reads back to the same architecture; Llama variants that
    config.json cannot combine (a window and NoPE layers, an MoE neither Mixtral nor Qwen, partial
    rotary outside Phi-3) are refused in one sentence."""
    from transformers import MixtralConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    mixtral = dict(LLAMA32_1B, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2,
                   sliding_window=4096, rope_scaling=None, tie_word_embeddings=False)
    args = model_config_from_hf(mixtral)
    written = hf_config_from_args(args, vocab_size=128256)
    assert (written["model_type"], written["sliding_window"], written["num_local_experts"]) == ("mixtral", 4096, 4)
    assert MixtralConfig(**{k: v for k, v in written.items() if k != "model_type"}).sliding_window == 4096
    again = model_config_from_hf(written)
    for key in ("sliding_window", "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "norm_topk_prob"):
        assert again[key] == args[key], key
    llama = model_config_from_hf(dict(LLAMA32_1B, rope_scaling=None))
    with pytest.raises(ValueError, match="no_rope_freq and sliding_window have no config.json form for a llama"):
        hf_config_from_args(dict(llama, sliding_window=64, no_rope_freq=4), vocab_size=128256)
    # Mixtral 8x7B v0.1 without its window (v0.1 Instruct and later): Mixtral too, its window null
    no_window = hf_config_from_args(dict(args, sliding_window=None), vocab_size=128256)
    assert (no_window["model_type"], no_window["sliding_window"]) == ("mixtral", None)
    with pytest.raises(ValueError, match="config.json form only as Mixtral .* top-k routing not renormalised"):
        hf_config_from_args(dict(args, norm_topk_prob=False), vocab_size=128256)
    with pytest.raises(ValueError, match="rotary_percent 0.5 has a config.json form only in a Phi-3 model"):
        hf_config_from_args(dict(llama, rotary_percent=0.5, qk_layernorm=True), vocab_size=128256)


def test_arcee_config_json_round_trip():
    """An Arcee config.json of AFM-4.5B's kind (relu2 MLP without a gate, YaRN x 20 over 4096 original
    positions, GQA, head_dim 128): squared_relu with swiglu off; exported from the args as Arcee again
    and read back the same; another activation, or an MLP without a gate that is not squared ReLU,
    has no config.json form (one sentence each)."""
    from transformers import ArceeConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    afm = {"architectures": ["ArceeForCausalLM"], "model_type": "arcee", "hidden_act": "relu2", "hidden_size": 2560,
           "intermediate_size": 18432, "num_hidden_layers": 36, "num_attention_heads": 20, "num_key_value_heads": 4,
           "head_dim": 128, "max_position_embeddings": 65536, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
           "rope_scaling": {"type": "yarn", "factor": 20.0, "original_max_position_embeddings": 4096},
           "tie_word_embeddings": False, "vocab_size": 128004}
    args = model_config_from_hf(afm)
    assert (args["swiglu"], args["squared_relu"], args["rope_scaling_type"], args["kv_channels"]) == (False, True, "yarn", 128)
    written = hf_config_from_args(args, vocab_size=128004)
    assert (written["model_type"], written["architectures"], written["hidden_act"]) == ("arcee", ["ArceeForCausalLM"], "relu2")
    assert model_config_from_hf(written) == args
    assert ArceeConfig(**written).hidden_act == "relu2"
    with pytest.raises(ValueError, match="hidden_act 'silu' is not supported for arcee; only relu2 \\(squared ReLU\\)"):
        model_config_from_hf(dict(afm, hidden_act="silu"))
    with pytest.raises(ValueError, match="an MLP without a gate has a config.json form only in an Arcee model .* "
                                         "this one is a llama with a GELU MLP"):
        hf_config_from_args(dict(args, squared_relu=False), vocab_size=128004)


def test_deepseek_v3_config_json_round_trip():
    """DeepSeek-V3's config.json (61 layers, the first 3 dense, multi-latent attention with YaRN x 40, 256
    experts in 8 groups) and Moonlight's (no query rank, plain RoPE): the args, exported as DeepSeek-V3
    again and read back the same, transformers and vLLM's routing keys written; what the engines would
    read differently is one sentence each."""
    from transformers import DeepseekV3Config

    from mindspeed_rl.models.builder import mla_softmax_scale
    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(DEEPSEEK_V3)
    assert (args["multi_latent_attention"], args["q_lora_rank"], args["kv_lora_rank"], args["qk_head_dim"],
            args["qk_pos_emb_head_dim"], args["v_head_dim"], args["kv_channels"]) == (True, 1536, 512, 128, 64, 128, 128)
    assert (args["group_query_attention"], args["moe_layer_freq"], args["rope_scaling_type"],
            args["original_max_position_embeddings"]) == (False, [0] * 3 + [1] * 58, "yarn", 4096)
    # transformers' scale of the scores: 192^-1/2 x (0.1 ln 40 + 1)^2
    assert mla_softmax_scale(args) == pytest.approx(192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)
    written = hf_config_from_args(args, vocab_size=129280)
    assert (written["model_type"], written["scoring_func"], written["topk_method"]) == ("deepseek_v3", "sigmoid", "noaux_tc")
    assert model_config_from_hf(written) == args
    assert DeepseekV3Config(**written).q_lora_rank == 1536
    moonlight = dict(DEEPSEEK_V3, q_lora_rank=None, rope_scaling=None, rope_theta=50000, first_k_dense_replace=1,
                     n_group=1, topk_group=1, n_routed_experts=64, num_experts_per_tok=6, routed_scaling_factor=2.446)
    margs = model_config_from_hf(moonlight)
    assert margs["q_lora_rank"] is None and "rope_scaling_type" not in margs and mla_softmax_scale(margs) == 192 ** -0.5
    assert model_config_from_hf(hf_config_from_args(margs, vocab_size=129280)) == margs
    with pytest.raises(ValueError, match="rope_interleave false .* is not supported for deepseek_v3"):
        model_config_from_hf(dict(DEEPSEEK_V3, rope_interleave=False))
    with pytest.raises(ValueError, match="scoring_func 'softmax' / topk_method 'noaux_tc' is not DeepSeek-V3's"):
        model_config_from_hf(dict(DEEPSEEK_V3, scoring_func="softmax"))
    # without experts: Youtu-LLM's config.json (the one form of a dense MLA model; tests/unit/models/test_youtu_config.py)
    dense = {k: v for k, v in args.items() if k != "num_experts"}
    assert hf_config_from_args(dense, vocab_size=129280)["model_type"] == "youtu"


def test_deepseek_v2_config_json_round_trip():
    """DeepSeek-V2-Lite's config.json (MLA without a query rank, softmax routing not renormalised, the
    first layer dense): read, exported as DeepSeek-V2 and read back the same; DeepSeek-V2's own group
    ranking (best score per group, 3 of 8 groups for 6 experts) and a renormalising config are refused."""
    from transformers import DeepseekV2Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(DEEPSEEK_V2_LITE)
    assert (args["q_lora_rank"], args["norm_topk_prob"], args["moe_layer_freq"][:2], args["num_experts"],
            args["moe_shared_expert_intermediate_size"]) == (None, False, [0, 1], 64, 2816)
    assert "moe_router_score_function" not in args and "moe_router_num_groups" not in args
    written = hf_config_from_args(args, vocab_size=102400)
    assert (written["model_type"], written["scoring_func"], written["topk_method"], written["norm_topk_prob"]) == \
        ("deepseek_v2", "softmax", "greedy", False)
    assert model_config_from_hf(written) == args
    assert DeepseekV2Config(**written).n_routed_experts == 64
    v2 = dict(DEEPSEEK_V2_LITE, n_group=8, topk_group=3, topk_method="group_limited_greedy", routed_scaling_factor=16.0)
    with pytest.raises(ValueError, match="group_limited_greedy with n_group 8 / topk_group 3 and num_experts_per_tok 6 "
                                         "is not supported"):
        model_config_from_hf(v2)
    grouped = model_config_from_hf(dict(v2, topk_group=6))
    assert (grouped["moe_router_num_groups"], grouped["moe_router_group_topk"],
            grouped["moe_router_topk_scaling_factor"]) == (8, 6, 16.0)
    assert hf_config_from_args(grouped, vocab_size=102400)["topk_method"] == "group_limited_greedy"
    with pytest.raises(ValueError, match="norm_topk_prob true for deepseek_v2"):
        model_config_from_hf(dict(DEEPSEEK_V2_LITE, norm_topk_prob=True))


def test_gpt_oss_config_json_round_trip():
    """gpt-oss-20b's config.json (24 layers alternating a 128-token window and full attention, 32 experts
    of which 4 per token, attention sinks, biases, YaRN x 32 without rounding): the args in megatron-core
    0.16's gpt-oss names, exported as gpt-oss again and read back the same; what config.json cannot say,
    and a swiglu_alpha other than 1.702, are one sentence each."""
    from transformers import GptOssConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(GPT_OSS_20B)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"],
            args["kv_channels"], args["num_query_groups"]) == (32, 4, 2880, True, 64, 8)
    assert (args["softmax_type"], args["quick_geglu"], args["glu_linear_offset"], args["activation_func_clamp_value"],
            args["disable_bias_linear"], args["add_qkv_bias"]) == ("learnable", True, 1.0, 7.0, False, True)
    assert (args["sliding_window"], args["window_attn_skip_freq"]) == (128, [1, 0] * 12)
    assert (args["rope_scaling_type"], args["rope_scaling_factor"], args["rope_scaling_truncate"],
            args["original_max_position_embeddings"], args["rotary_base"]) == ("yarn", 32.0, False, 4096, 150000.0)
    written = hf_config_from_args(args, vocab_size=201088)
    assert (written["model_type"], written["architectures"]) == ("gpt_oss", ["GptOssForCausalLM"])
    assert model_config_from_hf(written) == args
    assert GptOssConfig(**written).layer_types == GPT_OSS_20B["layer_types"]
    with pytest.raises(ValueError, match="swiglu_alpha 1.5 is not supported"):
        model_config_from_hf(dict(GPT_OSS_20B, swiglu_alpha=1.5))
    with pytest.raises(ValueError, match="a config.json form only as gpt-oss, which needs biases on every linear layer"):
        hf_config_from_args(dict(args, disable_bias_linear=True), vocab_size=201088)


def test_minimax_m2_config_json_round_trip():
    """MiniMax-M2's config.json (62 MoE layers of 256 experts, 8 per token, sigmoid routing with the expert
    bias; q / k norms across the 48 query and 8 key heads; RoPE on rotary_dim 64 of 128; its FP8 release;
    three MTP modules): the args, exported as MiniMax-M2 again (with the keys vLLM reads) and read back the
    same; what transformers does not compute and what config.json cannot say are one sentence each."""
    from transformers import MiniMaxM2Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(MINIMAX_M2)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"],
            args["kv_channels"], args["num_query_groups"]) == (256, 8, 1536, True, 128, 8)
    assert (args["moe_router_score_function"], args["moe_router_enable_expert_bias"], args["qk_layernorm"],
            args["qk_layernorm_across_heads"], args["rotary_percent"], args["rotary_base"]) == (
                "sigmoid", True, True, True, 0.5, 5e6)
    assert "pre_norm" not in args and "moe_layer_freq" not in args and "sliding_window" not in args
    written = hf_config_from_args(args, vocab_size=200064)
    assert (written["model_type"], written["architectures"], written["rotary_dim"], written["scoring_func"],
            written["use_routing_bias"], written["num_mtp_modules"]) == (
                "minimax_m2", ["MiniMaxM2ForCausalLM"], 64, "sigmoid", True, 0)
    assert model_config_from_hf(written) == args
    assert MiniMaxM2Config(**written).rope_parameters["partial_rotary_factor"] == 0.5
    for change, match in ((dict(attn_type_list=[0] + [1] * 61), r"linear-attention layers \(0 at layers \[0\]\)"),
                          (dict(scoring_func="softmax"), "scoring_func 'softmax'"),
                          (dict(use_routing_bias=False), "use_routing_bias False"),
                          (dict(use_qk_norm=False), "use_qk_norm False .transformers always has q / k norms."),
                          (dict(shared_intermediate_size=512), "shared_intermediate_size 512"),
                          (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [64, 64]}),
                           "weight_block_size \\[64, 64\\]")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(MINIMAX_M2, **change))
    with pytest.raises(ValueError, match="only as MiniMax-M2 .minimax_m2., which needs sigmoid routing"):
        hf_config_from_args(dict(args, moe_router_score_function="softmax"), vocab_size=200064)
    with pytest.raises(ValueError, match="only as MiniMax-M2 .minimax_m2., which needs every layer an MoE layer"):
        hf_config_from_args(dict(args, moe_layer_freq=[0] + [1] * 61), vocab_size=200064)



# exported from args: read back with these keys changed, which the model does not compute with (Qwen3-Next's dense
# width where every layer is MoE, written as Qwen3.5-MoE's, which has none)
EXPORT_UNUSED = {"qwen3_next": {"ffn_hidden_size"}}


def test_every_architecture_exported_from_its_args_reads_back_the_same():
    """The export from megatron's args (hf_config_from_args: convert_ckpt and save_hf of a model built from a yaml)
    for every tiny test model and variant: the config.json it writes is read back as the same args, or the export is
    refused in one sentence. A config.json that read back as other args would be another model; ERNIE 4.5's args were
    written as a Llama so until 2026-11-29 (its interleaved RoPE lost), and EXAONE 4.0's refused. EXAONE 4.0 (1.2B's
    layout too: every layer full with RoPE) as transformers takes it; NoPE on a sliding layer, which it cannot say, is
    refused in one sentence."""
    from transformers import Exaone4Config

    import testing_utils

    from mindspeed_rl.models.hf_config import HF_ARCHS
    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    image_text = ("gemma3", "mistral3", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")  # text models
    for arch in (*HF_ARCHS, *testing_utils.HF_VARIANTS, *image_text):
        config = testing_utils.make_tiny_hf(arch.split("-")[0], None, config_only=True,
                                            **testing_utils.HF_VARIANTS.get(arch, {}))
        args = model_config_from_hf(config)
        back = model_config_from_hf(hf_config_from_args(args, vocab_size=120))
        changed = {k for k in set(args) | set(back) if args.get(k) != back.get(k)}
        assert changed <= EXPORT_UNUSED.get(arch, set()), (arch, {k: (args.get(k), back.get(k)) for k in changed})
    full = model_config_from_hf(testing_utils.make_tiny_hf("exaone4", None, config_only=True, sliding_window=None,
                                                           layer_types=["full_attention"] * 2))
    assert "window_attn_skip_freq" not in full and "no_rope_freq" not in full
    written = hf_config_from_args(full, vocab_size=120)
    assert model_config_from_hf(written) == full and Exaone4Config(**written).sliding_window is None
    hybrid = model_config_from_hf(testing_utils.make_tiny_hf("exaone4", None, config_only=True))
    assert hybrid["no_rope_freq"] == [0, 1]
    with pytest.raises(ValueError, match="only as EXAONE 4.0 .exaone4., which needs RoPE in every layer without windows, "
                                         "or in the sliding layers only"):
        hf_config_from_args(dict(hybrid, no_rope_freq=[1, 1]), vocab_size=120)


def test_interleaved_rope_models_config_json_round_trip():
    """RoPE on interleaved pairs (rotary_interleaved) in a dense model: ERNIE 4.5's config.json (every dimension, no
    biases), GLM-4's (glm: glm-4-9b-hf's q / k / v biases and half of each head rotated) and GLM-4-0414's (glm4: with
    norms after attention and MLP) are written from the args and read back the same, and transformers takes them.
    The ERNIE 4.5 args were exported as a Llama before (2026-11-29): Llama turns pairs (i, i + d/2), another model.
    An MoE model with it and no expert bias, and a layout none of the three can say, are refused in one sentence."""
    from transformers import Ernie4_5Config, Glm4Config, GlmConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    for config, want in ((Ernie4_5Config(), "ernie4_5"), (GlmConfig(), "glm"), (Glm4Config(), "glm4")):
        args = model_config_from_hf(config.to_dict())
        assert args["rotary_interleaved"] and args.get("rotary_percent", 1.0) == (1.0 if want == "ernie4_5" else 0.5)
        written = hf_config_from_args(args, vocab_size=config.vocab_size)
        assert written["model_type"] == want and model_config_from_hf(written) == args, want
        type(config)(**written)
    glm = model_config_from_hf(GlmConfig().to_dict())
    assert glm["add_qkv_bias"] and "post_norm" not in glm
    assert hf_config_from_args(dict(glm, add_qkv_bias=False), vocab_size=151552)["model_type"] == "glm"  # partial
    with pytest.raises(ValueError, match="rotary_interleaved in a mixture of experts has a config.json form only as "
                                         "ERNIE 4.5 MoE"):
        hf_config_from_args(dict(glm, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64, norm_topk_prob=True),
                            vocab_size=151552)
    with pytest.raises(ValueError, match="only as GLM-4 .glm / glm4. or ERNIE 4.5 .ernie4_5., which need plain RMSNorms"):
        hf_config_from_args(dict(glm, qk_layernorm=True), vocab_size=151552)


def test_granite_moe_and_granite_4_config_json_round_trip():
    """Granite 3.1 3B-A800M's config.json (granitemoe: 40 experts 512 wide, 8 per token, Mixtral's routing, Granite's
    four scalars) and, with a shared MLP, granitemoeshared's: the args, exported as the same model type and read
    back the same. Granite 4.0 Micro's (granitemoehybrid, every layer attention, no experts) is Granite's dense
    model with its shared_mlp as the MLP (exported as granite, the same math); other position embeddings than RoPE /
    NoPE and layer kinds other than attention / Mamba-2 (the -H models: test_granite_4_h_config_json_round_trip) are
    refused in one sentence, as is an export Granite MoE cannot say."""
    from transformers import GraniteConfig, GraniteMoeSharedConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(GRANITE_3B_A800M)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"],
            args["embedding_multiplier_scale"], args["residual_multiplier"], args["output_multiplier_scale"],
            args["softmax_scale"]) == (40, 8, 512, True, 12.0, 0.22, 1 / 6.0, 0.015625)
    assert "moe_shared_expert_intermediate_size" not in args and not args["untie_embeddings_and_output_weights"]
    written = hf_config_from_args(args, vocab_size=49155)
    assert (written["model_type"], written["architectures"]) == ("granitemoe", ["GraniteMoeForCausalLM"])
    assert model_config_from_hf(written) == args
    shared_hf = dict(GRANITE_3B_A800M, model_type="granitemoeshared", shared_intermediate_size=1024)
    shared = model_config_from_hf(shared_hf)
    assert shared == dict(args, moe_shared_expert_intermediate_size=1024) and "shared_expert_gate" not in shared
    written = hf_config_from_args(shared, vocab_size=49155)
    assert (written["model_type"], GraniteMoeSharedConfig(**written).shared_intermediate_size) == ("granitemoeshared", 1024)
    assert model_config_from_hf(written) == shared
    micro = model_config_from_hf(GRANITE_4_MICRO)
    assert (micro["ffn_hidden_size"], micro["num_layers"], micro["rotary_base"], micro["embedding_multiplier_scale"],
            micro["output_multiplier_scale"]) == (8192, 40, 1e7, 12.0, 0.1)
    assert "num_experts" not in micro
    written = hf_config_from_args(micro, vocab_size=100352)
    assert written["model_type"] == "granite" and model_config_from_hf(written) == micro
    assert GraniteConfig(**written).intermediate_size == 8192
    with_experts = model_config_from_hf(dict(GRANITE_4_MICRO, num_local_experts=4, num_experts_per_tok=2,
                                             intermediate_size=256))
    assert (with_experts["num_experts"], with_experts["moe_ffn_hidden_size"],
            with_experts["moe_shared_expert_intermediate_size"]) == (4, 256, 8192)
    for change, match in ((dict(position_embedding_type="alibi"), "position_embedding_type 'alibi' of a granitemoehybrid"),
                          (dict(layer_types=["attention"] * 39 + ["cross"]), "layer_types must name mamba or attention"),
                          (dict(attention_bias=True), "attention_bias=true for granitemoehybrid")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(GRANITE_4_MICRO, **change))
    with pytest.raises(ValueError, match="only as Granite MoE .granitemoe / granitemoeshared., which needs a shared "
                                         "expert without a gate"):
        hf_config_from_args(dict(shared, shared_expert_gate=True), vocab_size=49155)
    with pytest.raises(ValueError, match="which needs softmax routing with the top-k renormalised"):
        hf_config_from_args(dict(args, norm_topk_prob=False), vocab_size=49155)


def test_olmoe_and_flex_olmo_config_json_round_trip():
    """OLMoE-1B-7B's config.json (16 layers of 64 experts 1024 wide, 8 per token, softmax routing not
    renormalised; q / k norms across the 16 heads under pre-norms; eps 1e-5) and FlexOlmo's (transformers'
    defaults: OLMo 2's layers with 7 experts): the args, exported as the same model type and read back the same;
    clip_qkv and attention_bias, which the layers do not compute, are refused in one sentence."""
    from transformers import FlexOlmoConfig, OlmoeConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(OLMOE_1B_7B)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"],
            args["qk_layernorm"], args["qk_layernorm_across_heads"], args["norm_epsilon"]) == (
                64, 8, 1024, False, True, True, 1e-5)
    assert "pre_norm" not in args and "moe_router_score_function" not in args and "moe_layer_freq" not in args
    written = hf_config_from_args(args, vocab_size=50304)
    assert (written["model_type"], written["architectures"], written["clip_qkv"]) == ("olmoe", ["OlmoeForCausalLM"], None)
    assert model_config_from_hf(written) == args
    assert OlmoeConfig(**written).intermediate_size == 1024
    flex = model_config_from_hf(FlexOlmoConfig().to_dict())
    assert (flex["pre_norm"], flex["post_norm"], flex["num_experts"], flex["moe_router_topk"], flex["rotary_base"]) == (
        False, True, 7, 5, 5e5)
    written = hf_config_from_args(flex, vocab_size=100352)
    assert (written["model_type"], written["architectures"]) == ("flex_olmo", ["FlexOlmoForCausalLM"])
    assert model_config_from_hf(written) == flex
    for change, match in ((dict(clip_qkv=8.0), "clip_qkv 8.0 .queries, keys and values clamped"),
                          (dict(attention_bias=True), "attention_bias=true for olmoe")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(OLMOE_1B_7B, **change))
    with pytest.raises(ValueError, match="only as OLMoE .olmoe. or FlexOlmo .flex_olmo., which need every layer an MoE"):
        hf_config_from_args(dict(args, moe_layer_freq=[0] + [1] * 15), vocab_size=50304)
    with pytest.raises(ValueError, match="which need qk_layernorm, and post_norm exactly when pre_norm is false"):
        hf_config_from_args(dict(args, post_norm=True), vocab_size=50304)


def test_hunyuan_config_json_round_trip():
    """Hunyuan-7B-Instruct's config.json (its keys as published: per-head q / k norms after RoPE, head_dim 128,
    NTK alpha 1000 labelled dynamic, with its unused YaRN-style keys): the default RoPE at theta x alpha^(128 / 126),
    as transformers' HunYuan computes it; exported as HunYuan with that theta and read back the same; dynamic NTK
    without an alpha (generic dynamic NTK) is the default RoPE at the config's theta, and the RoPE variants the
    position turn does not take are refused."""
    from transformers import HunYuanDenseV1Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(HUNYUAN_7B)
    assert (args["qk_layernorm"], args["qk_layernorm_after_rope"], args["kv_channels"], args["num_query_groups"]) == (
        True, True, 128, 8)
    assert args["rotary_base"] == pytest.approx(10000.0 * 1000.0 ** (128 / 126)) and "rope_scaling_type" not in args
    written = hf_config_from_args(args, vocab_size=128167)
    assert (written["model_type"], written["architectures"]) == ("hunyuan_v1_dense", ["HunYuanDenseV1ForCausalLM"])
    assert model_config_from_hf(written) == args
    assert HunYuanDenseV1Config(**written).rope_parameters["rope_type"] == "default"
    generic = model_config_from_hf(dict(HUNYUAN_7B, rope_scaling={"type": "dynamic", "factor": 2.0}))
    assert generic["rotary_base"] == 10000.0 and "rope_scaling_type" not in generic
    with pytest.raises(ValueError, match="only as HunYuan .hunyuan_v1_dense.*which has no sliding_window"):
        hf_config_from_args(dict(args, sliding_window=16), vocab_size=128167)


def test_hunyuan_moe_config_json_round_trip():
    """Hunyuan-A13B's config.json (64 experts, 8 per token, one shared MLP, all 3072 wide, listed per layer): every
    layer MoE with a shared expert as wide as the experts, renormalised softmax routing; exported as HunYuan-MoE
    and read back the same; what transformers does not build is one sentence each."""
    from transformers import HunYuanMoEV1Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(HUNYUAN_A13B)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"],
            args["moe_shared_expert_intermediate_size"], args["norm_topk_prob"], args["qk_layernorm_after_rope"]) == (
                64, 8, 3072, 3072, True, True)
    assert "shared_expert_gate" not in args and "moe_layer_freq" not in args
    written = hf_config_from_args(args, vocab_size=128167)
    assert (written["model_type"], written["architectures"], written["moe_topk"]) == (
        "hunyuan_v1_moe", ["HunYuanMoEV1ForCausalLM"], 8)
    assert model_config_from_hf(written) == args
    assert HunYuanMoEV1Config(**written).num_local_experts == 64
    for change, match in ((dict(moe_topk=[8] * 31 + [4]), "moe_topk .* differs between layers"),
                          (dict(moe_intermediate_size=[1536] * 32), "moe_intermediate_size .* experts intermediate_size"),
                          (dict(num_shared_expert=[2] * 32), "num_shared_expert .* one shared MLP"),
                          (dict(use_mixed_mlp_moe=False), "use_mixed_mlp_moe false"),
                          (dict(use_cla=True), "use_cla true .transformers builds no cross-layer attention")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(HUNYUAN_A13B, **change))
    with pytest.raises(ValueError, match="MoE other than HunYuan-MoE's"):
        hf_config_from_args(dict(args, moe_shared_expert_intermediate_size=1024), vocab_size=128167)

def test_glm4_moe_lite_config_json():
    """GLM-4.7-Flash's config.json (transformers' Glm4MoeLiteConfig defaults are the release's: 47 layers, the
    first dense, 64 experts of which 4 per token plus one shared, sigmoid routing with the expert bias, weights
    x 1.8, multi-latent attention with query rank 768 and 256-wide values): DeepSeek-V3's args; exported from
    args as DeepSeek-V3 (the same model) and read back the same; mlp_layer_types that are not dense layers first,
    or that disagree with first_k_dense_replace (vLLM reads that one), are one sentence each."""
    from transformers import Glm4MoeLiteConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    flash = Glm4MoeLiteConfig().to_dict()
    args = model_config_from_hf(flash)
    assert (args["num_layers"], args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"],
            args["moe_router_topk_scaling_factor"], args["moe_shared_expert_intermediate_size"]) == (47, 64, 4, 1536, 1.8, 1536)
    assert args["moe_layer_freq"] == [0] + [1] * 46 and args["moe_router_score_function"] == "sigmoid"
    assert (args["multi_latent_attention"], args["q_lora_rank"], args["kv_lora_rank"], args["qk_head_dim"],
            args["qk_pos_emb_head_dim"], args["v_head_dim"]) == (True, 768, 512, 192, 64, 256)
    assert model_config_from_hf({k: v for k, v in flash.items() if k != "q_lora_rank"})["q_lora_rank"] == 768
    written = hf_config_from_args(args, vocab_size=154880)
    assert written["model_type"] == "deepseek_v3" and model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="mlp_layer_types .* 'dense' ones first"):
        model_config_from_hf(dict(flash, mlp_layer_types=["sparse", "dense"] + ["sparse"] * 45))
    with pytest.raises(ValueError, match="first_k_dense_replace 3 disagrees with mlp_layer_types .1 dense layers first."):
        model_config_from_hf(dict(flash, first_k_dense_replace=3))


def test_glm4_moe_config_json_round_trip():
    """GLM-4.5-Air's config.json (46 layers, the first dense, 128 experts of which 8 per token plus
    one shared, sigmoid routing with the expert bias, partial rotary 0.5, q / k / v biases, an MTP
    layer): the args, exported from them as GLM-4.5 again and read back the same; what megatron's
    group ranking cannot reproduce, and what config.json cannot say, are one sentence each."""
    from transformers import Glm4MoeConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    air = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
           "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
           "intermediate_size": 10944, "max_position_embeddings": 131072, "moe_intermediate_size": 1408,
           "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True,
           "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46, "num_key_value_heads": 8,
           "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
           "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": False,
           "vocab_size": 151552}
    args = model_config_from_hf(air)
    assert args["moe_layer_freq"] == [0] + [1] * 45 and args["moe_shared_expert_intermediate_size"] == 1408
    assert (args["moe_router_score_function"], args["moe_router_enable_expert_bias"], args["rotary_percent"],
            args["add_qkv_bias"], args["qk_layernorm"], args["kv_channels"]) == ("sigmoid", True, 0.5, True, False, 128)
    assert "moe_router_num_groups" not in args and "moe_router_topk_scaling_factor" not in args
    written = hf_config_from_args(args, vocab_size=151552)
    assert (written["model_type"], written["first_k_dense_replace"], written["n_shared_experts"]) == ("glm4_moe", 1, 1)
    assert model_config_from_hf(written) == args
    assert Glm4MoeConfig(**written).n_routed_experts == 128
    grouped = model_config_from_hf(dict(air, n_group=8, topk_group=4, routed_scaling_factor=2.5))
    assert (grouped["moe_router_num_groups"], grouped["moe_router_group_topk"],
            grouped["moe_router_topk_scaling_factor"]) == (8, 4, 2.5)
    with pytest.raises(ValueError, match="n_group 8 / topk_group 2 with num_experts_per_tok 8 is not supported"):
        model_config_from_hf(dict(air, n_group=8, topk_group=2))
    with pytest.raises(ValueError, match="norm_topk_prob false with sigmoid routing"):
        model_config_from_hf(dict(air, norm_topk_prob=False))
    with pytest.raises(ValueError, match="has a config.json form only as GLM-4.5 .* MoE layers after the first dense"):
        hf_config_from_args(dict(args, moe_layer_freq=[1, 0] * 23), vocab_size=151552)


def test_ernie4_5_moe_config_json_round_trip():
    """ERNIE 4.5 MoE's config.json (transformers' Ernie4_5_MoeConfig defaults are ERNIE-4.5-21B-A3B's: 28 layers,
    the first dense, 64 experts of which 6 per token plus 2 shared of width 1536, 20 query and 4 key heads of 128,
    tied): the args, with the releases' moe_layer_end_index left out (-1: the last layer) and as transformers
    writes it (27); exported as ERNIE 4.5 MoE again and read back the same; other placements (every second layer
    from the third, an end before the last) read and written back; what config.json cannot say refused."""
    from transformers import Ernie4_5_MoeConfig

    from mindspeed_rl.models.hf_export_config import ernie_moe_placement, hf_config_from_args

    release = Ernie4_5_MoeConfig().to_dict()
    assert release["moe_layer_end_index"] == 27  # transformers resolves the default -1
    bare = {k: v for k, v in release.items() if k != "moe_layer_end_index"}
    args = model_config_from_hf(bare)
    assert model_config_from_hf(release) == args
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"],
            args["moe_shared_expert_intermediate_size"], args["kv_channels"], args["num_query_groups"]) == (
                64, 6, 1536, True, 3072, 128, 4)
    assert (args["moe_router_score_function"], args["moe_router_enable_expert_bias"], args["rotary_interleaved"],
            args["moe_layer_freq"], args["untie_embeddings_and_output_weights"], args["rotary_base"]) == (
                "softmax", True, True, [0] + [1] * 27, False, 500000.0)
    written = hf_config_from_args(args, vocab_size=103424)
    assert (written["model_type"], written["architectures"], written["moe_layer_start_index"],
            written["moe_layer_interval"], written["moe_layer_end_index"], written["moe_num_shared_experts"]) == (
                "ernie4_5_moe", ["Ernie4_5_MoeForCausalLM"], 1, 1, 27, 2)
    assert model_config_from_hf(written) == args
    Ernie4_5_MoeConfig(**written)  # transformers takes it
    other = model_config_from_hf(dict(bare, moe_layer_start_index=2, moe_layer_interval=2, moe_layer_end_index=20))
    assert other["moe_layer_freq"] == [1 if i % 2 and 2 <= i <= 20 else 0 for i in range(28)]
    assert model_config_from_hf(hf_config_from_args(other, vocab_size=103424)) == other
    assert ernie_moe_placement([0, 1, 1, 0, 1]) is None
    with pytest.raises(ValueError, match="config.json form only as ERNIE 4.5 MoE .ernie4_5_moe., which needs MoE layers "
                                         "every N-th between a first and a last one"):
        hf_config_from_args(dict(args, moe_layer_freq=[0, 1, 1, 0] + [1] * 24), vocab_size=103424)
    with pytest.raises(ValueError, match="which needs the top-k renormalised"):
        hf_config_from_args(dict(args, norm_topk_prob=False), vocab_size=103424)
    with pytest.raises(ValueError, match="leave no MoE layer of 28"):
        model_config_from_hf(dict(bare, moe_layer_start_index=30))
    with pytest.raises(ValueError, match="use_bias=true"):
        model_config_from_hf(dict(bare, use_bias=True))


def test_apertus_config_json_round_trip():
    """Apertus's config.json (transformers' ApertusConfig defaults are Apertus-8B's: xIELU, llama3 rope x 8 at
    theta 1.2e7 over 8192 original positions, 32 heads): an MLP without a gate with xIELU, per-head q / k norms;
    without rope keys at all, the llama3 scaling transformers assumes; exported as Apertus again (from megatron's
    args alone) and read back the same; what config.json cannot say refused."""
    from transformers import ApertusConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    release = ApertusConfig().to_dict()
    args = model_config_from_hf(release)
    assert (args["swiglu"], args["xielu"], args["qk_layernorm"], args["rope_scaling_type"], args["rope_scaling_factor"],
            args["rotary_base"], args["original_max_position_embeddings"]) == (
                False, True, True, "llama3", 8.0, 1.2e7, 8192)
    bare = {k: v for k, v in release.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    assert model_config_from_hf(bare) == args
    written = hf_config_from_args(args, vocab_size=131072)
    assert (written["model_type"], written["architectures"], written["hidden_act"]) == (
        "apertus", ["ApertusForCausalLM"], "xielu")
    assert model_config_from_hf(written) == args
    ApertusConfig(**written)  # transformers takes it
    with pytest.raises(ValueError, match="an xIELU MLP has a config.json form only in an Apertus model"):
        hf_config_from_args(dict(args, qk_layernorm=False), vocab_size=131072)
    with pytest.raises(ValueError, match="hidden_act 'silu' is not supported for apertus; only xielu"):
        model_config_from_hf(dict(release, hidden_act="silu"))


def test_qwen3_5_config_json_round_trip():
    """Qwen3.5's config.json (transformers' Qwen3_5TextConfig defaults are Qwen3.5-9B's sizes: every fourth
    layer attention, Gated DeltaNet 16 key / 32 value heads of 128, RoPE on a quarter of 256): read from the
    text config and from the image-text one (its M-RoPE sections dropped: the 1-D RoPE on text), exported as
    qwen3_5_text from megatron's args alone and read back the same; what config.json cannot say refused."""
    from transformers import Qwen3_5Config, Qwen3_5TextConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    text = Qwen3_5TextConfig().to_dict()
    args = model_config_from_hf(text)
    assert args["linear_attention_layers"] == [1, 1, 1, 0] * 8
    assert (args["attention_output_gate"], args["add_rmsnorm_offset"], args["qk_layernorm"], args["rotary_percent"],
            args["kv_channels"], args["linear_num_key_heads"], args["linear_num_value_heads"],
            args["linear_key_head_dim"], args["linear_value_head_dim"], args["linear_conv_kernel_dim"]) == (
                True, True, True, 0.25, 256, 16, 32, 128, 128, 4)
    image_text = Qwen3_5Config(text_config={"rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                                                "partial_rotary_factor": 0.25,
                                                                "mrope_section": [11, 11, 10],
                                                                "mrope_interleaved": True}}).to_dict()
    from_image_text = model_config_from_hf(image_text)
    assert from_image_text == dict(args, rotary_base=1e7)
    no_types = {k: v for k, v in text.items() if k != "layer_types"}
    assert model_config_from_hf(dict(no_types, full_attention_interval=2))["linear_attention_layers"] == [1, 0] * 16
    written = hf_config_from_args(args, vocab_size=248320)
    assert (written["model_type"], written["architectures"]) == ("qwen3_5_text", ["Qwen3_5ForCausalLM"])
    assert model_config_from_hf(written) == args
    Qwen3_5TextConfig(**written)  # transformers takes it
    with pytest.raises(ValueError, match="a config.json form only as Qwen3.5 .* this model has add_qkv_bias set"):
        hf_config_from_args(dict(args, add_qkv_bias=True), vocab_size=248320)
    with pytest.raises(ValueError, match="layer_types must name linear_attention or full_attention for each of 32"):
        model_config_from_hf(dict(text, layer_types=["linear_attention"] * 31 + ["sliding_attention"]))


def test_qwen3_5_moe_config_json_round_trip():
    """Qwen3.5-MoE's config.json (transformers' Qwen3_5MoeTextConfig defaults are Qwen3.5-35B-A3B's: 256 experts
    of 512, top-8, a gated shared expert of 512, no dense MLP width): Qwen2-MoE's experts, the top-k always
    renormalised (config.json has no key for it); exported as qwen3_5_moe_text and read back the same."""
    from transformers import Qwen3_5MoeTextConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(Qwen3_5MoeTextConfig().to_dict())
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"],
            args["moe_shared_expert_intermediate_size"], args["shared_expert_gate"], args["num_layers"]) == (
                256, 8, 512, True, 512, True, 40)
    assert args["linear_attention_layers"] == [1, 1, 1, 0] * 10 and args["attention_output_gate"]
    written = hf_config_from_args(args, vocab_size=248320)
    assert (written["model_type"], written["architectures"]) == ("qwen3_5_moe_text", ["Qwen3_5MoeForCausalLM"])
    assert "intermediate_size" not in written
    assert model_config_from_hf(written) == args
    Qwen3_5MoeTextConfig(**written)
    # the top-k not renormalised, or dense layers: Qwen3-Next's form (below)
    assert hf_config_from_args(dict(args, norm_topk_prob=False), vocab_size=248320)["model_type"] == "qwen3_next"
    with pytest.raises(ValueError, match="this model has no gated shared expert"):
        hf_config_from_args(dict(args, shared_expert_gate=False), vocab_size=248320)


def test_qwen3_next_config_json_round_trip():
    """Qwen3-Next's config.json (transformers' Qwen3NextConfig defaults are Qwen3-Next-80B-A3B's: 48 layers, every
    fourth attention, 512 experts of 512, top-10 renormalised, a gated shared expert): Qwen3.5-MoE's layers; dense
    layers where mlp_only_layers / decoder_sparse_step put them (as transformers builds them), intermediate_size
    wide; exported as qwen3_next from megatron's args alone where Qwen3.5-MoE cannot say it, and read back the same."""
    from transformers import Qwen3MoeConfig, Qwen3NextConfig, Qwen3NextForCausalLM

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(Qwen3NextConfig().to_dict())
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"],
            args["moe_shared_expert_intermediate_size"], args["shared_expert_gate"], args["num_layers"]) == (
                512, 10, 512, True, 512, True, 48)
    assert args["linear_attention_layers"] == [1, 1, 1, 0] * 12 and "moe_layer_freq" not in args
    sparse = Qwen3NextConfig(num_hidden_layers=8, mlp_only_layers=[0], decoder_sparse_step=2, norm_topk_prob=False)
    args = model_config_from_hf(sparse.to_dict())
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**dict(sparse.to_dict(), hidden_size=16, num_attention_heads=2,
                                                        num_key_value_heads=1, head_dim=8, linear_num_key_heads=1,
                                                        linear_num_value_heads=1, num_experts=2, vocab_size=8)))
    assert args["moe_layer_freq"] == [int(type(layer.mlp).__name__.endswith("SparseMoeBlock"))
                                      for layer in model.model.layers] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert (args["ffn_hidden_size"], args["norm_topk_prob"]) == (5632, False)
    written = hf_config_from_args(args, vocab_size=151936)
    assert (written["model_type"], written["architectures"]) == ("qwen3_next", ["Qwen3NextForCausalLM"])
    assert written["mlp_only_layers"] == [0, 2, 4, 6] and model_config_from_hf(written) == args
    Qwen3NextConfig(**written)
    qwen3_moe = model_config_from_hf(Qwen3MoeConfig(num_hidden_layers=4, mlp_only_layers=[1]).to_dict())
    assert qwen3_moe["moe_layer_freq"] == [1, 0, 1, 1]  # Qwen3-MoE / Qwen2-MoE place dense layers the same way
    written = hf_config_from_args(qwen3_moe, vocab_size=151936)
    assert (written["model_type"], written["mlp_only_layers"]) == ("qwen3_moe", [1])
    assert model_config_from_hf(written) == qwen3_moe
    with pytest.raises(ValueError, match="mlp_only_layers .* must name layers 0 ... 7"):
        model_config_from_hf(dict(sparse.to_dict(), mlp_only_layers=[8]))
    with pytest.raises(ValueError, match="leave no MoE layer of 8"):
        model_config_from_hf(dict(sparse.to_dict(), decoder_sparse_step=9))


def _granite_4_h(**overrides):
    """Granite 4.0-H-1B's layout (40 layers: Mamba-2 but for attention without RoPE at four of them; 48 Mamba
    heads of 64 over one group of state 128; a dense shared MLP), as transformers 5 writes its config.json."""
    from transformers import GraniteMoeHybridConfig

    kinds = ["attention" if i in (10, 13, 27, 37) else "mamba" for i in range(40)]
    return GraniteMoeHybridConfig(**{
        "hidden_size": 1536, "num_hidden_layers": 40, "num_attention_heads": 12, "num_key_value_heads": 4,
        "intermediate_size": 4096, "shared_intermediate_size": 4096, "num_local_experts": 0, "vocab_size": 100352,
        "layer_types": kinds, "position_embedding_type": "nope", "mamba_n_heads": 48, "mamba_d_head": 64,
        "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_expand": 2, "mamba_chunk_size": 256,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
        "logits_scaling": 6.0, "tie_word_embeddings": True, **overrides}).to_dict()


# NVIDIA-Nemotron-Nano-9B-v2's config.json as published (remote-code era: hybrid_override_pattern, no layers_block_type;
# JSON's Infinity read by json.load as float("inf")); its 56 layers: 27 Mamba-2, 4 attention, 25 MLP
NEMOTRON_NANO_9B_V2 = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "attention_bias": False, "bos_token_id": 1,
    "chunk_size": 128, "conv_kernel": 4, "eos_token_id": 12, "head_dim": 128, "hidden_size": 4480,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", "intermediate_size": 15680,
    "layer_norm_epsilon": 1e-05, "mamba_head_dim": 80, "mamba_hidden_act": "silu", "mamba_num_heads": 128,
    "mamba_proj_bias": False, "max_position_embeddings": 131072, "mlp_bias": False, "mlp_hidden_act": "relu2",
    "n_groups": 8, "num_attention_heads": 40, "num_hidden_layers": 56, "num_key_value_heads": 8, "pad_token_id": 0,
    "residual_in_fp32": False, "rescale_prenorm_residual": True, "sliding_window": None, "ssm_state_size": 128,
    "tie_word_embeddings": False, "time_step_limit": [0.0, float("inf")], "time_step_min": 0.001, "time_step_max": 0.1,
    "use_bias": False, "use_conv_bias": True, "vocab_size": 131072}


def test_nemotron_h_config_json_round_trip():
    """Nemotron-H: one block per layer from hybrid_override_pattern (the releases) or layers_block_type (transformers 5
    writes it), the Mamba-2 sizes under its own keys, the MLP without a gate (squared ReLU), attention without RoPE;
    exported from megatron's args alone as nemotron_h and read back the same, transformers taking it; what the
    releases do not have refused in one sentence."""
    from transformers import NemotronHConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(NEMOTRON_NANO_9B_V2)
    pattern = NEMOTRON_NANO_9B_V2["hybrid_override_pattern"]
    assert args["hybrid_override_pattern"] == pattern and args["num_layers"] == 56
    assert args["mamba_layers"] == [int(c == "M") for c in pattern] and args["no_rope_freq"] == [1] * 56
    assert (args["mamba_num_heads"], args["mamba_head_dim"], args["mamba_num_groups"], args["mamba_state_dim"],
            args["mamba_conv_kernel"], args["mamba_chunk_size"], args["kv_channels"], args["num_query_groups"],
            args["ffn_hidden_size"], args["squared_relu"], args["swiglu"], args["norm_epsilon"]) == (
                128, 80, 8, 128, 4, 128, 128, 8, 15680, True, False, 1e-5)
    written = hf_config_from_args(args, vocab_size=131072)
    assert (written["model_type"], written["architectures"], written["layers_block_type"][:3]) == (
        "nemotron_h", ["NemotronHForCausalLM"], ["linear_attention", "mlp", "linear_attention"])
    assert model_config_from_hf(written) == args
    config = NemotronHConfig(**written)  # transformers takes it, with the same layers
    assert config.hybrid_override_pattern == pattern and config.mamba_num_heads * config.mamba_head_dim == 10240
    as_saved = {k: v for k, v in config.to_dict().items() if k != "hybrid_override_pattern"}  # transformers 5's
    assert model_config_from_hf(as_saved) == args
    for key, value, match in (("use_bias", True, "use_bias=true"), ("mlp_bias", True, "mlp_bias=true"),
                              ("time_step_limit", [0.001, 0.1], "time_step_limit \\[0.001, 0.1\\] is not supported"),
                              ("hybrid_override_pattern", "M-X", "hybrid_override_pattern has 'X'"),
                              ("mamba_hidden_act", "gelu", "mamba_hidden_act 'gelu'"),
                              ("tie_word_embeddings", True, "ties lm_head to the embedding")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(NEMOTRON_NANO_9B_V2, **{key: value}))
    # MoE layers (Nemotron 3 Nano's kind): DeepSeek-V3's routing, one shared expert without a gate
    moe = dict(NEMOTRON_NANO_9B_V2, hybrid_override_pattern=pattern.replace("-", "E"), n_routed_experts=128,
               num_experts_per_tok=6, moe_intermediate_size=1856, moe_shared_expert_intermediate_size=3712,
               n_shared_experts=1, routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True)
    moe_args = model_config_from_hf(moe)
    assert moe_args["moe_layer_freq"] == [int(c == "-") for c in pattern] and (
        moe_args["num_experts"], moe_args["moe_router_topk"], moe_args["moe_ffn_hidden_size"],
        moe_args["moe_shared_expert_intermediate_size"], moe_args["moe_router_score_function"],
        moe_args["moe_router_enable_expert_bias"], moe_args["moe_router_topk_scaling_factor"]) == (
            128, 6, 1856, 3712, "sigmoid", True, 2.5)
    assert model_config_from_hf(hf_config_from_args(moe_args, vocab_size=131072)) == moe_args
    for key, value, match in (("moe_latent_size", 1024, "moe_latent_size 1024"), ("n_shared_experts", 2,
                                                                                  "n_shared_experts 2"),
                              ("norm_topk_prob", False, "norm_topk_prob false")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(moe, **{key: value}))
    with pytest.raises(ValueError, match="relu\\(up\\)\\^2 without a gate"):
        hf_config_from_args(dict(args, squared_relu=False, swiglu=True), vocab_size=131072)
    with pytest.raises(ValueError, match="without RoPE"):
        hf_config_from_args(dict(args, no_rope_freq=[0] * 56), vocab_size=131072)
    with pytest.raises(ValueError, match="its own lm_head"):
        hf_config_from_args(dict(args, untie_embeddings_and_output_weights=False), vocab_size=131072)


def test_granite_4_h_config_json_round_trip():
    """Granite 4.0-H: the Mamba-2 layers and sizes read from config.json (layer_types as transformers 5 writes them,
    linear_attention / full_attention; the time-step limit's infinity as {"__float__": "Infinity"}), attention
    without RoPE as no_rope_freq on every layer; exported from megatron's args alone as granitemoehybrid and read
    back the same, transformers taking it; with experts (Granite 4.0-H-Tiny's layout) too; what config.json cannot
    say refused in one sentence."""
    from transformers import GraniteMoeHybridConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    release = _granite_4_h()
    assert release["time_step_limit"][1] == {"__float__": "Infinity"} or release["time_step_limit"][1] == float("inf")
    args = model_config_from_hf(release)
    marks = [0 if i in (10, 13, 27, 37) else 1 for i in range(40)]
    assert args["mamba_layers"] == marks and args["no_rope_freq"] == [1] * 40
    assert (args["mamba_num_heads"], args["mamba_head_dim"], args["mamba_num_groups"], args["mamba_state_dim"],
            args["mamba_conv_kernel"], args["mamba_chunk_size"], args["mamba_conv_bias"], args["ffn_hidden_size"]) == (
                48, 64, 1, 128, 4, 256, True, 4096)
    written = hf_config_from_args(args, vocab_size=100352)
    assert (written["model_type"], written["architectures"], written["position_embedding_type"]) == (
        "granitemoehybrid", ["GraniteMoeHybridForCausalLM"], "nope")
    assert model_config_from_hf(written) == args
    GraniteMoeHybridConfig(**written)  # transformers takes it
    tiny = _granite_4_h(num_local_experts=64, num_experts_per_tok=6, intermediate_size=512, shared_intermediate_size=1024)
    moe_args = model_config_from_hf(tiny)
    assert (moe_args["num_experts"], moe_args["moe_shared_expert_intermediate_size"], moe_args["mamba_layers"]) == (
        64, 1024, marks)
    assert model_config_from_hf(hf_config_from_args(moe_args, vocab_size=100352)) == moe_args
    with pytest.raises(ValueError, match="time_step_limit \\[0.001, 0.1\\] is not supported"):
        model_config_from_hf(dict(release, time_step_limit=[0.001, 0.1]))
    with pytest.raises(ValueError, match="mamba_proj_bias=true"):
        model_config_from_hf(dict(release, mamba_proj_bias=True))
    with pytest.raises(ValueError, match="layer_types must name mamba or attention for each of 40 layers"):
        model_config_from_hf(dict(release, layer_types=["mamba"] * 39 + ["moe"]))
    with pytest.raises(ValueError, match="apply RoPE or none does"):
        hf_config_from_args(dict(args, no_rope_freq=[1] * 39 + [0]), vocab_size=100352)


# A config.json in Falcon-H1-0.5B-Instruct's shape (its release is not downloadable here: the sizes and multipliers
# as its model card's config lists them, every key transformers' FalconH1Config reads; mamba_d_ssm 1536, not
# mamba_expand x hidden_size; head_dim 64, not hidden_size / heads)
FALCON_H1_0_5B = {
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "attention_bias": False,
    "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375, "attn_layer_indices": None,
    "embedding_multiplier": 5.656854249492381, "head_dim": 64, "hidden_act": "silu", "hidden_size": 1024,
    "intermediate_size": 2048, "key_multiplier": 0.390625, "lm_head_multiplier": 0.0390625, "mamba_chunk_size": 128,
    "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_head": 64, "mamba_d_ssm": 1536, "mamba_d_state": 128,
    "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 24, "mamba_norm_before_gate": False,
    "mamba_proj_bias": False, "mamba_rms_norm": False, "mamba_use_mlp": True, "max_position_embeddings": 16384,
    "mlp_bias": False, "mlp_expansion_factor": 8, "mlp_multipliers": [0.8838834764831844, 0.5859375],
    "num_attention_heads": 8, "num_hidden_layers": 36, "num_key_value_heads": 2, "projectors_bias": False,
    "rms_norm_eps": 1e-05, "rope_theta": 100000000000.0, "ssm_in_multiplier": 1.25,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "ssm_out_multiplier": 0.23570226039551587, "tie_word_embeddings": False, "vocab_size": 32784,
    "bos_token_id": 1, "eos_token_id": 11, "pad_token_id": 0}


def test_falcon_h1_config_json_round_trip():
    """Falcon-H1: attention and Mamba-2 side by side in every layer (parallel_hybrid), its inner width and head
    dimension its own, every multiplier; exported from megatron's args alone as falcon_h1 and read back the same,
    transformers taking it; what transformers and vLLM would compute differently refused in one sentence."""
    from transformers import FalconH1Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(FALCON_H1_0_5B)
    assert args["parallel_hybrid"] and "mamba_layers" not in args and args["num_layers"] == 36
    assert (args["mamba_num_heads"], args["mamba_head_dim"], args["mamba_num_groups"], args["mamba_state_dim"],
            args["mamba_chunk_size"], args["mamba_norm"], args["kv_channels"], args["rotary_base"],
            args["norm_epsilon"]) == (24, 64, 1, 128, 128, False, 64, 1e11, 1e-5)
    assert (args["key_multiplier"], args["mlp_gate_multiplier"], args["output_multiplier_scale"]) == (
        0.390625, 0.8838834764831844, 0.0390625)
    written = hf_config_from_args(args, vocab_size=32784)
    assert (written["model_type"], written["architectures"], written["mamba_d_ssm"]) == (
        "falcon_h1", ["FalconH1ForCausalLM"], 1536)
    assert model_config_from_hf(written) == args
    config = FalconH1Config(**written)  # transformers takes it, with the same sizes
    assert config.mamba_d_head * config.mamba_n_heads == 1536 and config.ssm_multipliers == FALCON_H1_0_5B["ssm_multipliers"]
    assert model_config_from_hf(config.to_dict()) == args
    # mamba_d_ssm null: mamba_expand x hidden_size (2048, so 32 heads of 64); absent: transformers' 1024 (of 24 heads
    # that cannot be: one sentence)
    null = model_config_from_hf(dict(FALCON_H1_0_5B, mamba_d_ssm=None, mamba_d_head="auto", mamba_n_heads=32))
    assert null["mamba_head_dim"] == 64 and hf_config_from_args(null, vocab_size=32784)["mamba_d_ssm"] == 2048
    with pytest.raises(ValueError, match="must equal the Mamba-2 inner width 1024"):
        model_config_from_hf({k: v for k, v in FALCON_H1_0_5B.items() if k != "mamba_d_ssm"})
    for key, value, match in (("projectors_bias", True, "projectors_bias=true"),
                              ("mamba_rms_norm", True, "mamba_rms_norm=true needs mamba_norm_before_gate=false"),
                              ("attn_layer_indices", [0, 2], "attn_layer_indices \\[0, 2\\] is not supported"),
                              ("mamba_use_mlp", False, "mamba_use_mlp=false"),
                              ("attn_rotary_emb", 32, "attn_rotary_emb 32"),
                              ("rope_theta", None, "has no rope_theta"),
                              ("mlp_multipliers", [1.0], "mlp_multipliers must list 2 numbers"),
                              ("time_step_limit", [0.001, 0.1], "time_step_limit \\[0.001, 0.1\\] is not supported")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict({k: v for k, v in FALCON_H1_0_5B.items() if k != "mamba_norm_before_gate"}
                                      if key == "mamba_rms_norm" else FALCON_H1_0_5B, **{key: value}))


# A config.json in LFM2-1.2B's shape (its release is not downloadable here: typed from its model card's config.json as
# first published, transformers 4.54's keys: block_ff_dim for intermediate_size, full_attn_idxs for the attention
# layers, the releases' block_dim / conv_dim)
LFM2_1_2B = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "block_auto_adjust_ff_dim": True, "block_dim": 2048,
    "block_ff_dim": 12288, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256, "block_norm_eps": 1e-05,
    "bos_token_id": 1, "conv_L_cache": 3, "conv_bias": False, "conv_dim": 2048, "conv_dim_out": 2048,
    "eos_token_id": 7, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "hidden_size": 2048, "max_position_embeddings": 128000,
    "norm_eps": 1e-05, "num_attention_heads": 32, "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pad_token_id": 0, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 65536}


def test_lfm2_config_json_round_trip():
    """LFM2: short-convolution layers where full_attn_idxs leaves them (or layer_types says conv), its MLP width
    adjusted as transformers does (2/3 of block_ff_dim 12288, rounded to a multiple of 256: 8192), per-head q / k
    norms, tied; exported from megatron's args alone as lfm2 with the width as it is and read back the same,
    transformers taking it; what transformers and vLLM would build differently refused in one sentence."""
    from transformers import Lfm2Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    args = model_config_from_hf(LFM2_1_2B)
    attends = {2, 5, 8, 10, 12, 14}
    assert args["short_conv_layers"] == [int(i not in attends) for i in range(16)]
    assert (args["ffn_hidden_size"], args["kv_channels"], args["num_query_groups"], args["short_conv_kernel"],
            args["short_conv_bias"], args["qk_layernorm"], args["rotary_base"], args["norm_epsilon"]) == (
        8192, 64, 8, 3, False, True, 1e6, 1e-5)
    assert not args["untie_embeddings_and_output_weights"]
    written = hf_config_from_args(args, vocab_size=65536)
    assert (written["model_type"], written["architectures"], written["intermediate_size"],
            written["block_auto_adjust_ff_dim"], written["conv_dim"]) == ("lfm2", ["Lfm2ForCausalLM"], 8192, False, 2048)
    assert model_config_from_hf(written) == args
    assert model_config_from_hf(Lfm2Config(**written).to_dict()) == args  # transformers takes it, the same model
    assert model_config_from_hf(Lfm2Config(**LFM2_1_2B).to_dict()) == args  # and the release as transformers reads it
    layer_types = ["full_attention" if i in attends else "conv" for i in range(16)]
    assert model_config_from_hf(dict(LFM2_1_2B, full_attn_idxs=None, layer_types=layer_types)) == args
    wider = model_config_from_hf(dict(LFM2_1_2B, block_ffn_dim_multiplier=1.3))  # int(8192 x 1.3) rounded up: 10752
    assert wider["ffn_hidden_size"] == 10752
    from mindspeed_rl.rollout.vllm_engine import vllm_config

    # vLLM is handed the width as it is: it would round 2/3 of 12000 (8000) up to 8192 without a multiplier, where
    # transformers keeps 8000
    for release in (LFM2_1_2B, dict(LFM2_1_2B, block_ff_dim=12000, block_ffn_dim_multiplier=None)):
        engine = vllm_config(release)
        assert (engine["intermediate_size"], engine["block_auto_adjust_ff_dim"], engine["conv_dim"]) == (
            model_config_from_hf(release)["ffn_hidden_size"], False, 2048)
        assert "block_ff_dim" not in engine
    assert Lfm2Config(**vllm_config(LFM2_1_2B)).intermediate_size == 8192  # (transformers 5.24 takes no null multiplier)
    assert model_config_from_hf(dict(LFM2_1_2B, block_ff_dim=12000, block_ffn_dim_multiplier=None))["ffn_hidden_size"] == 8000
    for key, value, match in (("conv_dim", 1024, "conv_dim 1024 differs from hidden_size 2048"),
                              ("layer_types", ["conv"] * 15, "layer_types lists 15 layers but num_hidden_layers is 16"),
                              ("layer_types", ["conv"] * 15 + ["sliding_attention"], "layer_types has 'sliding_attention'"),
                              ("hidden_act", "gelu", "hidden_act 'gelu' is not supported for lfm2")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(LFM2_1_2B, **{key: value}))


def test_lfm2_moe_config_json_round_trip():
    """LFM2-MoE in transformers' Lfm2MoeConfig defaults (LFM2-8B-A1B's style: 32 experts of 1792, top-4, two dense
    layers first, 7168 wide and not adjusted; attention every fourth layer here): sigmoid routing with the expert bias,
    renormalised; exported from megatron's args alone as lfm2_moe and read back the same, transformers taking it;
    what megatron would route otherwise refused in one sentence."""
    from transformers import Lfm2MoeConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    types = ["full_attention" if i % 4 == 3 else "conv" for i in range(32)]
    release = Lfm2MoeConfig(layer_types=types).to_dict()
    args = model_config_from_hf(release)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["ffn_hidden_size"],
            args["moe_router_score_function"], args["moe_router_enable_expert_bias"], args["norm_topk_prob"]) == (
        32, 4, 1792, 7168, "sigmoid", True, True)
    assert args["moe_layer_freq"] == [0, 0] + [1] * 30 and args["short_conv_layers"] == [int(t == "conv") for t in types]
    assert "moe_router_topk_scaling_factor" not in args and args["moe_router_bias_update_rate"] == 0.0
    written = hf_config_from_args(args, vocab_size=65536)
    assert (written["model_type"], written["architectures"], written["num_dense_layers"], written["use_expert_bias"]) == (
        "lfm2_moe", ["Lfm2MoeForCausalLM"], 2, True)
    assert model_config_from_hf(written) == args
    assert model_config_from_hf(Lfm2MoeConfig(**written).to_dict()) == args
    scaled = model_config_from_hf(dict(release, routed_scaling_factor=2.5, use_expert_bias=False))
    assert scaled["moe_router_topk_scaling_factor"] == 2.5 and not scaled["moe_router_enable_expert_bias"]
    assert model_config_from_hf(hf_config_from_args(scaled, vocab_size=65536)) == scaled
    for key, value, match in (("norm_topk_prob", False, "norm_topk_prob false for lfm2_moe is not supported"),
                              ("num_dense_layers", 32, "num_dense_layers 32 leaves no MoE layer of 32")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(release, **{key: value}))
    with pytest.raises(ValueError, match="has a config.json form only as LFM2-MoE .* routing other than by sigmoid"):
        hf_config_from_args(dict(args, moe_router_score_function="softmax"), vocab_size=65536)


# A config.json in EXAONE-3.5-2.4B-Instruct's shape (typed from its model card's config.json as published; not
# downloadable here): Llama under its own spellings (num_layers, layer_norm_epsilon, activation_function), llama3 rope
# scaling, tied
EXAONE_3_5_2_4B = {
    "activation_function": "silu", "architectures": ["ExaoneForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "embed_dropout": 0.0, "eos_token_id": 361, "head_dim": 80, "hidden_size": 2560, "intermediate_size": 7168,
    "layer_norm_epsilon": 1e-05, "max_position_embeddings": 32768, "model_type": "exaone", "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_layers": 30, "pad_token_id": 0, "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 102400}


def test_exaone_release_config_json():
    """EXAONE 3.5 is read under its releases' spellings, as transformers' ExaoneConfig reads them; vLLM is handed it as
    its ExaoneForCausalLM under Llama's config class, its tensors named as the release's."""
    from mindspeed_rl.models.hf_bridge.names import names_type
    from mindspeed_rl.rollout.vllm_engine import vllm_config

    args = model_config_from_hf(EXAONE_3_5_2_4B)
    assert (args["num_layers"], args["hidden_size"], args["ffn_hidden_size"], args["kv_channels"], args["num_query_groups"],
            args["norm_epsilon"], args["rotary_base"], args["rope_scaling_type"], args["rope_scaling_factor"]) == (
        30, 2560, 7168, 80, 8, 1e-5, 1e6, "llama3", 8.0)
    assert not args["untie_embeddings_and_output_weights"] and not args.get("qk_layernorm")
    from transformers import LlamaConfig

    engine = vllm_config(dict(EXAONE_3_5_2_4B, layer_norm_epsilon=1e-6))
    assert (engine["model_type"], engine["architectures"], engine["layer_norm_epsilon"], engine["num_layers"]) == (
        "llama", ["ExaoneForCausalLM"], 1e-6, 30)
    llama = LlamaConfig(**{k: v for k, v in engine.items() if k != "model_type"})  # as vLLM reads it
    assert (llama.num_hidden_layers, llama.rms_norm_eps, llama.hidden_act) == (30, 1e-6, "silu")
    bare = {k: v for k, v in EXAONE_3_5_2_4B.items() if k not in ("rope_theta", "rope_scaling")}  # EXAONE 3.0's theta
    assert model_config_from_hf(bare)["rotary_base"] == 500000.0 == vllm_config(bare)["rope_theta"]
    assert names_type(engine) == "exaone" == names_type(EXAONE_3_5_2_4B)
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported for exaone"):
        model_config_from_hf(dict(EXAONE_3_5_2_4B, activation_function="gelu"))


def test_iquestcoder_is_handed_to_vllm_as_llama_with_its_head_dim():
    """IQuest-Coder's head_dim defaults to 128 (transformers' IQuestCoderConfig), where Llama's config class, which vLLM
    is handed, would take hidden_size / heads: the engine's config.json says it."""
    from mindspeed_rl.rollout.vllm_engine import vllm_config

    release = {"architectures": ["IQuestCoderForCausalLM"], "model_type": "iquestcoder", "hidden_size": 5120,
               "num_attention_heads": 40, "num_key_value_heads": 8, "num_hidden_layers": 80, "intermediate_size": 27648,
               "vocab_size": 76800}
    assert model_config_from_hf(release)["kv_channels"] == 128
    engine = vllm_config(release)
    assert (engine["model_type"], engine["architectures"], engine["head_dim"]) == ("llama", ["LlamaForCausalLM"], 128)
    assert vllm_config(dict(release, head_dim=96))["head_dim"] == 96


def test_hy_v3_config_json_and_what_vllm_is_handed():
    """Hy3 (hy_v3): transformers' HYV3Config defaults are Hy3-preview's sizes (80 layers, the first dense 13312 wide,
    then 192 experts of 1536, 8 per token, sigmoid routing with the expert bias x 2.826, one shared expert; 64 heads of
    128, 8 KV heads, theta 11158840). Read with its keys for vLLM or without them; exported from args as GLM-4.5 (the same
    model) and read back the same; the keys vLLM reads that would make it compute another model are refused in one
    sentence, and the engine hands vLLM what transformers computes."""
    from transformers import HYV3Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args
    from mindspeed_rl.rollout.vllm_engine import vllm_config

    bare = HYV3Config().to_dict()
    release = dict(bare, first_k_dense_replace=1, expert_hidden_dim=1536, qk_norm=True, route_norm=True)
    args = model_config_from_hf(release)
    assert args == model_config_from_hf(bare)
    assert (args["num_layers"], args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"],
            args["moe_router_topk_scaling_factor"], args["moe_shared_expert_intermediate_size"],
            args["ffn_hidden_size"]) == (80, 192, 8, 1536, 2.826, 1536, 13312)
    assert (args["kv_channels"], args["num_query_groups"], args["rotary_base"], args["norm_epsilon"]) == \
        (128, 8, 11158840.0, 1e-5)
    assert args["qk_layernorm"] and args["moe_layer_freq"] == [0] + [1] * 79 and "moe_router_num_groups" not in args
    assert args["moe_router_score_function"] == "sigmoid" and args["moe_router_enable_expert_bias"]
    written = hf_config_from_args(args, vocab_size=120832)
    assert written["model_type"] == "glm4_moe" and model_config_from_hf(written) == args
    for key, value in (("expert_hidden_dim", 1536), ("first_k_dense_replace", 1), ("qk_norm", True),
                       ("route_norm", True), ("router_scaling_factor", 2.826)):
        assert vllm_config(bare)[key] == value, key
    assert vllm_config(dict(bare, mlp_layer_types=["dense"] * 3 + ["sparse"] * 77))["first_k_dense_replace"] == 3
    for change, match in ((dict(expert_hidden_dim=2048), "expert_hidden_dim 2048 disagrees with moe_intermediate_size 1536"),
                          (dict(route_norm=False), "route_norm false is not supported for hy_v3"),
                          (dict(qk_norm=False), "qk_norm false is not supported for hy_v3"),
                          (dict(first_k_dense_replace=2), "first_k_dense_replace 2 disagrees with mlp_layer_types"),
                          (dict(attention_bias=True), "attention_bias=true for hy_v3")):
        with pytest.raises(ValueError, match=match):
            model_config_from_hf(dict(release, **change))


def test_afmoe_config_json_and_what_vllm_is_handed():
    """AFMoE (afmoe): transformers' AfmoeConfig defaults are Trinity-Mini's sizes (32 layers, the first dense 6144 wide,
    then 64 experts of 1408, 6 per token, sigmoid routing with the expert bias, two shared experts; every fourth layer
    full without RoPE, the others a 1024-token window). vLLM's AfmoeForCausalLM also reads score_func, route_norm and
    the expert groups, which transformers' config lacks: the engine hands it transformers' routing, and a config.json
    that says otherwise is refused in one sentence. From megatron's args alone it is written as AFMoE again."""
    from transformers import AfmoeConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args
    from mindspeed_rl.rollout.vllm_engine import vllm_config

    mini = AfmoeConfig().to_dict()
    args = model_config_from_hf(mini)
    assert (args["num_layers"], args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"],
            args["moe_shared_expert_intermediate_size"], args["ffn_hidden_size"], args["kv_channels"]) == \
        (32, 64, 6, 1408, 2816, 6144, 128)
    assert args["moe_layer_freq"] == [0] + [1] * 31 and "moe_router_topk_scaling_factor" not in args  # route_scale 1
    assert args["window_attn_skip_freq"] == [1, 1, 1, 0] * 8 and args["no_rope_freq"] == [0, 0, 0, 1] * 8
    assert args["sliding_window"] == 1024 and args["post_norm"] and args["qk_layernorm"]
    assert args["attention_output_gate"] and args["attention_gate_proj"] and not args["input_embeds_norm"]
    no_types = {k: v for k, v in mini.items() if k != "layer_types"}  # (then global_attn_every_n_layers says)
    assert model_config_from_hf(dict(no_types, global_attn_every_n_layers=2))["no_rope_freq"] == [0, 1] * 16
    assert model_config_from_hf(dict(mini, mup_enabled=True, route_scale=2.5))["moe_router_topk_scaling_factor"] == 2.5
    written = hf_config_from_args(args, vocab_size=200192)  # from args alone: AFMoE's own config.json, read back the same
    assert written["model_type"] == "afmoe" and model_config_from_hf(written) == args
    assert AfmoeConfig(**written).layer_types == mini["layer_types"]
    with pytest.raises(ValueError, match="form only as AFMoE .afmoe., which needs per-head q / k norms, pre- and post"):
        hf_config_from_args(dict(args, post_norm=False), vocab_size=200192)
    engine = vllm_config(mini)
    assert (engine["score_func"], engine["route_norm"], engine["n_group"], engine["topk_group"]) == ("sigmoid", True, 1, 1)
    assert vllm_config(dict(mini, n_group=1, topk_group=1)) == {**mini, "score_func": "sigmoid", "route_norm": True,
                                                                "n_group": 1, "topk_group": 1}
    for change, match in ((dict(score_func="softmax"), "score_func 'softmax'"), (dict(route_norm=False), "route_norm false"),
                          (dict(n_group=8, topk_group=4), "n_group 8 with topk_group 4")):
        with pytest.raises(ValueError, match=match + ".* is not supported for afmoe"):
            model_config_from_hf(dict(mini, **change))
    assert model_config_from_hf(dict(mini, n_group=8, topk_group=8)) == args  # every group chosen: no groups


def test_sarvam_moe_config_json_and_what_vllm_is_handed():
    """Sarvam MoE (sarvam_moe): transformers' SarvamMoEConfig defaults are Sarvam-30B's sizes (19 layers, the first dense,
    then 128 experts of 1024, 6 per token, sigmoid routing with the expert bias x 2.5, one shared expert; 64 heads of 64,
    4 KV heads, theta 8e6, q / k norms). Read as transformers saves it and with the keys of Ling's module (Bailing's) that
    the releases carry for vLLM; exported from args as GLM-4.5 (the same model) and read back the same; the vLLM keys
    that would make it compute another model are refused in one sentence, and the engine hands vLLM transformers' model
    under GLM-4.5's config class."""
    from transformers import SarvamMoEConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args
    from mindspeed_rl.rollout.vllm_engine import vllm_config

    saved = SarvamMoEConfig().to_dict()
    args = model_config_from_hf(saved)
    assert (args["num_layers"], args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"],
            args["moe_router_topk_scaling_factor"], args["moe_shared_expert_intermediate_size"],
            args["kv_channels"], args["num_query_groups"], args["rotary_base"]) == \
        (19, 128, 6, 1024, 2.5, 1024, 64, 4, 8000000.0)
    assert args["qk_layernorm"] and args["moe_layer_freq"] == [0] + [1] * 18 and "rotary_percent" not in args
    ling = {k: v for k, v in saved.items() if k not in ("n_routed_experts", "n_shared_experts", "attention_bias")}
    ling.update(num_experts=128, num_shared_experts=1, use_qkv_bias=False, use_bias=False, score_function="sigmoid",
                moe_router_enable_expert_bias=True, use_rmsnorm=True, rotary_dim=64, router_dtype="fp32",
                moe_shared_expert_intermediate_size=1024, embedding_dropout=0.0, architectures=["SarvamMoEForCausalLM"])
    assert model_config_from_hf(ling) == args
    written = hf_config_from_args(args, vocab_size=262144)
    assert written["model_type"] == "glm4_moe" and model_config_from_hf(written) == args
    engine = vllm_config(ling)
    assert (engine["model_type"], engine["architectures"], engine["num_experts"], engine["num_shared_experts"],
            engine["score_function"], engine["moe_router_enable_expert_bias"], engine["use_rmsnorm"],
            engine["use_qk_norm"], engine["partial_rotary_factor"], engine["moe_shared_expert_intermediate_size"]) == \
        ("glm4_moe", ["SarvamMoEForCausalLM"], 128, 1, "sigmoid", True, True, True, 1.0, 1024)
    assert vllm_config(saved)["num_experts"] == 128 and vllm_config(saved)["use_qkv_bias"] is False
    for change, match in ((dict(score_function="softmax"), "score_function 'softmax'"),
                          (dict(moe_router_enable_expert_bias=False), "moe_router_enable_expert_bias false"),
                          (dict(use_bias=True), "use_bias true"), (dict(rotary_dim=32), "rotary_dim 32 .transformers "
                                                                                          "rotates 64"),
                          (dict(moe_shared_expert_intermediate_size=2048), "moe_shared_expert_intermediate_size 2048"),
                          (dict(use_rmsnorm=False), "use_rmsnorm false")):
        with pytest.raises(ValueError, match=match + ".* is not supported for sarvam_moe"):
            model_config_from_hf(dict(ling, **change))


def test_sarvam_mla_is_read_served_and_exported_as_deepseek_v3():
    """Sarvam MLA (sarvam_mla: Sarvam-105B) is DeepSeek-V3's model (transformers runs it as DeepseekV3ForCausalLM;
    SarvamMLAConfig's defaults are Sarvam-105B's sizes: 32 layers, 64 heads of multi-latent attention without a query
    rank, 128 experts routed without groups). Its releases' spellings (Ling's num_experts / num_shared_experts, rope type
    deepseek_yarn, the legacy head_dim) read as transformers reads them, into DeepSeek-V3's config.json, which vLLM
    serves (DeepseekV3ForCausalLM) and exports write; the keys of vLLM's own Sarvam module that would say another
    model are refused in one sentence."""
    from transformers import SarvamMLAConfig

    from mindspeed_rl.models.hf_config import text_model_config

    saved = SarvamMLAConfig().to_dict()
    args = model_config_from_hf(saved)
    assert (args["num_layers"], args["num_attention_heads"], args["q_lora_rank"], args["num_experts"],
            args["moe_layer_freq"][:2], args["kv_channels"]) == (32, 64, None, 128, [0, 1], 128)
    assert "moe_router_num_groups" not in args and args["moe_router_topk_scaling_factor"] == 2.5
    yarn = {"type": "deepseek_yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
            "beta_slow": 1, "original_max_position_embeddings": 4096}
    release = {k: v for k, v in saved.items() if k not in ("n_routed_experts", "n_shared_experts", "rope_parameters")}
    release.update(model_type="sarvam_mla", architectures=["SarvamMLAForCausalLM"], num_experts=128,
                   num_shared_experts=1, rope_theta=10000.0, rope_scaling=yarn, head_dim=64, score_function="sigmoid",
                   moe_router_enable_expert_bias=True, auto_map={"AutoConfig": "configuration_sarvam_mla.SarvamMLAConfig"})
    theirs = SarvamMLAConfig(**{k: v for k, v in release.items() if k not in ("model_type", "auto_map")}).to_dict()
    assert model_config_from_hf(release) == model_config_from_hf(theirs)
    assert model_config_from_hf(release)["rope_scaling_type"] == "yarn"
    served = text_model_config(release)
    assert (served["model_type"], served["architectures"], served["scoring_func"], served["topk_method"],
            served["n_routed_experts"], served["n_shared_experts"]) == \
        ("deepseek_v3", ["DeepseekV3ForCausalLM"], "sigmoid", "noaux_tc", 128, 1)
    assert "auto_map" not in served and "head_dim" not in served and served["rope_scaling"]["rope_type"] == "yarn"
    for change, match in ((dict(score_function="softmax"), "score_function 'softmax'"),
                          (dict(moe_router_enable_expert_bias=False), "moe_router_enable_expert_bias false"),
                          (dict(moe_layer_freq=2), "moe_layer_freq 2"),
                          (dict(moe_shared_expert_intermediate_size=4096), "moe_shared_expert_intermediate_size 4096")):
        with pytest.raises(ValueError, match=match + ".* is not supported for sarvam_mla"):
            model_config_from_hf(dict(release, **change))
    with pytest.raises(ValueError, match="num_experts 64 disagrees with n_routed_experts 128"):
        model_config_from_hf(dict(release, n_routed_experts=128, num_experts=64))


def test_jais2_config_json_round_trip():
    """Jais 2 (jais2): transformers' Jais2Config defaults are Jais-2-8B's sizes (32 layers of 3328, 26 heads, an MLP of
    26624 without a gate, relu(x)^2, LayerNorms, biases on every linear layer). Read, written from the args as Jais 2
    again and read back the same; biases on the attention without the MLP's (or the reverse) are one sentence."""
    from transformers import Jais2Config

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    eight = Jais2Config().to_dict()
    args = model_config_from_hf(eight)
    assert (args["num_layers"], args["hidden_size"], args["ffn_hidden_size"], args["num_attention_heads"],
            args["normalization"], args["squared_relu"], args["swiglu"], args["add_qkv_bias"],
            args["disable_bias_linear"], args["norm_epsilon"]) == (32, 3328, 26624, 26, "LayerNorm", True, False, True,
                                                                   False, 1e-5)
    written = hf_config_from_args(args, vocab_size=150272)
    assert written["model_type"] == "jais2" and model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="attention_bias=True with mlp_bias=False is not supported for jais2"):
        model_config_from_hf(dict(eight, mlp_bias=False))


def test_mellum_config_json_round_trip():
    """Mellum (mellum): transformers' MellumConfig defaults are Mellum2-12B-A2.5B's sizes (28 layers, 64 experts of 896,
    head_dim 128, theta 5e5; every layer full and MoE unless layer_types / mlp_layer_types say). With sliding layers
    (their own theta 1e4) and dense ones it reads as Qwen3-MoE's layers with megatron's window pattern and local rotary
    table; written from the args as Mellum again and read back the same; sliding layers rotating another part of each
    head, or a malformed mlp_layer_types, are one sentence each."""
    from transformers import MellumConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    twelve = MellumConfig().to_dict()
    args = model_config_from_hf(twelve)
    assert (args["num_layers"], args["num_experts"], args["moe_ffn_hidden_size"], args["kv_channels"],
            args["rotary_base"], args["qk_layernorm"]) == (28, 64, 896, 128, 500000.0, True)
    assert "window_attn_skip_freq" not in args and "moe_layer_freq" not in args
    hybrid = dict(twelve, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 9 + ["full_attention"],
                  mlp_layer_types=["dense"] + ["sparse"] * 27)
    args = model_config_from_hf(hybrid)
    assert args["window_attn_skip_freq"] == [1, 1, 0] * 9 + [0] and args["sliding_window"] == 1024
    assert args["rope_local_base_freq"] == 10000.0 and args["moe_layer_freq"] == [0] + [1] * 27
    written = hf_config_from_args(args, vocab_size=98304)
    assert written["model_type"] == "mellum" and model_config_from_hf(written) == args
    assert MellumConfig(**{k: v for k, v in written.items() if k != "model_type"}).layer_types == hybrid["layer_types"]
    sliding = dict(hybrid["rope_parameters"]["sliding_attention"], partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match="sliding_attention partial_rotary_factor 0.5 differs from the full layers' 1.0"):
        model_config_from_hf(dict(hybrid, rope_parameters={**hybrid["rope_parameters"], "sliding_attention": sliding}))
    with pytest.raises(ValueError, match="mlp_layer_types must name dense or sparse for each of 28 layers"):
        model_config_from_hf(dict(hybrid, mlp_layer_types=["dense", "moe"] + ["sparse"] * 26))


def test_gemma4_config_json_round_trip():
    """Gemma 4 (gemma4_text): transformers' Gemma4TextConfig defaults are an E2B-like model (per-layer inputs of 256:
    the next test but one); the 31B's keys (global_head_dim 512 with 4 key / value heads
    whose values are the keys, 16 heads of 256 in the sliding layers, proportional RoPE on a quarter of the full layers'
    pairs) read as the full layers' sizes with the sliding layers' own; transformers 5.24's per_layer_config form reads
    the same; written from the args as Gemma 4 again, read back the same (its MoE block: the next test)."""
    from transformers import Gemma4TextConfig

    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    defaults = model_config_from_hf(Gemma4TextConfig().to_dict())
    assert (defaults["per_layer_input_size"], defaults["per_layer_input_vocab_size"]) == (256, 262144)
    types = (["sliding_attention"] * 5 + ["full_attention"]) * 10
    release = {"model_type": "gemma4_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 60,
               "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256, "global_head_dim": 512,
               "num_global_key_value_heads": 4, "attention_k_eq_v": True, "hidden_size_per_layer_input": 0,
               "sliding_window": 1024, "final_logit_softcapping": 30.0, "vocab_size": 262144,
               "max_position_embeddings": 262144, "layer_types": types,
               "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                      "rope_theta": 1000000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    args = model_config_from_hf(release)
    assert (args["kv_channels"], args["num_query_groups"], args["sliding_kv_channels"], args["sliding_num_query_groups"],
            args["rope_scaling_type"], args["rope_proportion"], args["softmax_scale"]) == \
        (512, 4, 256, 16, "proportional", 0.25, 1.0)
    assert args["window_attn_skip_freq"] == [int(t == "sliding_attention") for t in types]
    assert args["attention_k_eq_v"] and args["value_norm"] and args["layer_scalar"] and not args["add_qkv_bias"]
    saved = Gemma4TextConfig(**{k: v for k, v in release.items() if k != "model_type"}).to_dict()
    assert "per_layer_config" in saved and "global_head_dim" not in saved  # transformers 5.24's own form
    assert model_config_from_hf(saved) == args
    written = hf_config_from_args(args, vocab_size=262144)
    assert written["model_type"] == "gemma4_text" and model_config_from_hf(written) == args
    for key, value, what in (("use_bidirectional_attention", "all", "bidirectional attention"),
                             ("enable_moe_block", True, "enable_moe_block=true needs num_experts, top_k_experts"),
                             ("attention_bias", True, "attention_bias=true")):
        with pytest.raises(ValueError, match=what):
            model_config_from_hf(dict(release, **{key: value}))
    odd = {str(i): {"head_dim": 512} for i in range(5, 60, 6)} | {"0": {"head_dim": 128}}
    with pytest.raises(ValueError, match="per_layer_config must give every full_attention layer, and only those"):
        model_config_from_hf(dict(saved, per_layer_config=odd))


def test_gemma4_e2b_config_json_round_trip():
    """Gemma 4 E2B (its release's text_config): per-layer inputs of 256 from a 262144-row table, the last 20 of 35
    layers reading the keys and values of layer 13 (the last sliding one before them) or 14 (the last full one), their
    MLPs twice as wide; read as per_layer_input_size / num_kv_shared_layers / kv_shared_double_mlp, written back as
    Gemma 4 and read back the same; too many shared layers refused in one sentence."""
    from mindspeed_rl.models.hf_export_config import hf_config_from_args
    from mindspeed_rl.models.hf_gemma4_config import kv_source, layer_ffn

    types = (["sliding_attention"] * 4 + ["full_attention"]) * 7
    release = {"model_type": "gemma4_text", "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35,
               "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
               "num_global_key_value_heads": None, "attention_k_eq_v": False, "sliding_window": 512,
               "vocab_size": 262144, "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
               "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "max_position_embeddings": 131072,
               "final_logit_softcapping": 30.0, "layer_types": types}
    args = model_config_from_hf(release)
    assert (args["per_layer_input_size"], args["per_layer_input_vocab_size"], args["num_kv_shared_layers"],
            args["kv_shared_double_mlp"], args["kv_channels"], args["num_query_groups"],
            args["sliding_kv_channels"]) == (256, 262144, 20, True, 512, 1, 256)
    assert [kv_source(args, i) for i in (0, 14, 15, 19, 33, 34)] == [None, None, 13, 14, 13, 14]
    assert [layer_ffn(args, i) for i in (14, 15)] == [6144, 12288]
    written = hf_config_from_args(args, vocab_size=262144)
    assert (written["hidden_size_per_layer_input"], written["num_kv_shared_layers"], written["use_double_wide_mlp"]) \
        == (256, 20, True) and model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="num_kv_shared_layers=35 leaves no earlier layer of every attention type"):
        model_config_from_hf(dict(release, num_kv_shared_layers=35))


def test_gemma4_moe_config_json_round_trip():
    """Gemma 4 26B-A4B (enable_moe_block): 128 experts of 704 (top-8) beside a dense MLP of 2112 in each of 30 layers
    read as moe_dense_beside (models/gemma4.Gemma4MoE) with the dense width as ffn_hidden_size; written back as Gemma 4
    with its MoE block and read back the same; experts without the dense MLP have no Gemma 4 form."""
    from mindspeed_rl.models.hf_export_config import hf_config_from_args

    types = (["sliding_attention"] * 5 + ["full_attention"]) * 5
    release = {"model_type": "gemma4_text", "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30,
               "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512,
               "num_global_key_value_heads": 2, "attention_k_eq_v": True, "hidden_size_per_layer_input": 0,
               "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
               "sliding_window": 1024, "final_logit_softcapping": 30.0, "vocab_size": 262144,
               "max_position_embeddings": 262144, "layer_types": types}
    args = model_config_from_hf(release)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["ffn_hidden_size"],
            args["moe_dense_beside"]) == (128, 8, 704, 2112, True)
    written = hf_config_from_args(args, vocab_size=262144)
    assert written["enable_moe_block"] and model_config_from_hf(written) == args
    with pytest.raises(ValueError, match="num_experts without moe_dense_beside"):
        hf_config_from_args(dict(args, moe_dense_beside=False), vocab_size=262144)
