"""Megatron checkpoints of this project: save for resume, load at any TP/PP.

Layout (one directory per step, Megatron's `iter_*` + `latest_checkpointed_iteration.txt`):

    <save>/latest_checkpointed_iteration.txt      "<step>", replaced atomically after the step dir
    <save>/iter_0000010/manifest.json             format, step, tp, pp, vpp, dp, dtype, vocab_size,
                                                  model_args, hf_config, files {relpath: bytes}
    <save>/iter_0000010/mp_rank_{tp:02d}_{pp:03d}/model.safetensors   this rank's TP shards (all its
                                                  virtual-pipeline chunks), named with GLOBAL layer numbers (DP rank 0)
    .../mp_rank_XX_YYY/optim_state_dp{dp:03d}.safetensors   the optimizer's state per parameter
                                                  (fp32 main params, Adam's moments) this DP rank
                                                  updates: any layout resumes it (models/optimizer_state.py)
    .../mp_rank_XX_YYY/optim.pt                   scheduler + loss scalers (DP rank 0), or
    .../mp_rank_XX_YYY/optim_dp{dp:03d}.pt        the same per DP rank under the distributed optimizer
    .../mp_rank_XX_YYY/rng_dp{dp:03d}.pt          python / numpy / torch / megatron tracker rng
    <save>/iter_0000010/expert_rank_{etp:02d}_{pp:03d}_{ep:03d}/model.safetensors   MoE models: the
                                                  experts of one (ETP rank, stage, EP rank), GLOBAL
                                                  expert numbers (expert-data-parallel rank 0);
                                                  the mp_rank_* files then hold everything else;
                                                  their optimizer state beside them (expert-DP rank)
    <save>/iter_0000010/trainer_state.json        the driver's state (step, data-loader position, KL
                                                  controller, ...) and the workers' counters (resume)

Atomic write: every rank writes under `iter_N.tmp`; after a barrier rank 0 lists the files with
their sizes into manifest.json, renames the directory to `iter_N`, and only then points
`latest_checkpointed_iteration.txt` at it. A crash leaves at most a `.tmp` directory that the next
save removes; a directory whose files do not match its manifest is refused on load. Resuming
(`latest_complete`) takes the newest `iter_N` whose files match its manifest, so a crash between
the rename and the LATEST update loses nothing either. `prune` keeps the newest N. Ranks must
share one filesystem (as Megatron's own checkpoints assume).

Loading at the saved TP/PP reads each rank's own file. At another TP/PP, `MegatronCheckpointReader`
serves the checkpoint under Hugging Face names (TP shards merged by hf_bridge.sharding, stages
found by their global layer names) and `load_into_model` re-shards it, exactly as from a HF
directory. The optimizer's state resumes at any layout too (models/optimizer_state.py: per parameter,
re-sharded like the weights); rng only at the saved TP, PP and DP. Checkpoints written before
2026-11-30 hold the optimizer as megatron lays it out (its torch state dicts; the distributed
optimizer's shards per DP rank), which resumes only at the saved TP, PP and DP: any other layout
restores weights only and needs `load_optimizer=False` (MindSpeed's no_load_optim), said in one
sentence. Why not megatron's own distributed-optimizer files: in megatron-core 0.12.1 without
Apex/TE, `load_parameter_state_from_dp_zero` fails (it copies torch Adam's `step` from a dict that
lacks it), and `sharded_state_dict` needs dist_checkpointing's torch_dist backend.
The device's default generator is not saved (no device code outside platform/); megatron's
tracker states, which drive dropout and init under TP, are.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from typing import Any, Mapping, Optional

import numpy as np
import torch
from safetensors.torch import save_file

from mindspeed_rl.models.chunks import as_chunks
from mindspeed_rl.models.hf_bridge.checkpoint_io import open_safetensors
from mindspeed_rl.models.hf_bridge.loader import global_param_name, load_into_model, model_parallel_ranks
from mindspeed_rl.models.hf_bridge.mapping import gated_mlp, model_hf_names
from mindspeed_rl.models.hf_bridge.sharding import kind_of, mcore_to_hf, merge_tp, stage_expert_names
from mindspeed_rl.models import optimizer_state
from mindspeed_rl.utils.errors import UserInputError
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)
FORMAT, VERSION = "mindspeed_rl-megatron-checkpoint", 1
LATEST = "latest_checkpointed_iteration.txt"
MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
TRAINER_STATE = "trainer_state.json"
_ARCH_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
              "kv_channels", "add_qkv_bias", "qk_layernorm", "untie_embeddings_and_output_weights")


def rank_dir(tp_rank: int, pp_rank: int) -> str:
    return f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def expert_rank_dir(etp_rank: int, pp_rank: int, ep_rank: int) -> str:
    return f"expert_rank_{etp_rank:02d}_{pp_rank:03d}_{ep_rank:03d}"


def is_expert_param(name: str) -> bool:
    return ".mlp.experts." in name


def step_dir(save_dir: str, step: int) -> str:
    return os.path.join(save_dir, f"iter_{step:07d}")


def _jsonable(args: Mapping[str, Any]) -> dict[str, Any]:
    """The args JSON keeps: scalars, and lists of scalars (per-layer patterns such as Qwen3.5's
    linear_attention_layers, which the layouts of a checkpoint's tensors depend on)."""
    scalar = (str, int, float, bool, type(None))
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in dict(args).items()
            if isinstance(v, scalar) or (isinstance(v, (list, tuple)) and all(isinstance(x, scalar) for x in v))}


