"""config.json writers of the models with LayerNorms (normalization: LayerNorm) for models/hf_export_config.py:
StableLM 2 (gated MLP), StarCoder2 (tanh-GELU MLP without a gate), Nemotron (LayerNorm1P, squared-ReLU MLP) and
Cohere / Cohere 2 (weight-only LayerNorms in a parallel-residual layer), Phi-2 (that layer with LayerNorm biases),
GPT-NeoX (that layer with the MLP's own norm, or the usual one; exact GELU or partial RoPE without a gate). Each is
read back the same by models/hf_layernorm_config.py; a combination none of them can say is refused in one sentence.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from mindspeed_rl.models.hf_bridge.mapping import gated_mlp
from mindspeed_rl.models.hf_export_base import (base_config, head_dim_is_quotient, layer_types_config, plain_scaling,
                                                pre_norms_only, rope_parameters, sliding_nope_layout)


def partial_rope(args: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's rope_parameters with the rotated fraction of each head (rotary_percent) as partial_rotary_factor,
    which the writers here also put at the top level."""
    return dict(rope_parameters(args), partial_rotary_factor=float(args.get("rotary_percent") or 1.0))


def llama_rope_everywhere(args: Mapping[str, Any]) -> bool:
    """RoPE on Llama's pairs in every layer, full attention, no Granite multipliers or softmax_scale (what Phi-2's,
    GPT-NeoX's, StableLM's and Nemotron's config.json can say)."""
    return not (args.get("rotary_interleaved") or args.get("sliding_window") or args.get("no_rope_freq")
                or args.get("window_attn_skip_freq") is not None or not plain_scaling(args))


def layernorm_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """The config.json of a model with LayerNorms: Cohere's for weight-only LayerNorms, Phi-2's for parallel_residual
    with an output-layer bias, Nemotron's for apply_layernorm_1p, Jais 2's for squared_relu, StableLM's for a gated MLP; for an MLP without a gate
    in a parallel-residual layer, or with exact GELU or partial RoPE, GPT-NeoX's with biases on every linear layer,
    multi-head attention and two norms (or the sequential layer), Falcon's otherwise; StarCoder2's for the rest."""
    if args.get("layernorm_affine") is False:
        return olmo1_config(args, vocab_size, dtype)
    if args.get("layernorm_bias") is False:
        return cohere_config(args, vocab_size, dtype)
    if args.get("parallel_residual") and args.get("add_output_layer_bias"):
        return phi_config(args, vocab_size, dtype)
    if args.get("apply_layernorm_1p"):
        return nemotron_config(args, vocab_size, dtype)
    if args.get("squared_relu"):  # relu(x)^2 without LayerNorm1P: Jais 2's
        return nemotron_config(args, vocab_size, dtype, jais2=True)
    if gated_mlp(args) and not args.get("parallel_residual"):
        return stablelm_config(args, vocab_size, dtype)
    if args.get("parallel_residual") or not args.get("openai_gelu") or float(args.get("rotary_percent") or 1.0) != 1.0:
        neox = (args.get("disable_bias_linear", True) is False and args.get("add_qkv_bias")
                and not multi_query_groups(args)
                and bool(args.get("parallel_residual_mlp_norm")) == bool(args.get("parallel_residual")))
        return (gpt_neox_config if neox else falcon_config)(args, vocab_size, dtype)
    return starcoder2_config(args, vocab_size, dtype)


