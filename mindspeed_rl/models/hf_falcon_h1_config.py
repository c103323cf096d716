"""Falcon-H1's config.json (model_type falcon_h1) as Megatron-named args, without megatron.

Falcon-H1 (0.5B to 34B, Falcon-H1R) runs attention and Mamba-2 side by side in every layer on the same normed
input, their outputs summed into one residual add, then a SwiGLU MLP (models/parallel_hybrid.py). Its muP
multipliers scale the embeddings, the logits, the attention's input, keys and output, the Mamba-2 mixer's input,
the five parts of its in_proj output (z, x, B, C, dt: ssm_multipliers) and its output, and the MLP's gate and
output (mlp_multipliers). Its Mamba-2 is Granite 4.0-H's (models/mamba2.py) with an inner width of its own
(mamba_d_ssm) and the gated RMSNorm optional (mamba_rms_norm). transformers and vLLM apply every multiplier to
activations; so does this project, and the parameters stay theirs.

Mamba-2's step dt = softplus(dt_raw + dt_bias) is used within config.json's time_step_limit, (0, inf) in the
releases: unclamped, as vLLM runs it (transformers 5 clamps it from below at time_step_min in its chunked scan).
"""
from __future__ import annotations

from typing import Any, Mapping

# transformers' FalconH1Config defaults for the keys a config.json may leave out (mamba_d_ssm: its null means
# mamba_expand x hidden_size, so it is filled only where the key is absent)
DEFAULTS = {"rms_norm_eps": 1e-5, "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4,
            "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_rms_norm": False,
            "lm_head_multiplier": 1.0, "embedding_multiplier": 1.0, "key_multiplier": 1.0,
            "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0, "ssm_in_multiplier": 1.0,
            "ssm_out_multiplier": 1.0, "mlp_multipliers": [1.0, 1.0], "ssm_multipliers": [1.0] * 5,
            "max_position_embeddings": 8192, "tie_word_embeddings": False, "num_key_value_heads": 8}
MULTIPLIERS = {"attention_in_multiplier": "attention_in_multiplier", "attention_out_multiplier": "attention_out_multiplier",
               "ssm_in_multiplier": "ssm_in_multiplier", "ssm_out_multiplier": "ssm_out_multiplier",
               "key_multiplier": "key_multiplier"}  # config.json key -> Megatron-named arg


def falcon_h1_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """config.json with transformers' defaults filled in. Refuses, one sentence each, what transformers and vLLM
    would compute differently or what the releases do not have."""
    d_ssm_absent = "mamba_d_ssm" not in hf
    hf = {**hf, **{k: v for k, v in DEFAULTS.items() if hf.get(k) is None}}
    if d_ssm_absent:
        hf["mamba_d_ssm"] = 1024
    for key, what in (("attention_bias", "biases on q / k / v / o"), ("mlp_bias", "biases on the MLP"),
                      ("projectors_bias", "a bias on the Mamba-2 out_proj"),
                      ("mamba_proj_bias", "biases on the Mamba-2 in_proj / out_proj")):
        if hf.get(key):
            raise ValueError(f"config.json {key}=true ({what}) is not supported for falcon_h1: vLLM's Falcon-H1 builds "
                             f"them otherwise than transformers; the releases have none.")
    if hf["mamba_rms_norm"] and hf.get("mamba_norm_before_gate", True) is not False:
        raise ValueError("config.json mamba_rms_norm=true needs mamba_norm_before_gate=false (the releases' value; "
                         "absent, transformers takes true): transformers' CPU path normalises before the gate, vLLM "
                         "after it, so the two would disagree.")
    if hf.get("attn_layer_indices") is not None:
        raise ValueError(f"config.json attn_layer_indices {hf['attn_layer_indices']} is not supported: transformers' "
                         f"Falcon-H1 runs attention in every layer; set it null.")
    if hf.get("mamba_use_mlp") is False:
        raise ValueError("config.json mamba_use_mlp=false is not supported: transformers' and vLLM's Falcon-H1 have an "
                         "MLP in every layer.")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if hf.get("rope_theta") is None and not (isinstance(rope, Mapping) and rope.get("rope_theta") is not None):
        raise ValueError("config.json of a falcon_h1 model has no rope_theta: transformers would take 10000 and vLLM "
                         "1e11; set it (the releases have 1e11).")
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    if hf.get("attn_rotary_emb") not in (None, head_dim):
        raise ValueError(f"config.json attn_rotary_emb {hf['attn_rotary_emb']} (RoPE on part of each head, which only "
                         f"vLLM reads) is not supported; the releases rotate whole heads ({head_dim}).")
    for key, n in (("ssm_multipliers", 5), ("mlp_multipliers", 2)):
        if not isinstance(hf[key], (list, tuple)) or len(hf[key]) != n:
            raise ValueError(f"config.json {key} must list {n} numbers; it is {hf[key]!r}.")
    return hf


