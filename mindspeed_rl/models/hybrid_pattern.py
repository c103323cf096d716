"""Layers that each hold one block: Megatron-LM's hybrid_override_pattern (Nemotron-H).

Nemotron-H's layers are not attention + MLP: each is a single block behind its own pre-norm and
residual, one character per layer in Megatron-LM's hybrid-model vocabulary (HF's
hybrid_override_pattern; transformers 5's layers_block_type names them):

  M  Mamba-2 (models/mamba2.py)        HF linear_attention
  *  attention (without RoPE)          HF full_attention
  -  MLP                               HF mlp
  E  mixture of experts                HF moe

Each becomes one megatron TransformerLayer with the other half left out: M / * keep the
self-attention slot (Mamba-2 there for M: `mamba_layers`) and have megatron's IdentityOp for the
pre-MLP norm, the MLP and its bias-dropout-add; - / E keep the MLP (an MoE layer for E:
`moe_layer_freq`) and have IdentityOp for the input norm, the attention and its bias-dropout-add.
A layer's one norm is so its input_layernorm (M / *) or its pre_mlp_layernorm (- / E), which the HF
bridge names input_layernorm / post_attention_layernorm and Nemotron-H stores as `norm`
(hf_bridge/names.py). Without megatron here: the config checks and the bridge use this module
before any worker starts.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

SYMBOLS = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "MoE"}
# transformers 5's layers_block_type (and layer_types) names of the symbols
HF_BLOCK_TYPES = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E",
                  "mamba": "M", "attention": "*"}  # older spellings some configs carry


def problem(pattern: Any) -> Optional[str]:
    """Why `pattern` is not a hybrid_override_pattern (the end of a sentence), or None."""
    if not isinstance(pattern, str) or not pattern:
        return f"is {pattern!r}; it must be a non-empty string with one of M * - E per layer"
    bad = sorted(set(pattern) - set(SYMBOLS))
    if bad:
        return (f"has {', '.join(repr(c) for c in bad)}; each character must be one of M (Mamba-2), * (attention), "
                f"- (MLP), E (MoE)")
    return None


def from_block_types(types: Sequence[str]) -> str:
    """transformers' layers_block_type list -> the pattern string (ValueError naming an unknown type)."""
    out = []
    for t in types:
        if t not in HF_BLOCK_TYPES:
            raise ValueError(f"layer type {t!r} is not one of {', '.join(sorted(HF_BLOCK_TYPES))}")
        out.append(HF_BLOCK_TYPES[t])
    return "".join(out)


def to_block_types(pattern: str) -> list[str]:
    """The pattern as transformers 5's layers_block_type."""
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    return [names[c] for c in pattern]


def pattern_of(args: Mapping[str, Any]) -> Optional[str]:
    """The model's hybrid_override_pattern (Megatron-named args), or None for attention + MLP layers."""
    return args.get("hybrid_override_pattern") or None


def mamba_marks(pattern: str) -> list[int]:
    """mamba_layers of a pattern: 1 where the layer is Mamba-2."""
    return [int(c == "M") for c in pattern]


def moe_marks(pattern: str) -> list[int]:
    """moe_layer_freq of a pattern: 1 where the layer is an MoE layer."""
    return [int(c == "E") for c in pattern]


def has_attention_slot(pattern: Optional[str], layer: int) -> bool:
    """Whether global layer `layer` has its self-attention slot (attention or Mamba-2) and input norm."""
    return pattern is None or pattern[layer] in "M*"


def has_mlp(pattern: Optional[str], layer: int) -> bool:
    """Whether global layer `layer` has an MLP (dense or MoE) and its pre-MLP norm."""
    return pattern is None or pattern[layer] in "-E"


# layer-relative name prefixes of each half of a layer, megatron's and the HF bridge's canonical ones (they do not clash)
_ATTENTION_HALF = ("input_layernorm.", "self_attention.", "self_attn.", "mamba.", "linear_attn.")
_MLP_HALF = ("pre_mlp_layernorm.", "post_attention_layernorm.", "mlp.")


