"""Offline checkpoint conversion (convert_ckpt.py): HF <-> this project's Megatron format, any
TP/PP, in one process and without torch.distributed.

Every conversion is "a reader under HF names -> a writer":
  source HF directory   SafetensorsReader (lazy, per tensor)
  source Megatron dir   checkpoint.MegatronCheckpointReader (TP shards merged on read)
  target Megatron       for each (pp_rank, tp_rank): hf_bridge.mapping.read_shard of every
                        parameter the stage holds (sharding.stage_param_names) -> model.safetensors;
                        MoE experts per (pp_rank, ep_rank, etp_rank) (sharding.stage_expert_names)
                        -> expert_rank_*/model.safetensors
  target HF             per pipeline stage of the source (or one shard): HF tensors -> safetensors
Only slicing, concatenation and (optionally) one dtype cast happen, so HF -> mg(TP=a,PP=b) ->
mg(TP=c,PP=d) -> HF reproduces every tensor bit for bit when no dtype is given.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch
from safetensors.torch import save_file

from mindspeed_rl.models.checkpoint import (FORMAT, MODEL_FILE, MegatronCheckpointReader, begin_write,
                                            expert_rank_dir, finish_write, is_megatron_checkpoint, rank_dir)
from mindspeed_rl.models.hf_bridge.checkpoint_io import SafetensorsReader, TensorReader
from mindspeed_rl.models.hf_bridge.loader import read_hf_config
from mindspeed_rl.models.hf_bridge.mapping import Dims, gated_mlp, hf_names, model_hf_names, read_shard
from mindspeed_rl.platform import PARAMS_DTYPES
from mindspeed_rl.models.hf_bridge.sharding import (check_tp, is_moe, layer_range, stage_expert_names,
                                                    stage_param_names)
from mindspeed_rl.models.hf_export import write_hf_dir
from mindspeed_rl.models.hf_export_config import hf_config_from_args
from mindspeed_rl.utils.errors import UserInputError
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)
DTYPES = PARAMS_DTYPES  # one spelling of params_dtype, in platform/
HF_TYPES = {"llama2": "llama", "llama3": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
            "qwen2_moe": "qwen2_moe", "mixtral": "mixtral", "phi3": "phi3", "smollm3": "smollm3", "granite": "granite",
            "gemma3": "gemma3_text", "gemma2": "gemma2", "gemma": "gemma", "vaultgemma": "vaultgemma",
            "olmo2": "olmo2", "olmo3": "olmo3", "ministral3": "ministral3",
            "exaone4": "exaone4", "seed_oss": "seed_oss", "glm4": "glm4",
            "ernie4_5": "ernie4_5", "arcee": "arcee", "glm4_moe": "glm4_moe",
            "deepseek3": "deepseek_v3", "deepseek2": "deepseek_v2", "minimax_m2": "minimax_m2",
            "glm4_moe_lite": "glm4_moe_lite", "gpt_oss": "gpt_oss", "ernie4_5_moe": "ernie4_5_moe",
            "apertus": "apertus", "qwen3_5": "qwen3_5_text",
            "qwen3_5_moe": "qwen3_5_moe_text", "qwen3_next": "qwen3_next",
            "olmoe": "olmoe", "flex_olmo": "flex_olmo", "hunyuan": "hunyuan_v1_dense",
            "hunyuan_moe": "hunyuan_v1_moe", "granitemoe": "granitemoe", "granitemoeshared": "granitemoeshared",
            "granitemoehybrid": "granitemoehybrid", "glm": "glm",
            "helium": "helium", "stablelm": "stablelm", "starcoder2": "starcoder2", "nemotron": "nemotron",
            "cohere": "cohere", "cohere2": "cohere2", "phi": "phi", "gpt_neox": "gpt_neox",
            "falcon": "falcon", "olmo": "olmo", "nemotron_h": "nemotron_h", "falcon_h1": "falcon_h1", "lfm2": "lfm2", "lfm2_moe": "lfm2_moe", "exaone": "exaone", "exaone_moe": "exaone_moe", "hy_v3": "hy_v3", "afmoe": "afmoe", "sarvam_moe": "sarvam_moe", "sarvam_mla": "deepseek_v3", "jais2": "jais2", "mellum": "mellum", "hyperclovax": "hyperclovax", "gemma4": "gemma4_text", "youtu": "youtu", "mimo": "qwen2", "nanochat": "nanochat", "dots1": "glm4_moe", "solar_open": "glm4_moe"}  # MindSpeed-LLM's names where it has the model


def padded_vocab(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding: the vocabulary rounded up to a multiple of divisible_by x TP."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


class Source:
    """A checkpoint opened for conversion: reader, Megatron args, real vocab, HF config."""

    def __init__(self, reader: TensorReader, args: dict[str, Any], vocab_size: int,
                 hf_config: Optional[dict[str, Any]], pp: int):
        self.reader, self.args, self.vocab_size, self.hf_config, self.pp = reader, args, vocab_size, hf_config, pp


def open_source(load_dir: str, model_type: str, model_type_hf: Optional[str] = None) -> Source:
    """Open an HF ("hf") or Megatron ("mg") checkpoint directory for reading."""
    if model_type == "mg":
        if not is_megatron_checkpoint(load_dir):
            raise UserInputError(f"--load-dir {load_dir} has neither latest_checkpointed_iteration.txt nor manifest.json; "
                                 "point it at a Megatron checkpoint written by this project, or use --load-model-type hf.")
        reader = MegatronCheckpointReader(load_dir)
        m = reader.manifest
        return Source(reader, dict(m["model_args"]), reader.vocab_size, m.get("hf_config"), m["pp"])
    from mindspeed_rl.models.builder import model_config_from_hf  # imports megatron: only when needed

    config = read_hf_config(load_dir)
    if model_type_hf and HF_TYPES[model_type_hf] != config["model_type"]:
        raise UserInputError(f"--model-type-hf {model_type_hf} disagrees with model_type {config['model_type']!r} in "
                             f"{os.path.join(load_dir, 'config.json')}; drop the flag or fix it.")
    try:
        args = model_config_from_hf(config)
    except ValueError as err:
        raise UserInputError(f"{os.path.join(load_dir, 'config.json')}: {err}") from None
    return Source(SafetensorsReader(load_dir), args, int(config["vocab_size"]), config, 1)


def save_megatron(src: Source, save_dir: str, tp: int, pp: int, dtype: Optional[torch.dtype] = None,
                  make_vocab_size_divisible_by: int = 1, layers_per_virtual_stage: Optional[int] = None,
                  ep: int = 1, etp: Optional[int] = None) -> str:
    """Write `src` as a Megatron checkpoint of this project at (TP, PP[, EP, ETP]), step 0. Returns its dir.
    layers_per_virtual_stage (MindSpeed-LLM's --num-layers-per-virtual-pipeline-stage): each
    pipeline rank's file holds the layers of its virtual-pipeline chunks (models/chunks.py)."""
    args = dict(src.args, padded_vocab_size=padded_vocab(src.vocab_size, make_vocab_size_divisible_by, tp))
    etp = tp if etp is None else etp
    if (ep > 1 or etp != tp) and not is_moe(args):
        raise UserInputError("--target-expert-parallel-size / --target-expert-tensor-parallel-size need an MoE model "
                             "(num_experts > 1); drop them for this checkpoint.")
    check_tp(args, tp, ep, etp)
    layer_range(int(args["num_layers"]), pp, 0)  # PP must divide num_layers
    if pp > 1 and (args.get("per_layer_input_size") or int(args.get("num_kv_shared_layers") or 0)):
        raise UserInputError("--target-pipeline-parallel-size > 1 is not supported for this model: its layers read the "
                             "per-layer inputs / keys and values computed before them in the same forward (Gemma 4 "
                             "E2B / E4B); convert with --target-pipeline-parallel-size 1.")
    vpp = 1
    if layers_per_virtual_stage:
        vpp, rest = divmod(int(args["num_layers"]), pp * layers_per_virtual_stage)
        if rest or vpp < 1 or pp < 2:
            raise UserInputError(f"--num-layers-per-virtual-pipeline-stage {layers_per_virtual_stage} x "
                                 f"--target-pipeline-parallel-size {pp} must divide num_layers {args['num_layers']} "
                                 f"with PP > 1; pick layers per virtual stage that divide num_layers / PP.")
    dims, tied = Dims.from_args(args), not args.get("untie_embeddings_and_output_weights", False)
    tmp = begin_write(save_dir, 0)
    for pp_rank in range(pp):
        names = stage_param_names(args, pp, pp_rank, vpp)
        for tp_rank in range(tp):
            tensors = {}
            for name in names:  # (global layer names): read only this rank's slice of each tensor
                t = read_shard(src.reader, *model_hf_names(name, None, args, tied), dims, tp, tp_rank)
                tensors[name] = (t.to(dtype) if dtype else t).contiguous()
            os.makedirs(os.path.join(tmp, rank_dir(tp_rank, pp_rank)))
            save_file(tensors, os.path.join(tmp, rank_dir(tp_rank, pp_rank), MODEL_FILE), metadata={"format": FORMAT})
        _save_experts(src.reader, args, dims, tmp, pp, pp_rank, ep, etp, dtype)
        log.info("stage %d/%d written", pp_rank + 1, pp)
    any_tensor = next(iter(tensors.values()))
    return finish_write(tmp, {"step": 0, "tp": tp, "pp": pp, "vpp": vpp, "dp": 1, "ep": ep, "etp": etp,
                              "params_dtype": str(any_tensor.dtype),
                              "vocab_size": src.vocab_size, "model_args": args, "hf_config": src.hf_config,
                              "has_optimizer": False, "distributed_optimizer": False})


def _save_experts(reader: TensorReader, args: dict[str, Any], dims: Dims, tmp: str, pp: int, pp_rank: int,
                  ep: int, etp: int, dtype: Optional[torch.dtype]) -> None:
    """The MoE experts of one stage: one file per (EP rank, ETP rank), this rank's slice of each."""
    for ep_rank in range(ep):
        names = stage_expert_names(args, pp, pp_rank, ep, ep_rank)
        for etp_rank in range(etp) if names else ():
            tensors = {}
            for name in names:
                t = read_shard(reader, *hf_names(name, None, False, gated_mlp(args)), dims, etp, etp_rank)
                tensors[name] = (t.to(dtype) if dtype else t).contiguous()
            where = os.path.join(tmp, expert_rank_dir(etp_rank, pp_rank, ep_rank))
            os.makedirs(where)
            save_file(tensors, os.path.join(where, MODEL_FILE), metadata={"format": FORMAT})


def save_hf(src: Source, save_dir: str, dtype: Optional[torch.dtype] = None, hf_cfg_dir: Optional[str] = None) -> str:
    """Write `src` as a HF directory (one safetensors shard per source pipeline stage)."""
    config = read_hf_config(hf_cfg_dir) if hf_cfg_dir else src.hf_config
    if config is None:
        config = hf_config_from_args(src.args, src.vocab_size, dtype or torch.float32)
    if isinstance(src.reader, SafetensorsReader):  # HF -> HF: keep the names, maybe cast
        names = [sorted(src.reader.weight_map)]
    else:
        names = src.reader.stages
    shards = ({n: (src.reader.read(n).to(dtype) if dtype else src.reader.read(n)) for n in stage} for stage in names)
    if dtype is not None:
        config = dict(config, **{"dtype" if "dtype" in config else "torch_dtype": str(dtype).removeprefix("torch.")})
    # HF -> HF keeps every tensor (multi-token-prediction layers included); from a Megatron checkpoint they
    # come from --hf-cfg-dir's checkpoint when it has them (hf_export.mtp_layers)
    return write_hf_dir(save_dir, list(shards), config, hf_cfg_dir or _dir_of(src), mtp_source=hf_cfg_dir)


def _dir_of(src: Source) -> Optional[str]:
    directory = getattr(src.reader, "directory", None)
    return directory if directory and os.path.isfile(os.path.join(directory, "config.json")) else None


def convert(load_model_type: str, save_model_type: str, load_dir: str, save_dir: str, tp: int = 1, pp: int = 1,
            model_type_hf: Optional[str] = None, params_dtype: Optional[str] = None,
            hf_cfg_dir: Optional[str] = None, make_vocab_size_divisible_by: int = 1,
            layers_per_virtual_stage: Optional[int] = None, ep: int = 1, etp: Optional[int] = None) -> str:
    """The whole conversion (what convert_ckpt.py runs). Returns the written directory."""
    if not os.path.isdir(load_dir):
        raise UserInputError(f"--load-dir {load_dir} does not exist; point it at a checkpoint directory.")
    if min(tp, pp, ep, etp or 1) < 1:
        raise UserInputError("--target-tensor/pipeline/expert(-tensor)-parallel-size must be at least 1.")
    if os.path.abspath(load_dir) == os.path.abspath(save_dir):
        raise UserInputError(f"--save-dir {save_dir} is the --load-dir; write the conversion somewhere else.")
    src = open_source(load_dir, load_model_type, model_type_hf)
    dtype = DTYPES[params_dtype] if params_dtype else None
    if save_model_type == "mg":
        return save_megatron(src, save_dir, tp, pp, dtype, make_vocab_size_divisible_by, layers_per_virtual_stage, ep, etp)
    return save_hf(src, save_dir, dtype, hf_cfg_dir)


def describe(path: str) -> str:
    """One line about a written directory (for the CLI)."""
    manifest = os.path.join(path, "manifest.json")
    if os.path.isfile(manifest):
        with open(manifest) as f:
            m = json.load(f)
        vpp = f" VPP={m['vpp']}" if m.get("vpp", 1) > 1 else ""
        moe = f" EP={m['ep']} ETP={m['etp']}" if m.get("ep", 1) > 1 or m.get("etp", m["tp"]) != m["tp"] else ""
        return f"{path}: Megatron checkpoint, TP={m['tp']} PP={m['pp']}{vpp}{moe}, {len(m['files'])} files"
    return f"{path}: Hugging Face checkpoint"
