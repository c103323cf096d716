"""Hugging Face export: safetensors + config.json (+ tokenizer files) that `transformers` loads.

    export_hf(model, args, out_dir, vocab_size=V, hf_config=cfg, tokenizer_dir=tok)  # every rank

From a live, sharded model: every parameter is all-gathered over its TP group (MoE experts: over
their ETP group, then collected over the EP group) and merged
(hf_bridge.sharding.merge_tp), mapped to HF names (to_hf), and each pipeline stage's first rank
writes its stage as one safetensors shard; global rank 0 writes the index, config.json and the
tokenizer files. Departure from "gather everything on rank 0": stages never send weights to
each other, so no rank holds more than its stage (ranks must share one filesystem). The
directory is written under `<out>.tmp` and renamed when complete.

config.json is the one the run started from when known (`hf_config`), else it is made from the
Megatron args (models/hf_export_config.hf_config_from_args).

Multi-token-prediction layers (DeepSeek-V3's and GLM-4.5's `num_nextn_predict_layers`, stored after
the last layer) are not part of the trained model: `mtp_layers` copies them unchanged from the HF
checkpoint the run started from into their own shard, or sets config.json's count to 0 where no
such checkpoint is at hand, so an export never announces layers it lacks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Iterable, Mapping, Optional

import torch
from safetensors.torch import save_file

from mindspeed_rl.models.hf_bridge.checkpoint_io import INDEX_FILE, SINGLE_FILE, SafetensorsReader
from mindspeed_rl.models.hf_bridge.mapping import EXPERT_KINDS, gated_mlp
from mindspeed_rl.models.hf_bridge.names import fuse, names_type
from mindspeed_rl.models.hf_export_config import DTYPE_NAMES, hf_config_from_args
from mindspeed_rl.models.hf_moe_config import mtp_layer_count
from mindspeed_rl.models.hf_bridge.sharding import kind_of, mcore_to_hf, merge_tp

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "generation_config.json")


MTP_FILE = "model-mtp.safetensors"  # the multi-token-prediction layers copied into an export (mtp_layers)
_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.")


def mtp_layers(config: Mapping[str, Any], source: Optional[str],
               written: Iterable[str] = ()) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """config.json's multi-token-prediction layers for an export (num_nextn_predict_layers: DeepSeek-V3's,
    GLM-4.5's; num_mtp_modules: MiniMax-M2's; stored after the last of num_hidden_layers). RL trains the
    main layers only, so they are copied unchanged, under their stored names, from `source` (the HF
    checkpoint the run started from): a speculative-decoding draft head of the model it was trained
    from. Where `source` holds none, config.json's count becomes 0 so the export does not announce
    layers it lacks. Returns
    (config, {stored name: tensor}); (config, {}) when config.json has no such layers or the
    `written` tensor names hold them already (convert_ckpt HF -> HF)."""
    key, count = mtp_layer_count(config)
    layers = int(config.get("num_hidden_layers") or 0)
    if not count or any((m := _LAYER_NAME.match(n)) and int(m.group(1)) >= layers for n in written):
        return dict(config), {}
    tensors: dict[str, torch.Tensor] = {}
    if source and os.path.isfile(os.path.join(source, "config.json")):
        reader = SafetensorsReader(source)
        for name in sorted(reader.weight_map):
            m = _LAYER_NAME.match(name)
            if m and int(m.group(1)) >= layers:  # a quantized one (block FP8) is written dequantized, in bf16
                tensor = reader.read(name)
                tensors[reader.stored(name)] = (tensor.to(torch.bfloat16) if reader.quantized(name) else tensor).contiguous()
    if not tensors:
        return dict(config, **{key: 0}), {}
    return dict(config, use_mtp=True) if key == "num_mtp_modules" else dict(config), tensors


def write_hf_dir(out_dir: str, shards: Iterable[dict[str, torch.Tensor]], config: Mapping[str, Any],
                 tokenizer_dir: Optional[str] = None, mtp_source: Optional[str] = None) -> str:
    """Write shards (one dict per pipeline stage, in order) + index + config (+ tokenizer) from one
    process, atomically; `mtp_source`: where multi-token-prediction layers come from (mtp_layers).
    Returns out_dir."""
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shards = list(shards) if not isinstance(shards, list) else shards
    weight_map = {}
    for i, shard in enumerate(shards):
        weight_map.update(write_shard(tmp, i, len(shards), shard, config))
    config, mtp = mtp_layers(config, mtp_source, weight_map)
    finish_hf_dir(tmp, out_dir, weight_map, len(shards), config, tokenizer_dir, mtp)
    return out_dir


def shard_file(index: int, count: int) -> str:
    return SINGLE_FILE if count == 1 else f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def write_shard(tmp: str, index: int, count: int, tensors: Mapping[str, torch.Tensor],
                hf_config: Mapping[str, Any]) -> dict[str, str]:
    """Save one shard of canonical-named HF tensors, under the names and layouts checkpoints of config.json's
    model_type use (hf_bridge/names.py: Mixtral's names, Phi-3's fused q/k/v and gate/up, Qwen3-Next's
    DeltaNet projections grouped per key head, whose sizes config.json gives); returns its part of the
    index's weight_map."""
    name = shard_file(index, count)
    stored = {k: v.contiguous() for k, v in fuse(dict(tensors), names_type(hf_config), hf_config).items()}
    save_file(stored, os.path.join(tmp, name), metadata={"format": "pt"})
    return {k: name for k in stored}