def falcon_h1_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The Megatron-named args beyond the common ones, from falcon_h1_config's output: every layer parallel_hybrid
    with its Mamba-2 sizes, and the multipliers."""
    from mindspeed_rl.models.mamba_layout import mamba_step_limit

    mamba_step_limit(hf)
    hidden, heads = int(hf["hidden_size"]), int(hf["mamba_n_heads"])
    inner = int(hf["mamba_d_ssm"]) if hf.get("mamba_d_ssm") is not None else int(hf["mamba_expand"]) * hidden
    head_dim = hf.get("mamba_d_head")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if head_dim * heads != inner:
        raise ValueError(f"config.json mamba_n_heads {heads} x mamba_d_head {head_dim} must equal the Mamba-2 inner "
                         f"width {inner} (mamba_d_ssm, or mamba_expand x hidden_size where it is null).")
    gate, down = (float(m) for m in hf["mlp_multipliers"])
    return {"parallel_hybrid": True, "mamba_num_heads": heads, "mamba_head_dim": head_dim,
            "mamba_num_groups": int(hf["mamba_n_groups"]), "mamba_state_dim": int(hf["mamba_d_state"]),
            "mamba_conv_kernel": int(hf["mamba_d_conv"]), "mamba_chunk_size": int(hf["mamba_chunk_size"]),
            "mamba_conv_bias": hf["mamba_conv_bias"] is not False, "mamba_norm": bool(hf["mamba_rms_norm"]),
            "mamba_in_multipliers": [float(m) for m in hf["ssm_multipliers"]],
            "embedding_multiplier_scale": float(hf["embedding_multiplier"]),
            "output_multiplier_scale": float(hf["lm_head_multiplier"]),
            **{arg: float(hf[key]) for key, arg in MULTIPLIERS.items()},
            "mlp_gate_multiplier": gate, "mlp_down_multiplier": down}


def falcon_h1_export_config(args: Mapping[str, Any], vocab_size: int, dtype) -> dict[str, Any]:
    """Falcon-H1's config.json (falcon_h1, FalconH1ForCausalLM) for a parallel_hybrid model, read back the same by
    falcon_h1_config / falcon_h1_args: its attention and MLP those of a Llama config.json (what else the args say is
    refused there), every multiplier and Mamba-2 size written out."""
    from mindspeed_rl.models.hf_export_config import _config_from_args
    from mindspeed_rl.models.mamba_layout import MambaShape

    own = ("parallel_hybrid", "embedding_multiplier_scale", "output_multiplier_scale", "mlp_gate_multiplier",
           "mlp_down_multiplier", *MULTIPLIERS.values())
    rest = {k: v for k, v in args.items() if not k.startswith("mamba_") and k not in own}
    base = _config_from_args(rest, vocab_size, dtype)
    if base["model_type"] != "llama" or not args.get("swiglu", True):
        raise ValueError(f"a parallel_hybrid model has a config.json form only as Falcon-H1 (Llama's attention and "
                         f"SwiGLU MLP beside Mamba-2, without biases or q / k norms); this one's layers are a "
                         f"{base['model_type']}'s.")
    shape = MambaShape.from_args(args)
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "tie_word_embeddings", "rms_norm_eps", "num_hidden_layers", "rope_parameters",
            "rope_theta", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id", "hidden_act")
    config = {k: base[k] for k in keep if k in base}
    config.update(architectures=["FalconH1ForCausalLM"], model_type="falcon_h1", attention_bias=False, mlp_bias=False,
                  projectors_bias=False, mamba_proj_bias=False, mamba_d_ssm=shape.inner, mamba_n_heads=shape.heads,
                  mamba_d_head=shape.head_dim, mamba_n_groups=shape.groups, mamba_d_state=shape.state,
                  mamba_d_conv=shape.conv_kernel, mamba_chunk_size=shape.chunk, mamba_conv_bias=shape.conv_bias,
                  mamba_rms_norm=shape.norm, mamba_norm_before_gate=False, time_step_limit=[0.0, float("inf")],
                  ssm_multipliers=list(shape.in_multipliers or [1.0] * 5),
                  embedding_multiplier=float(args.get("embedding_multiplier_scale") or 1.0),
                  lm_head_multiplier=float(args.get("output_multiplier_scale") or 1.0),
                  mlp_multipliers=[float(args.get("mlp_gate_multiplier") or 1.0),
                                   float(args.get("mlp_down_multiplier") or 1.0)],
                  **{key: float(args.get(arg) or 1.0) for key, arg in MULTIPLIERS.items()})
    if "rope_theta" not in config:  # (transformers 5 keeps it in rope_parameters; written at the top level too)
        config["rope_theta"] = float((config.get("rope_parameters") or {}).get("rope_theta", args.get("rotary_base", 1e4)))
    return config
