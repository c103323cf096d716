"""Load a Hugging Face checkpoint into this rank's megatron GPTModel chunk.

Each rank walks its own parameters (its PP stage's layers, its TP shard), maps each to HF tensor
names (mapping.py) and reads only the slices it needs (checkpoint_io.py). Layer numbers come from
the model itself (TransformerLayer.layer_number is global), so PP offsets need no arithmetic here.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping, Optional

import torch

from mindspeed_rl.models.hf_bridge.checkpoint_io import SafetensorsReader, TensorReader
from mindspeed_rl.models.hf_bridge.mapping import ARCHITECTURES, EXPERT_KINDS, Dims, model_hf_names, read_shard
from mindspeed_rl.models.hf_config import supported_types, text_model_config
from mindspeed_rl.utils.errors import UserInputError
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)
_LOCAL_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT_PREFIX = "mlp.experts.local_experts."
_LOCAL_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)")


def read_hf_config(hf_dir: str) -> dict[str, Any]:
    """config.json of a HF checkpoint directory, with its model_type checked."""
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise UserInputError(f"{hf_dir} has no config.json; point load: at a Hugging Face checkpoint directory.")
    with open(path) as f:
        config = text_model_config(json.load(f))  # an image-text model's text model (Gemma 3 4B and up)
    if config.get("model_type") not in ARCHITECTURES:
        raise UserInputError(
            f"{path}: model_type {config.get('model_type')!r} is not supported; supported: {supported_types()}.")
    return config


def hf_config_of(load) -> dict | None:
    """config.json of the HF checkpoint a role started from (None for random init / our checkpoints);
    an image-text model's is its text model's (models/hf_config.text_model_config)."""
    path = os.path.join(load, "config.json") if load else None
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return text_model_config(json.load(f))
    return None


def _global_name(model: torch.nn.Module, local_name: str) -> tuple[str, Optional[int]]:
    """decoder.layers.<local j>.x -> decoder.layers.<global i>.x, and i; an MoE layer's local expert
    k becomes its global number (MoELayer.local_expert_indices[k])."""
    m = _LOCAL_LAYER.match(local_name)
    if not m:
        return local_name, None
    block = model.decoder.layers[int(m.group(1))]
    layer = block.layer_number - 1  # layer_number is global, 1-based
    rest = local_name[m.end():]
    expert = _LOCAL_EXPERT.match(rest)
    if expert:
        rest = f"{_EXPERT_PREFIX}{block.mlp.local_expert_indices[int(expert.group(1))]}{rest[expert.end():]}"
    return f"decoder.layers.{layer}.{rest}", layer


def global_param_name(model: torch.nn.Module, local_name: str) -> tuple[str, Optional[int]]:
    """Public name for _global_name: a chunk's state_dict key with its global layer number."""
    return _global_name(model, local_name)


@torch.no_grad()
def load_into_model(model: torch.nn.Module, reader: TensorReader, args: Mapping[str, Any],
                    tp_size: int, tp_rank: int, etp_size: Optional[int] = None, etp_rank: Optional[int] = None) -> int:
    """Copy every parameter of `model` (one TP/PP/EP chunk) from `reader`. Returns the number loaded.

    Args:
        model: a GPTModel chunk from builder.build_gpt_model.
        reader: SafetensorsReader (HF directory) or DictReader (in-memory HF state dict).
        args: the Megatron-named args the model was built from.
        etp_size / etp_rank: how MoE expert tensors are split (default: as TP). Which experts this
            EP rank holds comes from the model itself.
    """
    loaded = 0
    for local_name, tensor in model.state_dict(keep_vars=True).items():
        if local_name.endswith("_extra_state"):
            continue
        shard = shard_for(model, local_name, tuple(tensor.shape), reader, args, tp_size, tp_rank, etp_size, etp_rank)
        tensor.copy_(shard.to(dtype=tensor.dtype))
        loaded += 1
    return loaded


def shard_for(model: torch.nn.Module, local_name: str, shape: tuple[int, ...], reader: TensorReader,
              args: Mapping[str, Any], tp_size: int, tp_rank: int, etp_size: Optional[int] = None,
              etp_rank: Optional[int] = None) -> torch.Tensor:
    """The tensor `reader` holds for `model`'s state-dict entry `local_name` (of `shape`) at this TP
    (ETP) rank (load_into_model's unit; models/optimizer_state.py reads optimizer state with it)."""
    etp_size, etp_rank = (tp_size, tp_rank) if etp_size is None else (etp_size, etp_rank)
    name, layer = _global_name(model, local_name)
    kind, names = model_hf_names(name, layer, args, not args.get("untie_embeddings_and_output_weights", False))
    expert = kind in EXPERT_KINDS
    shard = read_shard(reader, kind, names, Dims.from_args(args), etp_size if expert else tp_size,
                       etp_rank if expert else tp_rank)
    if tuple(shard.shape) != tuple(shape):  # a layout bug, or args that differ from the model's
        raise UserInputError(
            f"{local_name}: built {list(shard.shape)} from {', '.join(names)} in {reader.where(names[0])}, "
            f"but the model has {list(shape)}; check the model config against config.json.")
    return shard


def model_parallel_ranks() -> tuple[int, int, int, int]:
    """(TP size, TP rank, ETP size, ETP rank) of this rank, from megatron's parallel_state."""
    from megatron.core import parallel_state as ps

    return (ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank(),
            ps.get_expert_tensor_parallel_world_size(), ps.get_expert_tensor_parallel_rank())


def load_hf_checkpoint(model: torch.nn.Module, hf_dir: str, args: Mapping[str, Any]) -> int:
    """Load HF safetensors weights from `hf_dir` into this rank's model chunk (TP/PP from
    megatron's parallel_state). Returns the number of tensors loaded."""
    read_hf_config(hf_dir)
    reader = SafetensorsReader(hf_dir)
    n = load_into_model(model, reader, args, *model_parallel_ranks())
    log.info("loaded %d tensors from %s", n, hf_dir)
    return n
