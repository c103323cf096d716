"""A model yaml against the config.json of the HF checkpoint it loads.

When `load:` is a HF directory the architecture can come from its config.json alone; a model
yaml may still set keys (MindSpeed's shipped yamls set them all). A key the yaml sets must agree
with config.json, else the weights would not fit (or would silently compute something else):

    check_arch_against_hf({"num_layers": 28, ...}, hf_dir, "qwen25-7b")
    -> UserInputError: model.qwen25-7b.num_layers is 28 but config.json in DIR says 24
       (num_hidden_layers); fix the model yaml or drop the key to take it from config.json.

`arch_from_hf_or_yaml` returns the yaml keys plus every architecture key it leaves out, taken from
config.json. Compared: everything that changes the weights or the math. Not compared:
max_position_embeddings (a run's length limit; filled when missing) and padded_vocab_size, which
may exceed config.json's vocab_size (megatron pads the vocabulary) but must not be smaller.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional

from mindspeed_rl.models.hf_bridge.loader import read_hf_config
from mindspeed_rl.utils.errors import UserInputError

# Megatron key -> config.json key, for the message
_HF_KEY = {
    "num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads", "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim", "rotary_base": "rope_theta", "norm_epsilon": "rms_norm_eps",
    "add_qkv_bias": "model_type / attention_bias", "qk_layernorm": "model_type",
    "untie_embeddings_and_output_weights": "tie_word_embeddings", "swiglu": "hidden_act",
    "disable_bias_linear": "mlp_bias / attention_bias",
    "normalization": "model_type", "position_embedding_type": "model_type",
    "rope_scaling_type": "rope_scaling", "rope_scaling_factor": "rope_scaling.factor",
    "low_freq_factor": "rope_scaling.low_freq_factor", "high_freq_factor": "rope_scaling.high_freq_factor",
    "original_max_position_embeddings": "rope_scaling.original_max_position_embeddings",
}


def hf_arch(hf_dir: str) -> dict[str, Any]:
    """Megatron-named architecture of a HF checkpoint directory (unsupported features: one sentence)."""
    from mindspeed_rl.models.builder import model_config_from_hf

    config = read_hf_config(hf_dir)
    try:
        return model_config_from_hf(config)
    except ValueError as err:
        raise UserInputError(f"{os.path.join(hf_dir, 'config.json')}: {err}") from None


def _effective(args: Mapping[str, Any], key: str) -> Any:
    """The value a key means, with the builder's defaults (num_query_groups without GQA = heads)."""
    if key == "num_query_groups":
        if not args.get("group_query_attention"):
            return args.get("num_attention_heads")
        return args.get("num_query_groups")
    return args.get(key)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, str) and isinstance(b, (int, float)):  # "1e-6": YAML 1.1 reads it as a string
        try:
            a = float(a)
        except ValueError:
            return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


def check_arch_against_hf(model_args: Mapping[str, Any], hf_dir: str, model_name: Optional[str] = None) -> None:
    """Raise UserInputError naming the first key the model yaml sets that config.json contradicts.

    Args:
        model_args: the keys the model yaml sets (Megatron names); unset keys are not checked.
        hf_dir: the HF checkpoint directory `load:` points at.
        model_name: the yaml's model name, for the message (model.<name>.<key>).
    """
    hf = hf_arch(hf_dir)
    prefix = f"model.{model_name}" if model_name else "model"
    where = f"config.json in {hf_dir}"
    for key, hf_key in _HF_KEY.items():
        label = key
        if key == "num_query_groups" and model_args.get(key) is None and "group_query_attention" in model_args:
            label = "group_query_attention"  # false means num_query_groups = num_attention_heads
        elif model_args.get(key) is None:
            continue
        ours, theirs = _effective(model_args, key), _effective(hf, key)
        if ours is None:
            continue
        if theirs is None:  # e.g. rope_scaling_factor set while config.json has no rope scaling
            if key.startswith(("rope_scaling_factor", "low_freq", "high_freq", "original_max")) and not hf.get("rope_scaling_type"):
                continue
            theirs = "nothing"
        if not _same(ours, theirs):
            shown = model_args[label] if label != key else ours
            raise UserInputError(f"{prefix}.{label} is {shown} but {where} says {theirs} ({hf_key}); "
                                 "fix the model yaml or drop the key to take it from config.json.")
    padded = model_args.get("padded_vocab_size")
    if padded is not None and int(padded) < hf["padded_vocab_size"]:
        raise UserInputError(f"{prefix}.padded_vocab_size is {padded} but {where} says vocab_size "
                             f"{hf['padded_vocab_size']}; set it to at least that or drop the key.")


def arch_from_hf_or_yaml(model_args: Mapping[str, Any], hf_dir: str, model_name: Optional[str] = None) -> dict[str, Any]:
    """The yaml's keys (checked against config.json) plus the architecture keys it leaves out,
    from config.json. padded_vocab_size defaults to config.json's vocab_size (the embedding rows)."""
    check_arch_against_hf(model_args, hf_dir, model_name)
    out = dict(model_args)
    for key, value in hf_arch(hf_dir).items():
        if out.get(key) is None:
            out[key] = value
    return out
