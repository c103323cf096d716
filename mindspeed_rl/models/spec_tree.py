"""Edits of megatron layer-spec trees (ModuleSpec / submodule dataclasses, lists of layer specs).

Several choices are made by swapping one module class for another in the spec megatron builds the
model from, before the model exists: sequence-parallel norms (models/parallel.py), fused SDPA core
attention (models/core_attention.py). One walk serves them all.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence


def swap_in_spec(spec: Any, old: type, new: type) -> Any:
    """A copy of a spec tree with every occurrence of the class `old` replaced by `new`; everything
    else (other classes, params, the tree's own dataclass types) is kept as it is."""
    if spec is old:
        return new
    if isinstance(spec, (list, tuple)):
        return type(spec)(swap_in_spec(s, old, new) for s in spec)
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        return dataclasses.replace(spec, **{f.name: swap_in_spec(getattr(spec, f.name), old, new)
                                            for f in dataclasses.fields(spec) if f.init})
    return spec


def with_mixers(block: Any, layers: Sequence[int], mixer_for: Callable[[Any, int], Any]) -> Any:
    """`block` (a layer spec, or a block spec of the layers `layers`: global indices) with each layer's self-attention
    slot replaced by `mixer_for(attention_spec, layer)` where that returns a spec (None: the layer keeps its attention).
    Granite 4.0-H's Mamba-2 layers (models/mamba2.py), LFM2's short-convolution ones (models/short_conv.py)."""
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    specs = block.layer_specs if isinstance(block, TransformerBlockSubmodules) else [block] * len(layers)
    out = []
    for spec, layer in zip(specs, layers):
        mixer = mixer_for(spec.submodules.self_attention, layer)
        if mixer is not None:
            spec = dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=mixer))
        out.append(spec)
    if isinstance(block, TransformerBlockSubmodules):
        return dataclasses.replace(block, layer_specs=out)
    return TransformerBlockSubmodules(layer_specs=out, layer_norm=LayerNormImpl)
