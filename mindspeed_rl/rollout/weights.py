"""Streamed HF-named weights -> this rank's megatron GPTModel shards (NativeEngine.update_weights
when the engine does NOT share the training model, e.g. a separate rollout copy).

The feed is what a vLLM engine consumes: (HF name, full tensor) pairs in any order and chunking.
A megatron parameter is written as soon as every HF tensor it is built from has arrived
(q/k/v for linear_qkv, gate/up for linear_fc1), then those HF tensors are dropped, so at most a
layer's worth is held at a time. Names, layouts and TP slicing come from models/hf_bridge.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping

import torch

from mindspeed_rl.models.hf_bridge.checkpoint_io import DictReader
from mindspeed_rl.models.hf_bridge.loader import global_param_name
from mindspeed_rl.models.hf_bridge.mapping import Dims, model_hf_names, read_shard
from mindspeed_rl.utils.errors import UserInputError
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)


@torch.no_grad()
def load_hf_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]],
                    args: Mapping[str, Any], absent: Collection[str] = ()) -> int:
    """Copy streamed HF tensors into `model` (this rank's TP shard, PP=1). Returns params written.

    Args:
        model: GPTModel chunk built from `args`.
        named_tensors: (HF name, full tensor) pairs; every tensor the model needs must come once.
        args: the Megatron-named args the model was built from.
        absent: HF names that do not come (frozen, sent before): a parameter all of whose tensors are
            among them keeps its value.

    Raises:
        UserInputError naming the HF tensors that never arrived.
    """
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    dims = Dims.from_args(args)
    tied = not args.get("untie_embeddings_and_output_weights", False)

    waiting: dict[str, tuple[torch.Tensor, str, tuple[str, ...]]] = {}  # megatron name -> (param, kind, HF names)
    needed_by: dict[str, set[str]] = {}  # HF name -> megatron names still waiting for it
    for local_name, param in model.state_dict(keep_vars=True).items():
        if local_name.endswith("_extra_state"):
            continue
        name, layer = global_param_name(model, local_name)
        kind, names = model_hf_names(name, layer, args, tied)
        waiting[local_name] = (param, kind, names)
        for n in names:
            needed_by.setdefault(n, set()).add(local_name)

    held: dict[str, torch.Tensor] = {}
    written, extra = 0, []
    for hf_name, tensor in named_tensors:
        if hf_name not in needed_by:
            extra.append(hf_name)
            continue
        held[hf_name] = tensor
        for local_name in list(needed_by[hf_name]):
            param, kind, names = waiting[local_name]
            if not all(n in held for n in names):
                continue
            shard = read_shard(DictReader(held, "update_weights feed"), kind, names, dims, tp, rank)
            if shard.shape != param.shape:
                raise UserInputError(f"update_weights: {', '.join(names)} give {list(shard.shape)} for "
                                     f"{local_name}, which has {list(param.shape)}; the weights do not fit this model.")
            param.copy_(shard.to(device=param.device, dtype=param.dtype))
            written += 1
            del waiting[local_name]
            for n in names:
                needed_by[n].discard(local_name)
                if not needed_by[n]:
                    held.pop(n, None)
    waiting = {k: v for k, v in waiting.items() if not all(n in absent for n in v[2])}
    if waiting:
        missing = sorted({n for _, _, names in waiting.values() for n in names if n not in held})
        raise UserInputError(f"update_weights: {len(waiting)} parameters got no weights; missing HF tensors: "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}.")
    if extra:
        log.warning("update_weights ignored %d tensors this model does not use (e.g. %s)", len(extra), extra[0])
    return written