def olmo1_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """OLMo 1's config.json (olmo, OlmoForCausalLM) for a model with LayerNorms without weight or bias
    (layernorm_affine: false, eps 1e-5): Llama's layout otherwise (a dense SwiGLU MLP, no biases, norms before attention
    and MLP only, RoPE on Llama's pairs of whole heads of hidden_size / num_attention_heads), clip_qkv where set."""
    problems = [what for what, bad in (
        ("a dense SwiGLU MLP without biases", int(args.get("num_experts") or 0) > 1 or not gated_mlp(args)
         or args.get("geglu") or args.get("add_qkv_bias") or args.get("disable_bias_linear") is False
         or args.get("multi_latent_attention")),
        ("norms before attention and MLP only, in sequence (no q / k norms, parallel_residual or apply_layernorm_1p)",
         not pre_norms_only(args) or args.get("parallel_residual") or args.get("apply_layernorm_1p")),
        ("norm_epsilon 1e-5 (OLMo's LayerNorm says no other)", float(args.get("norm_epsilon") or 1e-5) != 1e-5),
        ("RoPE on Llama's pairs of whole heads in every layer, full attention, no Granite multipliers or softmax_scale",
         not llama_rope_everywhere(args) or float(args.get("rotary_percent") or 1.0) != 1.0),
        ("head dimension hidden_size / num_attention_heads", not head_dim_is_quotient(args)),
    ) if bad]
    if problems:
        raise ValueError(f"layernorm_affine: false has a config.json form only as OLMo (olmo), which needs "
                         f"{'; '.join(problems)}.")
    config = base_config(args, vocab_size, dtype, "olmo", "OlmoForCausalLM", rope_parameters(args), eps=1e-5)
    config.update(hidden_act="silu", attention_bias=False, pad_token_id=None,
                  clip_qkv=float(args["clip_qkv"]) if args.get("clip_qkv") is not None else None)
    for key in ("head_dim", "rms_norm_eps"):
        config.pop(key)
    return config


def multi_query_groups(args: Mapping[str, Any]) -> int:
    """Key / value heads when fewer than the attention heads (group_query_attention), else 0."""
    groups = int(args.get("num_query_groups") or 0) if args.get("group_query_attention") else 0
    return groups if groups != int(args["num_attention_heads"]) else 0