def param_kept(pattern: Optional[str], layer: int, name: str) -> bool:
    """Whether a layer-relative parameter name (megatron's, or the HF bridge's canonical one) exists in global layer
    `layer`: the other half of a one-block layer is IdentityOp and has none."""
    if name.startswith(_ATTENTION_HALF):
        return has_attention_slot(pattern, layer)
    if name.startswith(_MLP_HALF):
        return has_mlp(pattern, layer)
    return True


def block_spec(block: Any, args: Mapping[str, Any], layers: Sequence[int]) -> Any:
    """`block` (a layer spec, or a block spec of the layers `layers`: global indices) with each layer cut to the one
    block hybrid_override_pattern gives it (megatron's IdentityOp / IdentityFuncOp for the other half)."""
    from megatron.core.transformer.identity_op import IdentityFuncOp, IdentityOp
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    pattern = pattern_of(args)
    specs = block.layer_specs if isinstance(block, TransformerBlockSubmodules) else [block] * len(layers)
    out = []
    for spec, layer in zip(specs, layers):
        if pattern[layer] in "M*":
            cut = dict(pre_mlp_layernorm=IdentityOp, mlp=IdentityOp, mlp_bda=IdentityFuncOp)
        else:
            cut = dict(input_layernorm=IdentityOp, self_attention=IdentityOp, self_attn_bda=IdentityFuncOp)
        out.append(dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, **cut)))
    if isinstance(block, TransformerBlockSubmodules):
        return dataclasses.replace(block, layer_specs=out)
    return TransformerBlockSubmodules(layer_specs=out, layer_norm=LayerNormImpl)


def config_problems(a: Any, model: str) -> list[str]:
    """One sentence for each way a model's arch section (config/schema.py's) disagrees with its
    hybrid_override_pattern."""
    pattern = a.hybrid_override_pattern
    if pattern is None:
        return []
    where = f"model {model}: hybrid_override_pattern"
    why = problem(pattern)
    if why:
        return [f"{where} {why}."]
    out = []
    if a.num_layers and a.num_layers != len(pattern):
        out.append(f"{where} has {len(pattern)} characters but num_layers is {a.num_layers}; give one per layer.")
    if any(a.linear_attention_layers or ()):
        out.append(f"{where} and linear_attention_layers are both set; a one-block-per-layer model's linear layers are "
                   f"its Mamba-2 ones (M).")
    if isinstance(a.mamba_layers, (list, tuple)) and [int(bool(x)) for x in a.mamba_layers] != mamba_marks(pattern):
        out.append(f"{where} {pattern!r} puts Mamba-2 in other layers than mamba_layers {list(a.mamba_layers)}; drop "
                   f"mamba_layers (the pattern sets it).")
    experts = (a.num_experts or 0) > 0
    if "E" in pattern and not experts:
        out.append(f"{where} {pattern!r} has MoE layers (E) but num_experts is not set; set it (and the expert sizes) "
                   f"or load a Hugging Face checkpoint whose config.json has them.")
    if experts and "E" not in pattern:
        out.append(f"{where} {pattern!r} has no MoE layer (E) but num_experts is {a.num_experts}; drop num_experts.")
    if experts and "E" in pattern and isinstance(a.moe_layer_freq, (list, tuple)) and \
            [int(bool(x)) for x in a.moe_layer_freq] != moe_marks(pattern):
        out.append(f"{where} {pattern!r} puts MoE in other layers than moe_layer_freq {list(a.moe_layer_freq)}; drop "
                   f"moe_layer_freq (the pattern sets it).")
    if not a.pre_norm or a.post_norm or a.parallel_residual:
        out.append(f"{where}: its layers have one norm before their one block; pre_norm: true, post_norm: false and "
                   f"parallel_residual: false are the only layout it takes.")
    return out