# ---------------------------------------------------------------------------------------------
# directory protocol (shared by live saves and convert_ckpt.py)


def begin_write(save_dir: str, step: int) -> str:
    """Fresh `iter_N.tmp` directory (a leftover from a crashed save is removed)."""
    tmp = step_dir(save_dir, step) + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def finish_write(tmp: str, manifest: dict[str, Any]) -> str:
    """Write the manifest (with every file's size), rename tmp -> iter_N, then update LATEST."""
    files = {}
    for root, _, names in os.walk(tmp):
        for n in names:
            path = os.path.join(root, n)
            files[os.path.relpath(path, tmp)] = os.path.getsize(path)
    manifest = dict(manifest, format=FORMAT, version=VERSION, files=dict(sorted(files.items())))
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    final = tmp[: -len(".tmp")]
    if os.path.exists(final):  # re-saving a step: keep the old one until the new one is in place
        os.replace(final, final + ".old")
    os.replace(tmp, final)
    shutil.rmtree(final + ".old", ignore_errors=True)
    latest = os.path.join(os.path.dirname(final), LATEST)
    with open(latest + ".tmp", "w") as f:
        f.write(str(manifest["step"]))
    os.replace(latest + ".tmp", latest)
    return final


def is_megatron_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, LATEST)) or os.path.isfile(os.path.join(path, MANIFEST))


def resolve(path: str) -> str:
    """The step directory of `path` (a save root with LATEST, or an iter_N directory)."""
    latest = os.path.join(path, LATEST)
    if os.path.isfile(latest):
        with open(latest) as f:
            text = f.read().strip()
        if not text.isdigit():
            raise UserInputError(f"{latest} says {text!r}, not a step number; fix it or point load: at an iter_* directory.")
        path = step_dir(path, int(text))
    if not os.path.isfile(os.path.join(path, MANIFEST)):
        raise UserInputError(f"{path} has no {MANIFEST}; it is not a complete checkpoint of this project "
                             "(an interrupted save, or a Megatron-LM checkpoint: convert it from HF with convert_ckpt.py).")
    return path


def read_manifest(path: str, verify: bool = True) -> dict[str, Any]:
    """manifest.json of a step directory; with verify, every listed file must exist with its size."""
    path = resolve(path)
    with open(os.path.join(path, MANIFEST)) as f:
        try:
            manifest = json.load(f)
        except json.JSONDecodeError as err:
            raise UserInputError(f"{os.path.join(path, MANIFEST)} is not valid JSON ({err}); the checkpoint is damaged.") from None
    if manifest.get("format") != FORMAT:
        raise UserInputError(f"{os.path.join(path, MANIFEST)} is not a {FORMAT} manifest.")
    for rel, size in manifest["files"].items() if verify else ():
        full = os.path.join(path, rel)
        if not os.path.isfile(full) or os.path.getsize(full) != size:
            got = os.path.getsize(full) if os.path.isfile(full) else "missing"
            raise UserInputError(f"{full} is {got if got == 'missing' else f'{got} bytes'} but {MANIFEST} "
                                 f"records {size} bytes; the checkpoint copy is incomplete, copy it again.")
    manifest["path"] = path
    return manifest


