"""Edits of megatron layer-spec trees (ModuleSpec / submodule dataclasses, lists of layer specs).

Several choices are made by swapping one module class for another in the spec megatron builds the
model from, before the model exists: sequence-parallel norms (models/parallel.py), fused SDPA core
attention (models/core_attention.py). One walk serves them all.
"""
from __future__ import annotations

import dataclasses
from typing import Any


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
