"""nanochat's config.json (model_type nanochat: karpathy/nanochat-d32 and the models its users train with nanochat's
scripts, in transformers' NanoChatForCausalLM form) as Megatron-named args, and back, without megatron.

nanochat is Llama's decoder layer with every norm an RMSNorm without a weight (before attention and MLP, the final
one, per head on the queries and keys, and on the embeddings before the first layer), RoPE turning each pair by minus
its angle, an MLP without a gate, fc2(relu(fc1(x))^2), untied, and the logits soft-capped at 15 (models/nanochat.py
says how each maps onto megatron). hf_config.model_config_from_hf reads it (nanochat_args) and nanochat_export_config
writes it back the same. vLLM 0.32 has no nanochat module of its own and serves it with its Transformers backend
(transformers' NanoChatForCausalLM with vLLM's attention: tests/vllm/test_vllm_more_archs.py, extended).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

# transformers' NanoChatConfig defaults for the keys the common reading (models/hf_config.py) takes otherwise
DEFAULTS = {"hidden_act": "relu2", "max_position_embeddings": 2048}
# what nanochat's layers are, in Megatron-named args (the soft cap: nanochat_args, from config.json)
LAYOUT = {"swiglu": False, "squared_relu": True, "layernorm_affine": False, "qk_layernorm": True, "embedding_norm": True,
          "rotary_negated": True}


def nanochat_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """LAYOUT, with config.json's final_logit_softcapping (transformers' default 15 where the key is absent; null:
    none) as output_logit_softcapping."""
    cap = hf.get("final_logit_softcapping", 15.0)
    return {**LAYOUT, **({"output_logit_softcapping": float(cap)} if cap else {})}


def nanochat_export_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """config.json (nanochat, NanoChatForCausalLM) for megatron args with nanochat's weightless norms or its negated
    RoPE; what its config.json cannot say is refused in one sentence."""
    from mindspeed_rl.models.hf_export_base import base_config, plain_scaling, rope_parameters  # (it imports hf_config)
    problems = [what for what, bad in (
        *((f"{k}: {str(v).lower()}", args.get(k, k == "layernorm_affine") != v) for k, v in LAYOUT.items()),
        ("normalization RMSNorm", args.get("normalization", "RMSNorm") != "RMSNorm"),
        ("no biases", args.get("add_qkv_bias") or args.get("disable_bias_linear") is False),
        ("norms before attention and MLP only", args.get("pre_norm") is False or args.get("post_norm")
         or args.get("qk_layernorm_across_heads") or args.get("qk_layernorm_after_rope")),
        ("full attention with RoPE on the whole head in every layer", args.get("sliding_window")
         or args.get("no_rope_freq") or args.get("window_attn_skip_freq") is not None
         or float(args.get("rotary_percent") or 1.0) != 1.0 or args.get("rotary_interleaved")),
        ("no experts", int(args.get("num_experts") or 0) > 1),
        ("no multipliers or attention soft cap", not plain_scaling(args) or args.get("attn_logit_softcapping")
         or args.get("input_embeds_norm")),
    ) if bad]
    if problems:
        raise ValueError(f"weightless RMSNorms (layernorm_affine: false), embedding_norm and rotary_negated have a "
                         f"config.json form only as nanochat, which needs {'; '.join(problems)}.")
    config = base_config(args, vocab_size, dtype, "nanochat", "NanoChatForCausalLM", rope_parameters(args), eps=1e-6)
    cap = args.get("output_logit_softcapping")
    config.update(hidden_act="relu2", attention_bias=False, final_logit_softcapping=float(cap) if cap else None)
    return config