def falcon_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Falcon's config.json (falcon, FalconForCausalLM) for a model with LayerNorms that have biases and an MLP without a
    gate: exact gelu, biases on every linear layer or none (bias), RoPE on Llama's pairs of whole heads of
    hidden_size / num_attention_heads, full attention. The layer: parallel_residual with the MLP's own norm is
    new_decoder_architecture (ln_attn, ln_mlp); with one norm, multi_query for one key / value head, one per head
    (multi_query false), else new_decoder_architecture with num_ln_in_parallel_attn 1 (Falcon2-11B); the sequential
    layer (parallel_attn false) with one key / value head or one per head."""
    heads, groups = int(args["num_attention_heads"]), multi_query_groups(args)
    parallel, two_norms = bool(args.get("parallel_residual")), bool(args.get("parallel_residual_mlp_norm"))
    problems = [what for what, bad in (
        ("LayerNorms with biases before attention and MLP only (no apply_layernorm_1p or q / k norms)",
         args.get("layernorm_bias", True) is False or args.get("apply_layernorm_1p") or not pre_norms_only(args)),
        ("a dense MLP without a gate, exact gelu (no openai_gelu)",
         int(args.get("num_experts") or 0) > 1 or gated_mlp(args) or args.get("openai_gelu") or args.get("squared_relu")
         or args.get("xielu") or args.get("multi_latent_attention")),
        ("biases on every linear layer or none (add_qkv_bias as disable_bias_linear: false), none on the output layer",
         bool(args.get("add_qkv_bias")) != (args.get("disable_bias_linear", True) is False)
         or args.get("add_output_layer_bias")),
        ("one key / value head or one per head in a layer without parallel_residual",
         not parallel and groups not in (0, 1)),
        ("RoPE on Llama's pairs of whole heads in every layer, full attention, no Granite multipliers or softmax_scale",
         not llama_rope_everywhere(args) or float(args.get("rotary_percent") or 1.0) != 1.0),
        ("head dimension hidden_size / num_attention_heads", not head_dim_is_quotient(args)),
    ) if bad]
    if problems:
        raise ValueError(f"normalization LayerNorm with an MLP without a gate has a config.json form here only as "
                         f"GPT-NeoX (biases everywhere, multi-head) or Falcon (falcon), which needs {'; '.join(problems)}.")
    new_arch = two_norms or (parallel and groups > 1)
    config = base_config(args, vocab_size, dtype, "falcon", "FalconForCausalLM", rope_parameters(args), eps=1e-5)
    config.update(activation="gelu", layer_norm_epsilon=config.pop("rms_norm_eps"), bias=bool(args.get("add_qkv_bias")),
                  alibi=False, parallel_attn=parallel, new_decoder_architecture=new_arch,
                  multi_query=groups == 1 and not new_arch, num_kv_heads=(groups or heads) if new_arch else heads,
                  num_ln_in_parallel_attn=(2 if two_norms else 1) if new_arch else None,
                  ffn_hidden_size=config.pop("intermediate_size"), attention_dropout=0.0, hidden_dropout=0.0,
                  pad_token_id=None)
    for key in ("head_dim", "num_key_value_heads"):
        config.pop(key)
    return config


def phi_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Phi-2's config.json (phi, PhiForCausalLM) for a parallel-residual model with LayerNorms that have biases: biases on
    every linear layer and on the output layer (add_output_layer_bias), an MLP without a gate, gelu with the tanh
    approximation (openai_gelu), RoPE on Llama's pairs of the first rotary_percent of each head of hidden_size /
    num_attention_heads, full attention, untied embeddings."""
    problems = [what for what, bad in (
        ("one LayerNorm with a bias before attention and MLP together (parallel_residual, no apply_layernorm_1p or q / k "
         "norms)", not args.get("parallel_residual") or args.get("apply_layernorm_1p") or not pre_norms_only(args)),
        ("a dense MLP without a gate, gelu with the tanh approximation (openai_gelu)",
         int(args.get("num_experts") or 0) > 1 or not args.get("openai_gelu") or args.get("multi_latent_attention")),
        ("biases on every linear layer and on the output layer (add_qkv_bias, disable_bias_linear: false, "
         "add_output_layer_bias)", not args.get("add_qkv_bias") or args.get("disable_bias_linear", True) is not False
         or not args.get("add_output_layer_bias")),
        ("RoPE on Llama's pairs in every layer, full attention, untied embeddings, no Granite multipliers or softmax_scale",
         not llama_rope_everywhere(args) or not args.get("untie_embeddings_and_output_weights")),
        ("head dimension hidden_size / num_attention_heads", not head_dim_is_quotient(args)),
    ) if bad]
    if problems:
        raise ValueError(f"parallel_residual with LayerNorm biases has a config.json form only as Phi-2 (phi), which "
                         f"needs {'; '.join(problems)}.")
    rope = partial_rope(args)
    config = base_config(args, vocab_size, dtype, "phi", "PhiForCausalLM", rope, eps=1e-5)
    config.update(hidden_act="gelu_new", layer_norm_eps=config.pop("rms_norm_eps"), qk_layernorm=False,
                  partial_rotary_factor=rope["partial_rotary_factor"], resid_pdrop=0.0, embd_pdrop=0.0,
                  attention_dropout=0.0, pad_token_id=None)
    config.pop("head_dim")
    return config


