"""Granite's config.json (granite, granitemoe, granitemoeshared, granitemoehybrid) as Megatron-named args and back,
without megatron: Granite's four scalars (granite_args), Granite 4.0's layers (granite_hybrid_config: its shared_mlp as
the MLP of the dense models; granite_hybrid_args: the -H models' Mamba-2 layers), and the config.json written from the
args for Granite MoE (granite_moe_config) and Granite 4.0-H (granite_hybrid_export_config). models/hf_config.py and
models/hf_export_config.py call them.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from mindspeed_rl.models.hf_moe_config import expert_count
from mindspeed_rl.models.mamba_layout import mamba_step_limit


def granite_hybrid_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A Granite 4.0 config.json (granitemoehybrid) as the Granite model it is: dense ones (Granite 4.0-350M / 1B
    / Micro, and the -H 350M / 1B / Micro) have their shared_mlp as the MLP (shared_intermediate_size wide, read as
    intermediate_size); ones with experts are granitemoeshared's layers. Its Mamba-2 layers (the -H models) are
    granite_hybrid_args'."""
    shared = int(hf.get("shared_intermediate_size") or 0)
    if shared <= 0:
        raise ValueError(f"config.json shared_intermediate_size {hf.get('shared_intermediate_size')} of a "
                         f"granitemoehybrid model must be positive: it is the width of every layer's shared_mlp.")
    return {**hf, "intermediate_size": shared} if not expert_count(hf) else dict(hf)


def granite_hybrid_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """Granite 4.0's layer kinds: Mamba-2 in the layers layer_types calls mamba (transformers: linear_attention;
    models/mamba2.py, its sizes Megatron-LM's mamba_* keys), attention in the others; attention without RoPE
    (position_embedding_type nope or null: the -H models) as megatron's no_rope_freq on every layer."""
    kinds = list(hf.get("layer_types") or hf.get("layers_block_type") or ["mamba"] * num_layers)
    mamba_kinds, attention_kinds = ("mamba", "linear_attention"), ("attention", "full_attention")
    unknown = sorted({k for k in kinds[:num_layers] if k not in (*mamba_kinds, *attention_kinds)})
    if unknown or len(kinds) < num_layers:
        raise ValueError(f"config.json layer_types must name mamba or attention for each of {num_layers} layers; it has "
                         f"{len(kinds)} entries{', and ' + ', '.join(map(repr, unknown)) if unknown else ''}.")
    args: dict[str, Any] = {}
    if hf.get("position_embedding_type") not in ("rope",):
        if hf.get("position_embedding_type") not in (None, "nope"):
            raise ValueError(f"config.json position_embedding_type {hf.get('position_embedding_type')!r} of a "
                             f"granitemoehybrid model is not supported; its releases say 'rope' or 'nope'.")
        args["no_rope_freq"] = [1] * num_layers
    marks = [int(k in mamba_kinds) for k in kinds[:num_layers]]
    if not any(marks):
        return args
    if hf.get("mamba_proj_bias"):
        raise ValueError("config.json mamba_proj_bias=true (biases on the Mamba-2 in_proj / out_proj) is not supported; "
                         "Granite 4.0-H's releases have none.")
    mamba_step_limit(hf)
    heads, hidden = int(hf["mamba_n_heads"]), int(hf["hidden_size"])
    inner = int(hf.get("mamba_expand") or 2) * hidden
    head_dim = hf.get("mamba_d_head")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if head_dim * heads != inner:
        raise ValueError(f"config.json mamba_n_heads {heads} x mamba_d_head {head_dim} must equal mamba_expand x "
                         f"hidden_size = {inner} (the Mamba-2 inner width).")
    return {**args, "mamba_layers": marks, "mamba_num_heads": heads, "mamba_head_dim": head_dim,
            "mamba_num_groups": int(hf.get("mamba_n_groups") or 1), "mamba_state_dim": int(hf["mamba_d_state"]),
            "mamba_conv_kernel": int(hf.get("mamba_d_conv") or 4),
            "mamba_chunk_size": int(hf.get("mamba_chunk_size") or 256),
            "mamba_conv_bias": hf.get("mamba_conv_bias", True) is not False}


