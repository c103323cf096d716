"""models.arch_check: a model yaml against config.json of the HF checkpoint it loads."""

import json

import pytest
import yaml

from testing_utils import make_tiny_hf
from mindspeed_rl.models.arch_check import arch_from_hf_or_yaml, check_arch_against_hf
from mindspeed_rl.models.builder import model_config_from_hf
from mindspeed_rl.utils.errors import UserInputError


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen2")
    make_tiny_hf("qwen2", str(out))
    return str(out)


def _yaml(**override):
    """A MindSpeed-style model yaml (as the shipped qwen25-7b.yaml) for the tiny qwen2."""
    text = """
tiny-qwen2:
  use_mcore_models: true
  num_layers: 2
  hidden_size: 64
  ffn_hidden_size: 128
  num_attention_heads: 4
  group_query_attention: true
  num_query_groups: 2
  rotary_base: 10000
  padded_vocab_size: 128
  untie_embeddings_and_output_weights: false
  add_qkv_bias: true
  disable_bias_linear: true
  normalization: RMSNorm
  norm_epsilon: 1e-6
  swiglu: true
  use_flash_attn: true
  position_embedding_type: rope
"""
    args = yaml.safe_load(text)["tiny-qwen2"]
    assert args["norm_epsilon"] == "1e-6"  # YAML 1.1: a string, which must still compare as 1e-6
    args.update(override)
    return args


def test_agreeing_yaml_passes_and_missing_keys_come_from_config(qwen2_dir):
    check_arch_against_hf(_yaml(), qwen2_dir, "tiny-qwen2")
    full = arch_from_hf_or_yaml({"num_layers": 2, "use_flash_attn": True}, qwen2_dir)
    expected = dict(model_config_from_hf(json.load(open(f"{qwen2_dir}/config.json"))), use_flash_attn=True)
    assert full == expected
    assert arch_from_hf_or_yaml(_yaml(), qwen2_dir)["padded_vocab_size"] == 128  # the yaml's padding is kept


@pytest.mark.parametrize("override,match", [
    ({"num_layers": 28}, r"^model.tiny-qwen2.num_layers is 28 but config.json in .* says 2 \(num_hidden_layers\); "
                         r"fix the model yaml or drop the key to take it from config.json.$"),
    ({"num_query_groups": 4}, r"num_query_groups is 4 but .* says 2 \(num_key_value_heads\)"),
    ({"group_query_attention": False, "num_query_groups": None}, r"group_query_attention is False but .* says 2"),
    ({"add_qkv_bias": False}, r"add_qkv_bias is False but .* says True"),
    ({"untie_embeddings_and_output_weights": True}, r"untie_embeddings_and_output_weights is True .*tie_word_embeddings"),
    ({"rotary_base": 1000000}, r"rotary_base is 1000000 but .* says 10000.0 \(rope_theta\)"),
    ({"norm_epsilon": 1e-5}, r"norm_epsilon is 1e-05 but .* says 1e-06"),
    ({"qk_layernorm": True}, r"qk_layernorm is True"),
    ({"rope_scaling_type": "llama3"}, r"rope_scaling_type is llama3 but .* says nothing"),
    ({"padded_vocab_size": 100}, r"padded_vocab_size is 100 but .* says vocab_size 120; set it to at least"),
])
def test_first_disagreeing_field_is_named(qwen2_dir, override, match):
    with pytest.raises(UserInputError, match=match):
        check_arch_against_hf(_yaml(**override), qwen2_dir, "tiny-qwen2")


def test_unsupported_architecture_is_one_sentence(tmp_path):
    make_tiny_hf("llama", str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, hidden_act="gelu")))
    with pytest.raises(UserInputError, match=r"config.json: config.json hidden_act 'gelu' is not supported"):
        arch_from_hf_or_yaml({}, str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(dict(config, model_type="deepseek_v32")))
    with pytest.raises(UserInputError, match=r"model_type .deepseek_v32. is not supported; supported: llama, mistral, phi3, qwen2, qwen3"):
        check_arch_against_hf({}, str(tmp_path))


def test_yarn_keys_against_config_json(tmp_path):
    """A YaRN config.json (Qwen's long-context setting): the model yaml's MindSpeed-LLM yarn keys are
    compared with it; an attention factor or mscale the yaml sets where config.json derives one is
    the user's explicit choice, not a contradiction."""
    make_tiny_hf("qwen2", str(tmp_path), rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                          "original_max_position_embeddings": 32})
    yarn = dict(rope_scaling_type="yarn", rope_scaling_factor=4.0, original_max_position_embeddings=32,
                rope_scaling_beta_fast=32, rope_scaling_beta_slow=1)
    check_arch_against_hf(_yaml(**yarn), str(tmp_path), "tiny-qwen2")
    check_arch_against_hf(_yaml(**yarn, rope_attention_factor=1.2), str(tmp_path), "tiny-qwen2")
    with pytest.raises(UserInputError, match=r"rope_scaling_beta_fast is 16 but .* says 32.0 \(rope_scaling.beta_fast\)"):
        check_arch_against_hf(_yaml(**dict(yarn, rope_scaling_beta_fast=16)), str(tmp_path), "tiny-qwen2")
    with pytest.raises(UserInputError, match=r"rope_scaling_type is llama3 but .* says yarn \(rope_scaling\)"):
        check_arch_against_hf(_yaml(**dict(yarn, rope_scaling_type="llama3")), str(tmp_path), "tiny-qwen2")


def test_no_rope_freq_against_smollm3_config(tmp_path):
    """A yaml's no_rope_freq (megatron-core's: 1 = no RoPE, or every N-th layer) against SmolLM3's
    no_rope_layers (1 = RoPE): an int and the list it means agree."""
    make_tiny_hf("smollm3", str(tmp_path), num_hidden_layers=4)  # every second layer without RoPE
    llama = {k: v for k, v in _yaml(num_layers=4).items() if k not in ("add_qkv_bias", "rotary_base")}
    check_arch_against_hf(dict(llama, no_rope_freq=2), str(tmp_path), "tiny")
    check_arch_against_hf(dict(llama, no_rope_freq=[0, 1, 0, 1]), str(tmp_path), "tiny")
    with pytest.raises(UserInputError, match=r"no_rope_freq is \[0, 0, 0, 1\] but .* says \[0, 1, 0, 1\] \(no_rope_layers"):
        check_arch_against_hf(dict(llama, no_rope_freq=[0, 0, 0, 1]), str(tmp_path), "tiny")


def test_multipliers_of_one_agree_with_a_config_json_without_them(qwen2_dir):
    """A yaml that spells out Granite's multipliers at 1 (no scaling) agrees with a config.json that
    has none; another value does not."""
    check_arch_against_hf(_yaml(residual_multiplier=1.0, embedding_multiplier_scale=1), qwen2_dir, "tiny-qwen2")
    with pytest.raises(UserInputError, match=r"residual_multiplier is 0.5 but .* says 1.0 \(residual_multiplier\)"):
        check_arch_against_hf(_yaml(residual_multiplier=0.5), qwen2_dir, "tiny-qwen2")