def complete_checkpoints(save_dir: str) -> list[tuple[int, str]]:
    """(step, iter dir) of every complete checkpoint under save_dir, oldest first. Directories
    whose files do not match their manifest (copies in progress, damage) are left out; `.tmp`
    directories of interrupted saves are never candidates."""
    found = []
    if not os.path.isdir(save_dir):
        return found
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        if not (name.startswith("iter_") and name[5:].isdigit() and os.path.isdir(path)):
            continue
        try:
            found.append((int(read_manifest(path)["step"]), path))
        except UserInputError as err:
            log.warning("skipping %s: %s", path, err)
    return sorted(found)


def latest_complete(save_dir: str) -> Optional[str]:
    """The newest complete checkpoint under save_dir (see complete_checkpoints), or None."""
    done = complete_checkpoints(save_dir)
    return done[-1][1] if done else None


def prune(save_dir: str, keep_last_n: int) -> list[str]:
    """Delete all but the newest keep_last_n complete checkpoints (0 keeps all); returns what went."""
    if keep_last_n <= 0:
        return []
    gone = [path for _, path in complete_checkpoints(save_dir)[:-keep_last_n]]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def read_trainer_state(path: str) -> dict[str, Any]:
    """trainer_state.json of a checkpoint ({} for checkpoints written without a trainer)."""
    file = os.path.join(resolve(path), TRAINER_STATE)
    if not os.path.isfile(file):
        return {}
    with open(file) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# reading a checkpoint under HF names (any TP/PP)


