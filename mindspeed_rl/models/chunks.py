"""A rank's model as a list of chunks, and which global layers each chunk holds (pure, no megatron).

Without a virtual pipeline a rank holds one GPTModel chunk; with one (Megatron's interleaved
schedule, `virtual_pipeline_model_parallel_size` V) it holds V chunks. Chunk v of pipeline rank r
is virtual stage v * PP + r and owns global layers [s * L/(PP*V), (s+1) * L/(PP*V)) for
s = v * PP + r (megatron-core's even split; with V = 1 this is layer_range of hf_bridge.sharding).
So at PP=2, V=2, L=8 rank 0 holds layers 0-1 and 4-5, rank 1 holds 2-3 and 6-7; the embedding
lives on virtual stage 0 (rank 0, chunk 0), the final norm and output layer on the last
(rank PP-1, chunk V-1).

Everything that walks "this rank's model" (checkpoints, HF export, the rollout engine, the train
step) takes either one chunk or a list and calls `as_chunks`.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import torch

Model = Union[torch.nn.Module, Sequence[torch.nn.Module]]


def as_chunks(model: Model) -> list[torch.nn.Module]:
    """[model] for one chunk, the list itself for a virtual-pipeline rank."""
    return list(model) if isinstance(model, (list, tuple)) else [model]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside megatron's DDP / Float16Module wrappers."""
    while not hasattr(model, "decoder") and hasattr(model, "module"):
        model = model.module
    return model


def virtual_layer_ranges(num_layers: int, pp_size: int, pp_rank: int, vpp_size: int = 1) -> list[range]:
    """Global layer indices of each chunk of pipeline rank `pp_rank` (one range per chunk).
    The caller has checked that PP x VPP divides num_layers (config validation)."""
    per = num_layers // (pp_size * vpp_size)
    return [range((v * pp_size + pp_rank) * per, (v * pp_size + pp_rank + 1) * per) for v in range(vpp_size)]


def vpp_from_keys(num_layers: Any, pp_size: int, virtual_pipeline_model_parallel_size: Any,
                  num_layers_per_virtual_pipeline_stage: Any) -> int:
    """Chunks per pipeline rank from either of Megatron's spellings (1 = no virtual pipeline).
    num_layers_per_virtual_pipeline_stage n means L / (PP x n) chunks. Inconsistent or
    non-dividing values are config validation's business; here they fall back to 1."""
    if virtual_pipeline_model_parallel_size not in (None, 0):
        return int(virtual_pipeline_model_parallel_size)
    if num_layers_per_virtual_pipeline_stage and num_layers and pp_size:
        chunks, rest = divmod(int(num_layers), int(pp_size) * int(num_layers_per_virtual_pipeline_stage))
        return chunks if chunks and not rest else 1
    return 1