def granite_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Granite (3.x dense, and the MoE models: granitemoe, granitemoeshared, granitemoehybrid) is Llama with four scalars: the embeddings times embedding_multiplier,
    each attention / MLP output times residual_multiplier before its residual add, the logits
    divided by logits_scaling, and attention_multiplier in place of 1 / sqrt(head_dim)
    (models/multipliers.py; MindSpeed-LLM's embedding / output multiplier names)."""
    return {"embedding_multiplier_scale": float(hf.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(hf.get("residual_multiplier", 1.0)),
            "output_multiplier_scale": 1.0 / float(hf.get("logits_scaling", 1.0)),
            "softmax_scale": float(hf.get("attention_multiplier", 1.0))}


def granite_moe_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Granite's MoE config.json for an MoE model with Granite's scalars (granite_args and
    hf_moe_config.granite_moe_args, read back the same): granitemoe (GraniteMoeForCausalLM) without a shared expert,
    granitemoeshared (GraniteMoeSharedForCausalLM) with one without a gate; both need every layer MoE with
    Mixtral's routing (softmax, the top-k renormalised; no expert bias, groups or routed scale) and a Llama-style
    attention (no biases or q / k norms, pre-norms only, full rotary on whole heads, full attention)."""
    from mindspeed_rl.models.hf_bridge.mapping import gated_mlp
    from mindspeed_rl.models.hf_bridge.sharding import moe_layers
    from mindspeed_rl.models.hf_export_base import GRANITE_SCALARS, base_config, rope_parameters

    heads = int(args["num_attention_heads"])
    shared = int(args.get("moe_shared_expert_intermediate_size") or 0)
    problems = [what for what, bad in (
        ("every layer an MoE layer (moe_layer_freq)", not all(moe_layers(args))),
        ("softmax routing with the top-k renormalised, without an expert bias, groups or routed scale",
         (args.get("moe_router_score_function") or "softmax") != "softmax" or args.get("moe_router_enable_expert_bias")
         or int(args.get("moe_router_num_groups") or 1) > 1 or float(args.get("moe_router_topk_scaling_factor") or 1.0) != 1.0
         or not args.get("norm_topk_prob", not args.get("moe_router_pre_softmax", False))),
        ("a shared expert without a gate, or none", shared and args.get("shared_expert_gate")),
        ("no biases or q / k norms, norms before attention and MLP only (add_qkv_bias, qk_layernorm, post_norm)",
         args.get("add_qkv_bias") or args.get("disable_bias_linear") is False or args.get("qk_layernorm")
         or args.get("post_norm") or args.get("pre_norm") is False or not gated_mlp(args)),
        ("full rotary on Llama's pairs of whole heads, full attention in every layer",
         float(args.get("rotary_percent") or 1.0) != 1.0 or args.get("rotary_interleaved") or args.get("sliding_window")
         or args.get("no_rope_freq") or args.get("multi_latent_attention")
         or int(args.get("kv_channels") or args["hidden_size"] // heads) * heads != int(args["hidden_size"])),
    ) if bad]
    if problems:
        raise ValueError(f"an MoE model with Granite's multipliers has a config.json form only as Granite MoE "
                         f"(granitemoe / granitemoeshared), which needs {'; '.join(problems)}.")
    model_type, cls = ("granitemoeshared", "GraniteMoeSharedForCausalLM") if shared else ("granitemoe",
                                                                                          "GraniteMoeForCausalLM")
    config = base_config(args, vocab_size, dtype, model_type, cls, rope_parameters(args), eps=1e-6)
    scale = {k: float(args.get(k) or 1.0) for k in GRANITE_SCALARS}
    config.update(hidden_act="silu", attention_bias=False, intermediate_size=int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]),
                  num_local_experts=int(args["num_experts"]), num_experts_per_tok=int(args.get("moe_router_topk") or 2),
                  embedding_multiplier=scale["embedding_multiplier_scale"], residual_multiplier=scale["residual_multiplier"],
                  logits_scaling=1.0 / scale["output_multiplier_scale"],
                  attention_multiplier=float(args.get("softmax_scale") or config["head_dim"] ** -0.5))
    if shared:
        config["shared_intermediate_size"] = shared
    return config


def granite_hybrid_export_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Granite 4.0-H's config.json (granitemoehybrid, GraniteMoeHybridForCausalLM) for a model with Mamba-2 layers
    (mamba_layers; granite_hybrid_args, read back the same): the other layers' attention and every
    layer's MLP as Granite's dense model (the MLP its shared_mlp) or Granite MoE with a shared MLP (granitemoeshared's
    layers), attention with RoPE in every attention layer or in none (no_rope_freq: position_embedding_type nope)."""
    from mindspeed_rl.models.hf_config import no_rope_pattern
    from mindspeed_rl.models.hf_export_config import _config_from_args
    from mindspeed_rl.models.mamba_layout import MambaShape

    layers = int(args["num_layers"])
    no_rope = no_rope_pattern(args.get("no_rope_freq"), layers) or [0] * layers
    if 0 < sum(no_rope) < layers:
        raise ValueError("a model with Mamba-2 layers has a config.json form only as Granite 4.0-H, whose attention "
                         "layers all apply RoPE or none does (position_embedding_type); no_rope_freq marks some.")
    rest = {k: v for k, v in args.items() if not k.startswith("mamba_") and k != "no_rope_freq"}
    moe = int(args.get("num_experts") or 0) > 1
    if moe and not args.get("moe_shared_expert_intermediate_size"):
        raise ValueError("an MoE model with Mamba-2 layers has a config.json form only as Granite 4.0-H, whose layers "
                         "have a shared MLP beside the experts (moe_shared_expert_intermediate_size).")
    base = granite_moe_config(rest, vocab_size, dtype) if moe else _config_from_args(rest, vocab_size, dtype)
    if base["model_type"] not in ("llama", "granite", "granitemoeshared"):
        raise ValueError(f"a model with Mamba-2 layers has a config.json form only as Granite 4.0-H (Granite's or "
                         f"Llama's attention and MLP around them); this one's other layers are a {base['model_type']}'s.")
    shape = MambaShape.from_args(args)
    d = base["head_dim"]
    base.update(model_type="granitemoehybrid", architectures=["GraniteMoeHybridForCausalLM"],
                layer_types=["mamba" if m else "attention" for m in args["mamba_layers"]],
                position_embedding_type="nope" if any(no_rope) else "rope",
                embedding_multiplier=float(args.get("embedding_multiplier_scale") or 1.0),
                residual_multiplier=float(args.get("residual_multiplier") or 1.0),
                logits_scaling=1.0 / float(args.get("output_multiplier_scale") or 1.0),
                attention_multiplier=float(args.get("softmax_scale") or d ** -0.5),
                mamba_n_heads=shape.heads, mamba_d_head=shape.head_dim, mamba_n_groups=shape.groups,
                mamba_d_state=shape.state, mamba_d_conv=shape.conv_kernel, mamba_chunk_size=shape.chunk,
                mamba_conv_bias=shape.conv_bias, mamba_proj_bias=False,
                mamba_expand=shape.inner // int(args["hidden_size"]) if shape.inner % int(args["hidden_size"]) == 0
                else shape.inner / int(args["hidden_size"]))
    if not moe:
        base.update(shared_intermediate_size=int(args["ffn_hidden_size"]), num_local_experts=0)
    return base