def gpt_neox_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """GPT-NeoX's config.json (gpt_neox, GPTNeoXForCausalLM) for a model with LayerNorms that have biases and biases on
    every linear layer: multi-head attention, an MLP without a gate, gelu (exact; openai_gelu: the tanh one,
    gelu_new), RoPE on Llama's pairs of the first rotary_percent of each head of hidden_size / num_attention_heads,
    full attention; use_parallel_residual for parallel_residual with the MLP's own norm (parallel_residual_mlp_norm),
    else megatron's usual layer. Both RoPE spellings are written (rope_parameters: transformers 5; rotary_pct /
    rotary_emb_base: 4.x)."""
    parallel = bool(args.get("parallel_residual"))
    problems = [what for what, bad in (
        ("the MLP's own norm in a parallel-residual layer (parallel_residual_mlp_norm) or no parallel residual",
         parallel != bool(args.get("parallel_residual_mlp_norm"))),
        ("LayerNorms with biases before attention and MLP only (no apply_layernorm_1p or q / k norms)",
         args.get("layernorm_bias", True) is False or args.get("apply_layernorm_1p") or not pre_norms_only(args)),
        ("a dense MLP without a gate and gelu (exact, or openai_gelu)",
         int(args.get("num_experts") or 0) > 1 or gated_mlp(args) or args.get("squared_relu") or args.get("xielu")
         or args.get("multi_latent_attention")),
        ("biases on every linear layer and none on the output layer (add_qkv_bias, disable_bias_linear: false)",
         not args.get("add_qkv_bias") or args.get("disable_bias_linear", True) is not False
         or args.get("add_output_layer_bias")),
        ("multi-head attention (no group_query_attention)",
         args.get("group_query_attention") and int(args.get("num_query_groups") or 0) != int(args["num_attention_heads"])),
        ("RoPE on Llama's pairs in every layer, full attention, no Granite multipliers or softmax_scale",
         not llama_rope_everywhere(args)),
        ("head dimension hidden_size / num_attention_heads", not head_dim_is_quotient(args)),
    ) if bad]
    if problems:
        raise ValueError(f"normalization LayerNorm with an MLP without a gate and exact GELU, partial RoPE or a parallel "
                         f"residual with two norms has a config.json form only as GPT-NeoX (gpt_neox), which needs "
                         f"{'; '.join(problems)}.")
    rope = partial_rope(args)
    config = base_config(args, vocab_size, dtype, "gpt_neox", "GPTNeoXForCausalLM", rope, eps=1e-5)
    config.update(hidden_act="gelu_new" if args.get("openai_gelu") else "gelu",
                  layer_norm_eps=config.pop("rms_norm_eps"), use_parallel_residual=parallel, attention_bias=True,
                  rotary_pct=rope["partial_rotary_factor"], rotary_emb_base=rope["rope_theta"], attention_dropout=0.0,
                  hidden_dropout=0.0, pad_token_id=None)
    for key in ("head_dim", "num_key_value_heads", "rope_theta"):
        config.pop(key)
    return config