def finish_hf_dir(tmp: str, out_dir: str, weight_map: Mapping[str, str], count: int,
                  config: Mapping[str, Any], tokenizer_dir: Optional[str],
                  mtp: Optional[Mapping[str, torch.Tensor]] = None) -> None:
    """The index (several shards, or the MTP shard besides), config.json and tokenizer files, then
    `tmp` renamed to `out_dir`."""
    files = [shard_file(i, count) for i in range(count)]
    if mtp:
        save_file(dict(mtp), os.path.join(tmp, MTP_FILE), metadata={"format": "pt"})
        weight_map = {**weight_map, **{k: MTP_FILE for k in mtp}}
        files.append(MTP_FILE)
    if len(files) > 1:
        total = sum(os.path.getsize(os.path.join(tmp, f)) for f in files)
        with open(os.path.join(tmp, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=1)
    # the weights are written dequantized (a quantized source is read so: hf_bridge/checkpoint_io.py)
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        src = os.path.join(tokenizer_dir, name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(tmp, name))
    old = out_dir.rstrip("/") + ".old"
    if os.path.exists(out_dir):
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def gather_tp(tensor: torch.Tensor, kind: str) -> torch.Tensor:
    """The full tensor from its TP shards (expert kinds: its expert-tensor-parallel shards)."""
    from megatron.core import parallel_state as ps

    expert = kind in EXPERT_KINDS
    tp = ps.get_expert_tensor_parallel_world_size() if expert else ps.get_tensor_model_parallel_world_size()
    if tp == 1 or kind in ("replicated", "expert_bias"):
        return tensor
    group = ps.get_expert_tensor_parallel_group() if expert else ps.get_tensor_model_parallel_group()
    parts = [torch.empty_like(tensor) for _ in range(tp)]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
    return merge_tp(kind, parts)


@torch.no_grad()
def export_hf(model: torch.nn.Module, args: Mapping[str, Any], out_dir: str, vocab_size: int,
              hf_config: Optional[Mapping[str, Any]] = None, tokenizer_dir: Optional[str] = None,
              dtype: Optional[torch.dtype] = None, mtp_source: Optional[str] = None) -> str:
    """Write this (TP/PP-sharded) model as a HF checkpoint directory; every rank calls it.

    Args:
        model: this rank's GPTModel chunk (or its DDP wrapper), or its list of virtual-pipeline chunks.
        vocab_size: the real vocabulary (config.json's); padding rows are dropped.
        hf_config: config.json to write (its dtype entry is updated); default from args.
        dtype: tensor dtype on disk (default: the model's).
        mtp_source: the HF checkpoint the run started from, whose multi-token-prediction layers the
            export copies (mtp_layers).
    Returns:
        out_dir.
    """
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.checkpoint import chunk_state_dict
    from mindspeed_rl.models.chunks import as_chunks

    inner = getattr(as_chunks(model)[0], "module", as_chunks(model)[0])
    tied = not args.get("untie_embeddings_and_output_weights", False)
    dt = dtype or next(iter(inner.parameters())).dtype
    # on every rank, before anything is written: the model type decides the tensors' stored names
    # (Mixtral's experts, Phi-3's fused q/k/v, Gemma's norms: hf_bridge/names.py), and a model with no
    # config.json form fails here with its sentence
    config = dict(hf_config) if hf_config else hf_config_from_args(args, vocab_size, dt)
    writer = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    pp, pp_rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    rank0 = torch.distributed.get_rank() == 0
    tmp = out_dir.rstrip("/") + ".tmp"
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    torch.distributed.barrier()

    out: dict[str, torch.Tensor] = {}
    experts: dict[str, torch.Tensor] = {}  # MoE: this EP rank's experts, merged over ETP
    expert_writer = ps.get_expert_tensor_parallel_rank() == 0 and ps.get_expert_data_parallel_rank() == 0
    for name, tensor in chunk_state_dict(model).items():
        kind = kind_of(name, tied, gated_mlp(args))
        full = gather_tp(tensor, kind)  # every TP (ETP) rank joins the all-gather
        held = experts if kind in EXPERT_KINDS else out
        if (expert_writer if kind in EXPERT_KINDS else writer):
            held.update({k: v.to(dtype or v.dtype) for k, v in mcore_to_hf(name, full, args, vocab_size).items()})
    if ps.get_expert_model_parallel_world_size() > 1 and any(kind_of(n, tied, gated_mlp(args)) in EXPERT_KINDS for n in chunk_state_dict(model)):
        # the stage writer holds EP rank 0's experts only: collect the other EP ranks' (CPU copies)
        parts_ep = [None] * ps.get_expert_model_parallel_world_size()
        torch.distributed.all_gather_object(parts_ep, {k: v.cpu() for k, v in experts.items()},
                                            group=ps.get_expert_model_parallel_group())
        experts = {k: v for p in parts_ep for k, v in p.items()}
    if writer:
        out.update(experts)
    part = write_shard(tmp, pp_rank, pp, out, config) if writer else {}
    parts = [None] * torch.distributed.get_world_size() if rank0 else None
    torch.distributed.gather_object(part, parts, dst=0)
    if rank0:
        weight_map = {k: v for p in parts for k, v in p.items()}
        config["dtype" if "dtype" in config else "torch_dtype"] = DTYPE_NAMES.get(dt, "float32")
        config, mtp = mtp_layers(config, mtp_source)
        finish_hf_dir(tmp, out_dir, weight_map, pp, config, tokenizer_dir, mtp)
    torch.distributed.barrier()
    return out_dir