class MegatronCheckpointReader:
    """The TensorReader interface (hf_bridge.checkpoint_io) over a checkpoint of this project:
    HF tensor names, full tensors, TP shards merged on read. Holds one merged tensor at a time."""

    def __init__(self, path: str):
        self.manifest = read_manifest(path)
        self.path, m = self.manifest["path"], self.manifest
        self.args = m["model_args"]
        self.vocab_size = int(m.get("vocab_size") or self.args["padded_vocab_size"])
        tied = not self.args.get("untie_embeddings_and_output_weights", False)
        self._files: dict[str, list[str]] = {}  # megatron name -> files of TP (ETP) ranks 0..tp-1
        self.stages: list[list[str]] = []  # HF names held by each pipeline stage, in file order
        self.hf_to_mcore: dict[str, str] = {}
        ep, etp = int(m.get("ep", 1)), int(m.get("etp", m["tp"]))
        moe = any(rel.startswith("expert_rank_") for rel in m["files"])
        for pp_rank in range(m["pp"]):
            first = []  # files holding TP (ETP) rank 0's tensors of this stage
            for tp_rank in range(m["tp"]):
                first += [self._add(os.path.join(self.path, rank_dir(tp_rank, pp_rank), MODEL_FILE), tp_rank)]
            # a stage of dense layers only (GLM-4.5's first layers) has no expert files
            for ep_rank in range(ep) if moe and stage_expert_names(self.args, m["pp"], pp_rank, 1, 0) else ():
                for etp_rank in range(etp):
                    file = os.path.join(self.path, expert_rank_dir(etp_rank, pp_rank, ep_rank), MODEL_FILE)
                    first += [self._add(file, etp_rank)]
            self.stages.append([])
            for name in (n for f in first if f for n in open_safetensors(f).keys()):
                if name == "output_layer.weight" and tied:
                    continue  # the last stage's copy of the tied embedding
                for hf_name in model_hf_names(name, None, self.args, tied)[1]:
                    self.hf_to_mcore[hf_name] = name
                    self.stages[-1].append(hf_name)
        self._cache: tuple[str, dict[str, torch.Tensor]] = ("", {})

    def _add(self, file: str, shard_rank: int) -> Optional[str]:
        """Record the tensors of one file; returns it when it holds shard 0 (names listed once)."""
        for name in open_safetensors(file).keys():
            self._files.setdefault(name, []).append(file)
        return file if shard_rank == 0 else None

    def mcore_names(self) -> list[str]:
        return list(self._files)

    def read_mcore(self, name: str) -> torch.Tensor:
        """The full (TP-merged) megatron tensor."""
        shards = []
        for file in self._files[name]:
            shards.append(open_safetensors(file).get_tensor(name))
        tied = not self.args.get("untie_embeddings_and_output_weights", False)
        return merge_tp(kind_of(name, tied, gated_mlp(self.args)), shards)

    def _hf(self, name: str) -> torch.Tensor:
        mcore = self.hf_to_mcore.get(name)
        if mcore is None:
            raise UserInputError(f"tensor {name} is not in the checkpoint {self.path}; it was saved from another architecture.")
        if self._cache[0] != mcore:
            self._cache = (mcore, mcore_to_hf(mcore, self.read_mcore(mcore), self.args, self.vocab_size))
        return self._cache[1][name]

    def where(self, name: str) -> str:
        return self.path

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._hf(name).shape)

    def read(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor:
        t = self._hf(name)
        if cols is not None:
            return t[rows or slice(None), cols]
        return t[rows] if rows is not None else t


# ---------------------------------------------------------------------------------------------
# live save / load (every rank calls; collective over the world)


def _ranks() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return dict(tp=ps.get_tensor_model_parallel_world_size(), pp=ps.get_pipeline_model_parallel_world_size(),
                vpp=ps.get_virtual_pipeline_model_parallel_world_size() or 1, dp=ps.get_data_parallel_world_size(),
                tp_rank=ps.get_tensor_model_parallel_rank(),
                pp_rank=ps.get_pipeline_model_parallel_rank(), dp_rank=ps.get_data_parallel_rank(),
                ep=ps.get_expert_model_parallel_world_size(), etp=ps.get_expert_tensor_parallel_world_size(),
                ep_rank=ps.get_expert_model_parallel_rank(), etp_rank=ps.get_expert_tensor_parallel_rank(),
                edp_rank=ps.get_expert_data_parallel_rank())


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _is_distributed_optimizer(optimizer) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    chain = getattr(optimizer, "chained_optimizers", [optimizer])
    return any(isinstance(o, DistributedOptimizer) for o in chain)


def _grad_scalers(optimizer) -> list[Optional[dict[str, Any]]]:
    """The fp16 loss scaler's state of each chained optimizer (None where there is none)."""
    return [o.grad_scaler.state_dict() if getattr(o, "grad_scaler", None) else None
            for o in getattr(optimizer, "chained_optimizers", [optimizer])]


def _load_optimizer_shards(optimizer, shards: list[dict[str, Any]]) -> None:
    chain = getattr(optimizer, "chained_optimizers", [optimizer])
    if len(chain) != len(shards):
        raise UserInputError(f"the checkpoint has {len(shards)} optimizer(s) but this run builds {len(chain)}; "
                             "resume with the saved settings or set no_load_optim: true.")
    for o, shard in zip(chain, shards):
        o.optimizer.load_state_dict(shard["inner"])
        mains = [p for g in o.optimizer.param_groups for p in g["params"]]
        for p, saved in zip(mains, shard["main_params"], strict=True):
            p.data.copy_(saved)
        if o.grad_scaler and shard["grad_scaler"]:
            o.grad_scaler.load_state_dict(shard["grad_scaler"])


def chunk_state_dict(model) -> dict[str, torch.Tensor]:
    """This rank's tensors keyed by megatron names with global layer numbers (DDP unwrapped); for a
    list of virtual-pipeline chunks, all of them (their names never collide: models/chunks.py)."""
    out = {}
    for chunk in as_chunks(model):
        chunk = getattr(chunk, "module", chunk)
        for local, tensor in chunk.state_dict().items():
            if not local.endswith("_extra_state"):
                out[global_param_name(chunk, local)[0]] = tensor.detach()
    return out


def _rng_state() -> dict[str, Any]:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "tracker": get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: Mapping[str, Any]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def save_checkpoint(save_dir: str, step: int, model: torch.nn.Module, args: Mapping[str, Any],
                    optimizer=None, scheduler=None, vocab_size: Optional[int] = None,
                    hf_config: Optional[Mapping[str, Any]] = None, params_dtype: str = "",
                    trainer_state: Optional[Mapping[str, Any]] = None, manifest_extra: Optional[Mapping[str, Any]] = None,
                    keep_last_n: int = 0) -> str:
    """Save model (+ optimizer, scheduler, rng) at `step`; every rank calls it. Returns iter dir.

    Args:
        model: this rank's GPTModel chunk (or its DDP wrapper), or its list of virtual-pipeline chunks.
        args: the Megatron-named args it was built from (recorded in the manifest).
        vocab_size: the real (HF / tokenizer) vocabulary; exports drop padding rows past it.
        hf_config: config.json of the HF checkpoint the run started from, kept for HF export.
        trainer_state: JSON-able state written as trainer_state.json (global rank 0's is kept).
        manifest_extra: more manifest entries (e.g. config_hash).
        keep_last_n: afterwards, delete all but the newest keep_last_n checkpoints (0 keeps all).
    """
    r = _ranks()
    tmp = step_dir(save_dir, step) + ".tmp"
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        begin_write(save_dir, step)
    _barrier()
    here = os.path.join(tmp, rank_dir(r["tp_rank"], r["pp_rank"]))
    os.makedirs(here, exist_ok=True)
    state = chunk_state_dict(model)
    if r["dp_rank"] == 0:
        tensors = {k: v.contiguous() for k, v in state.items() if not is_expert_param(k)}
        save_file(tensors, os.path.join(here, MODEL_FILE), metadata={"format": FORMAT})
    experts = {k: v.contiguous() for k, v in state.items() if is_expert_param(k)}
    if experts and r["edp_rank"] == 0:  # experts differ across EP ranks, which live in the DP dimension
        where = os.path.join(tmp, expert_rank_dir(r["etp_rank"], r["pp_rank"], r["ep_rank"]))
        os.makedirs(where, exist_ok=True)
        save_file(experts, os.path.join(where, MODEL_FILE), metadata={"format": FORMAT})
    distributed = optimizer is not None and _is_distributed_optimizer(optimizer)
    sched = scheduler.state_dict() if scheduler is not None else None
    if optimizer is not None:  # Adam's state per parameter (any layout resumes it), the rest in optim*.pt
        optimizer_state.save_state(optimizer, model, tmp, r, distributed)
        if distributed or r["dp_rank"] == 0:
            torch.save({"scheduler": sched, "grad_scalers": _grad_scalers(optimizer)},
                       os.path.join(here, f"optim_dp{r['dp_rank']:03d}.pt" if distributed else "optim.pt"))
    torch.save(_rng_state(), os.path.join(here, f"rng_dp{r['dp_rank']:03d}.pt"))
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if rank0 and trainer_state is not None:
        with open(os.path.join(tmp, TRAINER_STATE), "w") as f:
            json.dump(trainer_state, f, indent=1)
    _barrier()
    final = step_dir(save_dir, step)
    if rank0:
        finish_write(tmp, {"step": step, "tp": r["tp"], "pp": r["pp"], "vpp": r["vpp"], "dp": r["dp"], "ep": r["ep"], "etp": r["etp"],
                           "params_dtype": params_dtype, "vocab_size": vocab_size, "model_args": _jsonable(args),
                           "hf_config": dict(hf_config) if hf_config else None,
                           "has_optimizer": optimizer is not None, "distributed_optimizer": distributed,
                           "optimizer_state": optimizer_state.PER_PARAMETER,
                           **dict(manifest_extra or {})})
        log.info("saved checkpoint step %d to %s", step, final)
        for path in prune(save_dir, keep_last_n):
            log.info("removed old checkpoint %s (keep_last_n=%d)", path, keep_last_n)
    _barrier()
    return final


def check_args_match(manifest: Mapping[str, Any], args: Mapping[str, Any]) -> None:
    """The checkpoint's architecture must be the model's: name the first differing field."""
    saved = manifest["model_args"]
    for key in _ARCH_KEYS:
        if key in saved and args.get(key) is not None and saved[key] is not None and saved[key] != args[key]:
            raise UserInputError(f"{manifest['path']} was saved with {key} {saved[key]} but the model config says "
                                 f"{args[key]}; load it with the model it was saved from.")


@torch.no_grad()
def load_checkpoint(path: str, model: torch.nn.Module, args: Mapping[str, Any], optimizer=None,
                    scheduler=None, load_optimizer: bool = True, load_rng: bool = True) -> int:
    """Load a checkpoint of this project into this rank's chunk; every rank calls it.

    Weights, the optimizer's state and the lr scheduler load at any TP/PP/DP (checkpoints written
    before 2026-11-30: the optimizer only at the saved layout); rng only at the saved TP/PP/DP (see
    the module docstring). Returns the checkpoint's step.
    """
    manifest = read_manifest(path)
    check_args_match(manifest, args)
    path, r, m = manifest["path"], _ranks(), manifest
    # the virtual pipeline decides which layers a (tp, pp) file holds, so it is part of the layout;
    # MoE checkpoints always re-shard through the reader (experts live in their own files)
    moe = any(rel.startswith("expert_rank_") for rel in m["files"])
    same_mp = (m["tp"], m["pp"], m.get("vpp", 1)) == (r["tp"], r["pp"], r["vpp"]) and not moe
    inners = [getattr(chunk, "module", chunk) for chunk in as_chunks(model)]
    if same_mp:
        file = os.path.join(path, rank_dir(r["tp_rank"], r["pp_rank"]), MODEL_FILE)
        with open_safetensors(file) as f:
            stored = set(f.keys())
            for inner in inners:
                for local, tensor in inner.state_dict(keep_vars=True).items():
                    if local.endswith("_extra_state"):
                        continue
                    name = global_param_name(inner, local)[0]
                    if name not in stored:
                        raise UserInputError(f"tensor {name} is not in {file}; the checkpoint is from another model.")
                    value = f.get_tensor(name)
                    if value.shape != tensor.shape:
                        raise UserInputError(f"tensor {name} in {file} has shape {list(value.shape)} but the model "
                                             f"has {list(tensor.shape)}; check padded_vocab_size and the model config.")
                    tensor.copy_(value.to(tensor.dtype))
    else:
        reader = MegatronCheckpointReader(path)
        for inner in inners:
            load_into_model(inner, reader, args, *model_parallel_ranks())
    here = os.path.join(path, rank_dir(r["tp_rank"], r["pp_rank"]))
    # the lr schedule (and loss scalers) of DP rank 0, which every layout takes
    first = os.path.join(path, rank_dir(0, 0), "optim_dp000.pt" if m.get("distributed_optimizer") else "optim.pt")
    if optimizer is not None and load_optimizer and optimizer_state.resumes_anywhere(m):
        optimizer_state.load_state(path, m, model, optimizer, args)
        state = torch.load(first, weights_only=False)
        for o, saved in zip(getattr(optimizer, "chained_optimizers", [optimizer]), state.get("grad_scalers") or []):
            if getattr(o, "grad_scaler", None) and saved:
                o.grad_scaler.load_state_dict(saved)
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
    elif optimizer is not None and load_optimizer and m.get("has_optimizer"):  # written before 2026-11-30
        if not same_mp and not moe or m["dp"] != r["dp"] or (m.get("ep", 1), m.get("etp", m["tp"])) != (r["ep"], r["etp"]):
            raise UserInputError(
                f"{path} holds optimizer state for TP={m['tp']} PP={m['pp']} VPP={m.get('vpp', 1)} DP={m['dp']} but "
                f"this run is TP={r['tp']} PP={r['pp']} VPP={r['vpp']} DP={r['dp']}; resume with the saved layout "
                f"or set no_load_optim: true.")
        if m.get("distributed_optimizer"):
            state = torch.load(os.path.join(here, f"optim_dp{r['dp_rank']:03d}.pt"), weights_only=False)
            _load_optimizer_shards(optimizer, state["shards"])
        else:
            state = torch.load(os.path.join(here, "optim.pt"), weights_only=False)
            optimizer.load_state_dict(state["optimizer"])
        from mindspeed_rl.models.optimizer import use_fused_adam

        use_fused_adam(optimizer)  # the saved param groups carry the saving run's kernel choice
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
    elif scheduler is not None and m.get("has_optimizer"):  # the lr schedule does not depend on the layout
        state = torch.load(first, weights_only=False)
        if state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
    rng_file = os.path.join(here, f"rng_dp{r['dp_rank']:03d}.pt")
    same_layout = (m["tp"], m["pp"], m["dp"], m.get("ep", 1)) == (r["tp"], r["pp"], r["dp"], r["ep"])
    if load_rng and same_layout and os.path.isfile(rng_file):
        _set_rng_state(torch.load(rng_file, weights_only=False))
    _barrier()
    log.info("loaded checkpoint step %d from %s (saved at TP=%d PP=%d)", m["step"], path, m["tp"], m["pp"])
    return int(m["step"])


def load_weights(model: torch.nn.Module, path: str, args: Mapping[str, Any]) -> int:
    """What `load:` does for weights: a checkpoint of this project (any TP/PP; returns its step) or a
    HF directory (returns 0). Optimizer/rng are left alone (see load_checkpoint for resume)."""
    if is_megatron_checkpoint(path):
        return load_checkpoint(path, model, args, load_rng=False)
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint

    for chunk in as_chunks(model):
        load_hf_checkpoint(getattr(chunk, "module", chunk), path, args)
    return 0