def cohere_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Cohere's config.json (cohere, CohereForCausalLM) or Cohere 2's (cohere2, Cohere2ForCausalLM: with sliding
    layers) for a parallel-residual model with weight-only LayerNorms: SwiGLU without biases, RoPE on interleaved
    pairs of whole heads of hidden_size / num_attention_heads, tied embeddings, the logits times logit_scale
    (output_multiplier_scale); every layer full with RoPE (cohere), or sliding layers with RoPE where
    window_attn_skip_freq marks them and full ones without (cohere2). Other combinations have no form."""
    hybrid, fits = sliding_nope_layout(args)
    problems = [what for what, bad in (
        ("one weight-only LayerNorm before attention and MLP together (parallel_residual, layernorm_bias: false, no "
         "apply_layernorm_1p or q / k norms)",
         not args.get("parallel_residual") or args.get("layernorm_bias", True) is not False
         or args.get("apply_layernorm_1p") or not pre_norms_only(args)),
        ("a dense SwiGLU MLP without biases", int(args.get("num_experts") or 0) > 1 or not gated_mlp(args)
         or args.get("geglu") or args.get("add_qkv_bias") or args.get("disable_bias_linear") is False
         or args.get("multi_latent_attention")),
        ("RoPE on interleaved pairs of whole heads (rotary_interleaved), tied embeddings, no Granite multipliers but "
         "the logits' (output_multiplier_scale) or softmax_scale",
         not args.get("rotary_interleaved") or float(args.get("rotary_percent") or 1.0) != 1.0
         or args.get("untie_embeddings_and_output_weights") or args.get("softmax_scale")
         or float(args.get("embedding_multiplier_scale") or 1.0) != 1.0
         or float(args.get("residual_multiplier") or 1.0) != 1.0),
        ("RoPE in every layer without windows, or in the sliding layers only (no_rope_freq on the full ones)",
         not fits),
        ("head dimension hidden_size / num_attention_heads", not head_dim_is_quotient(args)),
    ) if bad]
    if problems:
        raise ValueError(f"parallel_residual / layernorm_bias: false have a config.json form only as Cohere (cohere, "
                         f"cohere2), which needs {'; '.join(problems)}.")
    model_type, cls = ("cohere2", "Cohere2ForCausalLM") if hybrid else ("cohere", "CohereForCausalLM")
    config = base_config(args, vocab_size, dtype, model_type, cls, rope_parameters(args), eps=1e-5)
    config.update(hidden_act="silu", layer_norm_eps=config.pop("rms_norm_eps"), use_qk_norm=False,
                  attention_bias=False, logit_scale=float(args.get("output_multiplier_scale") or 1.0), pad_token_id=None)
    config.pop("head_dim")
    if hybrid:
        config.update(layer_types_config(args, config))
    return config


def stablelm_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """StableLM's config.json (stablelm, StableLmForCausalLM) for a model with LayerNorms (weight and bias); models/
    hf_config.py reads it back the same: a dense Llama-style model otherwise (SwiGLU, q / k / v biases or none, no other
    biases, norms before attention and MLP only, no q / k norms, RoPE on Llama's pairs of the first rotary_percent of
    each head, head dimension hidden_size / num_attention_heads, full attention)."""
    problems = [what for what, bad in (
        ("a dense SwiGLU MLP without biases", int(args.get("num_experts") or 0) > 1 or not gated_mlp(args)
         or args.get("geglu") or args.get("disable_bias_linear") is False or args.get("multi_latent_attention")),
        ("norms before attention and MLP only, no q / k norms (pre_norm, no post_norm, qk_layernorm)",
         not pre_norms_only(args)),
        ("RoPE on Llama's pairs in every layer, full attention, no Granite multipliers or softmax_scale",
         not llama_rope_everywhere(args)),
        ("head dimension hidden_size / num_attention_heads", not head_dim_is_quotient(args)),
    ) if bad]
    if problems:
        raise ValueError(f"normalization LayerNorm has a config.json form only as StableLM (stablelm), which needs "
                         f"{'; '.join(problems)}.")
    rope = partial_rope(args)
    config = base_config(args, vocab_size, dtype, "stablelm", "StableLmForCausalLM", rope, eps=1e-5)
    config.update(hidden_act="silu", layer_norm_eps=config.pop("rms_norm_eps"), use_qkv_bias=bool(args.get("add_qkv_bias")),
                  qk_layernorm=False, use_parallel_residual=False, partial_rotary_factor=rope["partial_rotary_factor"],
                  pad_token_id=None)
    config.pop("head_dim")
    return config


def starcoder2_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """StarCoder2's config.json (starcoder2, Starcoder2ForCausalLM) for a model with LayerNorms and an MLP without a gate
    (models/hf_config.py reads it back the same): gelu with the tanh approximation (openai_gelu), biases on every
    linear layer or none (use_bias), norms before attention and MLP only, Llama's RoPE on whole heads of
    hidden_size / num_attention_heads, full attention or one sliding_window in every layer."""
    bias = args.get("disable_bias_linear", True) is False
    problems = [what for what, bad in (
        ("a dense MLP without a gate, gelu with the tanh approximation (openai_gelu)",
         int(args.get("num_experts") or 0) > 1 or not args.get("openai_gelu") or args.get("multi_latent_attention")),
        ("biases on every linear layer or none (add_qkv_bias as disable_bias_linear: false)",
         bool(args.get("add_qkv_bias")) != bias),
        ("norms before attention and MLP only, no q / k norms", not pre_norms_only(args)),
        ("RoPE on Llama's pairs of whole heads in every layer, one window for all layers or none, no Granite "
         "multipliers or softmax_scale",
         float(args.get("rotary_percent") or 1.0) != 1.0 or args.get("rotary_interleaved") or args.get("no_rope_freq")
         or args.get("window_attn_skip_freq") is not None or not plain_scaling(args)),
        ("head dimension hidden_size / num_attention_heads", not head_dim_is_quotient(args)),
    ) if bad]
    if problems:
        raise ValueError(f"normalization LayerNorm with an MLP without a gate has a config.json form only as StarCoder2 "
                         f"(starcoder2), which needs {'; '.join(problems)}.")
    config = base_config(args, vocab_size, dtype, "starcoder2", "Starcoder2ForCausalLM", rope_parameters(args), eps=1e-5)
    config.update(hidden_act="gelu_pytorch_tanh", norm_epsilon=config.pop("rms_norm_eps"), use_bias=bias,
                  sliding_window=int(args["sliding_window"]) if args.get("sliding_window") else None,
                  attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0, pad_token_id=None)
    config.pop("head_dim")
    return config


def nemotron_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype, jais2: bool = False) -> dict[str, Any]:
    """Nemotron's config.json (nemotron, NemotronForCausalLM) for a model with LayerNorm1P (apply_layernorm_1p; models/
    hf_config.py reads it back the same): an MLP without a gate, relu(x)^2 (squared_relu), biases on every linear layer
    or none (attention_bias and mlp_bias), norms before attention and MLP only, RoPE on Llama's pairs of the first
    rotary_percent of each head, full attention. With `jais2`, Jais 2's (jais2, Jais2ForCausalLM) for the same layer
    with plain LayerNorms and RoPE on whole heads."""
    bias = args.get("disable_bias_linear", True) is False
    problems = [what for what, bad in (
        ("a dense MLP without a gate, relu(x)^2 (squared_relu)",
         int(args.get("num_experts") or 0) > 1 or not args.get("squared_relu") or gated_mlp(args)
         or args.get("multi_latent_attention")),
        ("biases on every linear layer or none (add_qkv_bias as disable_bias_linear: false)",
         bool(args.get("add_qkv_bias")) != bias),
        ("norms before attention and MLP only, no q / k norms", not pre_norms_only(args)),
        ("RoPE on Llama's pairs in every layer, full attention, no Granite multipliers or softmax_scale",
         not llama_rope_everywhere(args)),
    ) if bad]
    if jais2 and float(args.get("rotary_percent") or 1.0) != 1.0:
        problems.append("RoPE on whole heads")
    if problems:
        raise ValueError(f"{'squared_relu with LayerNorms' if jais2 else 'apply_layernorm_1p'} has a config.json form "
                         f"only as {'Jais 2 (jais2)' if jais2 else 'Nemotron (nemotron)'}, which needs "
                         f"{'; '.join(problems)}.")
    rope = partial_rope(args)
    if jais2:
        config = base_config(args, vocab_size, dtype, "jais2", "Jais2ForCausalLM", rope, eps=1e-5)
        config.update(hidden_act="relu2", layer_norm_eps=config.pop("rms_norm_eps"), attention_bias=bias,
                      mlp_bias=bias)
        return config
    config = base_config(args, vocab_size, dtype, "nemotron", "NemotronForCausalLM", rope, eps=1e-5)
    config.update(hidden_act="relu2", norm_eps=config.pop("rms_norm_eps"), attention_bias=bias, mlp_bias=bias,
                  partial_rotary_factor=rope["partial_rotary_factor"], pad_token_id=None)
    return config
