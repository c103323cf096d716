"""The optimizer's state per parameter, so that a checkpoint resumes with it at any TP / PP / VPP / DP / EP.

Megatron lays its optimizer state out by its parameter buffers: the distributed optimizer gives each
DP rank a contiguous range of a flat buffer whose order and padding depend on TP, PP, DP and the
bucket sizes, and DP = 1 runs another optimizer class altogether. A checkpoint of that layout
resumes only at the same one. Here every rank writes, beside its weights, what its optimizer holds
for each parameter it updates, under the parameter's checkpoint name:

    mp_rank_XX_YYY/optim_state_dp{d:03d}.safetensors            dense parameters (DP rank d)
    expert_rank_XX_YYY_ZZZ/optim_state_dp{d:03d}.safetensors    experts (expert-data-parallel rank d)

Tensors `{key}/{megatron name}` are elements [start, end) of the flattened TP-local parameter (its
shape is the one in model.safetensors of the same directory): key `param` is the fp32 main
parameter, the others are the inner optimizer's per-parameter tensors (Adam: `exp_avg`,
`exp_avg_sq`). The file's metadata holds `slices` ({name: [start, end]}) and `scalars` ({name: {key:
value}}: torch Adam's `step`, or `group_step`, the step count Apex's and Transformer Engine's fused Adam keep
in the parameter's param group). The distributed optimizer's DP ranks each write their slice; without it DP
rank 0 writes whole parameters.

Loading at the saved TP / PP / VPP / EP / ETP reads the rank's own directory, gathering the slices of
every saved DP rank (so DP may change). At another layout each state tensor goes the way the weights
go (`MegatronCheckpointReader`: TP shards merged, served under HF names, re-sharded by
hf_bridge.mapping.read_shard), which only slices, concatenates and permutes, so every value arrives
unchanged. Padded vocabulary rows come back as zeros, as their weights do. Then each rank takes its
optimizer's range of each parameter. The fp32 main parameters come from the saved ones, so a bf16
run keeps the bits its bf16 weights round away.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator, Mapping

import torch
from safetensors.torch import save_file

from mindspeed_rl.models.chunks import as_chunks
from mindspeed_rl.models.hf_bridge.checkpoint_io import open_safetensors
from mindspeed_rl.models.hf_bridge.loader import global_param_name, shard_for
from mindspeed_rl.utils.errors import UserInputError

STATE_FILE = "optim_state_dp{:03d}.safetensors"
_STATE_FILE_RE = re.compile(r"optim_state_dp(\d{3})\.safetensors$")
PER_PARAMETER = "per_parameter"  # the manifest's `optimizer_state` for checkpoints written this way
GROUP_STEP = "group_step"  # a scalar saved with each parameter: its param group's step count (Apex / TE Adam)
_WEIGHTS_ONLY = ("start from its weights alone with actor_rollout_ref.actor_rollout.load: {} instead of "
                 "training.resume (Adam's moments then start fresh).")


def _param_names(model) -> dict[int, tuple[torch.nn.Module, str, str]]:
    """id(parameter) -> (its chunk, local name, global checkpoint name), over every chunk."""
    out = {}
    for chunk in as_chunks(model):
        inner = getattr(chunk, "module", chunk)
        for local, p in inner.named_parameters():
            out[id(p)] = (inner, local, global_param_name(inner, local)[0])
    return out


def held(optimizer) -> Iterator[tuple[torch.nn.Parameter, int, int, torch.Tensor, torch.optim.Optimizer]]:
    """(model parameter, start, end, main parameter, inner optimizer) for every parameter this rank's
    optimizer updates: [start, end) of the flattened parameter, whose fp32 copy `main` is (1-D under
    the distributed optimizer, the parameter's shape otherwise)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = o.optimizer
        if isinstance(o, DistributedOptimizer):
            for p, (group, order) in o.model_param_group_index_map.items():
                rng = o._get_model_param_range_map(p)["param"]
                yield p, rng.start, rng.end, inner.param_groups[group]["params"][order], inner
        elif hasattr(o, "float16_groups"):  # Float16OptimizerWithFloat16Params: fp32 copies of bf16 / fp16 params
            for params, mains in zip(o.float16_groups, o.fp32_from_float16_groups):
                for p, main in zip(params, mains):
                    yield p, 0, p.numel(), main, inner
            for params in o.fp32_from_fp32_groups:
                for p in params:
                    yield p, 0, p.numel(), p, inner
        else:  # FP32Optimizer: the model's own parameters
            for group in inner.param_groups:
                for p in group["params"]:
                    yield p, 0, p.numel(), p, inner


def _group_of(inner: torch.optim.Optimizer, main: torch.Tensor, cache: dict) -> dict:
    """The inner optimizer's param group holding `main` (cache: {} kept by the caller)."""
    if id(inner) not in cache:
        cache[id(inner)] = {id(p): group for group in inner.param_groups for p in group["params"]}
    return cache[id(inner)][id(main)]


def _dir_of(name: str, root: str, r: Mapping[str, int]) -> tuple[str, int]:
    """(directory, DP index) of a parameter's state: the experts' own directory and expert-DP rank,
    else the rank directory and DP rank (models/checkpoint.py's layout)."""
    from mindspeed_rl.models.checkpoint import expert_rank_dir, is_expert_param, rank_dir

    if is_expert_param(name):
        return os.path.join(root, expert_rank_dir(r["etp_rank"], r["pp_rank"], r["ep_rank"])), r["edp_rank"]
    return os.path.join(root, rank_dir(r["tp_rank"], r["pp_rank"])), r["dp_rank"]


@torch.no_grad()
def save_state(optimizer, model, root: str, r: Mapping[str, int], distributed: bool) -> None:
    """Write this rank's per-parameter optimizer state under `root` (an iter_N.tmp directory).
    `distributed`: the distributed optimizer (every DP rank writes its slices; otherwise DP rank 0)."""
    names, groups = _param_names(model), {}
    files: dict[str, tuple[dict, dict, dict]] = {}
    for p, start, end, main, inner in held(optimizer):
        name = names[id(p)][2]
        where, dp = _dir_of(name, root, r)
        if dp != 0 and not distributed:
            continue  # every DP rank holds the same whole state; rank 0 writes it
        tensors, slices, scalars = files.setdefault(os.path.join(where, STATE_FILE.format(dp)), ({}, {}, {}))
        tensors[f"param/{name}"] = main.detach().reshape(-1).to("cpu", copy=True)
        slices[name] = [start, end]
        for key, value in inner.state.get(main, {}).items():
            if torch.is_tensor(value) and value.dim() > 0:
                if value.numel() != end - start:
                    raise RuntimeError(f"optimizer state {key} of {name} has {value.numel()} elements, its parameter "
                                       f"slice {end - start}; models/optimizer_state.py cannot save it.")
                tensors[f"{key}/{name}"] = value.detach().reshape(-1).to("cpu", copy=True)
            elif torch.is_tensor(value) or isinstance(value, (int, float)):
                scalars.setdefault(name, {})[key] = float(value)
        group_step = _group_of(inner, main, groups).get("step")  # Apex's and TE's fused Adam count steps per group
        if group_step is not None:
            scalars.setdefault(name, {})[GROUP_STEP] = float(group_step)
    for file, (tensors, slices, scalars) in files.items():
        os.makedirs(os.path.dirname(file), exist_ok=True)
        save_file(tensors, file, metadata={"slices": json.dumps(slices), "scalars": json.dumps(scalars)})


class _SliceIndex:
    """Where each parameter's saved slices are: per directory, its optim_state_dp*.safetensors."""

    def __init__(self, root: str):
        self.root = root
        self._dirs: dict[str, dict[str, list[tuple[str, int, int]]]] = {}
        self._keys: dict[str, dict[str, list[str]]] = {}  # file -> {name: its saved tensor keys}
        self._open: dict[str, Any] = {}  # file -> its safe_open handle (each header parsed once)
        self.scalars: dict[str, dict[str, float]] = {}

    def file(self, path: str):
        if path not in self._open:
            self._open[path] = open_safetensors(path)
        return self._open[path]

    def model_shape(self, directory: str, name: str) -> tuple[int, ...]:
        """The shape of `name` in the directory's model.safetensors (its TP-local parameter)."""
        from mindspeed_rl.models.checkpoint import MODEL_FILE

        return tuple(self.file(os.path.join(directory, MODEL_FILE)).get_slice(name).get_shape())

    def entries(self, directory: str) -> dict[str, list[tuple[str, int, int]]]:
        if directory not in self._dirs:
            found: dict[str, list[tuple[str, int, int]]] = {}
            for file in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
                if not _STATE_FILE_RE.match(file):
                    continue
                path = os.path.join(directory, file)
                meta = self.file(path).metadata() or {}
                for name, (start, end) in json.loads(meta.get("slices", "{}")).items():
                    found.setdefault(name, []).append((path, start, end))
                for name, values in json.loads(meta.get("scalars", "{}")).items():
                    self.scalars.setdefault(name, {}).update(values)
            self._dirs[directory] = found
        return self._dirs[directory]

    def _parts(self, directory: str, name: str) -> list[tuple[str, int, int]]:
        parts = self.entries(directory).get(name)
        if not parts:
            raise UserInputError(f"{directory} holds no optimizer state for {name}; the checkpoint is incomplete, "
                                 f"from another model, or its run froze {name} (freeze_parameters): "
                                 f"{_WEIGHTS_ONLY.format(self.root)}")
        return parts

    def tp_local(self, directory: str, name: str, key: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The saved TP-local tensor `key` of `name` in `directory`, its DP slices put together."""
        numel = 1
        for n in shape:
            numel *= n
        parts = self._parts(directory, name)
        out, covered = torch.zeros(numel, dtype=torch.float32), 0
        for path, start, end in parts:
            out[start:end] = self.file(path).get_tensor(f"{key}/{name}")
            covered += end - start
        if covered != numel:
            raise UserInputError(f"the optimizer state of {name} in {directory} covers {covered} of its {numel} elements; "
                                 "a DP rank's optim_state file is missing, copy the checkpoint again.")
        return out.reshape(shape)

    def keys(self, directory: str, name: str) -> list[str]:
        """The tensor keys saved for `name` (param, exp_avg, ...), from its first slice's file."""
        path = self._parts(directory, name)[0][0]
        if path not in self._keys:
            by_name: dict[str, list[str]] = {}
            for stored in self.file(path).keys():
                key, of = stored.split("/", 1)
                by_name.setdefault(of, []).append(key)
            self._keys[path] = {n: sorted(k) for n, k in by_name.items()}
        return self._keys[path][name]

    def load_all(self) -> None:
        """Index every directory of the checkpoint (its scalars included)."""
        for sub in sorted(os.listdir(self.root)):
            if os.path.isdir(os.path.join(self.root, sub)):
                self.entries(os.path.join(self.root, sub))

    def any_name(self) -> tuple[str, str]:
        """(directory, name) of some saved parameter."""
        self.load_all()
        for directory, found in self._dirs.items():
            for name in found:
                return directory, name
        raise UserInputError(f"{self.root} holds no optimizer state files ({STATE_FILE.format(0)}): "
                             f"{_WEIGHTS_ONLY.format(self.root)}")

    def shared_scalars(self) -> dict[str, float]:
        """The scalar state (Adam's step) every parameter shares: at another layout a parameter's
        saved entry may be under another name, so all saved values must agree."""
        self.load_all()
        values: dict[str, set] = {}
        for per_name in self.scalars.values():
            for key, v in per_name.items():
                values.setdefault(key, set()).add(v)
        mixed = {k: sorted(v) for k, v in values.items() if len(v) > 1}
        if mixed:
            raise UserInputError(f"{self.root}: the parameters' optimizer step counts differ ({mixed}), so they cannot "
                                 f"be re-sharded; resume at the saved TP/PP/DP, or {_WEIGHTS_ONLY.format(self.root)}")
        return {k: next(iter(v)) for k, v in values.items()}


def _state_reader(path: str, key: str, index: _SliceIndex):
    """The checkpoint's `key` state under HF names (TP shards merged), as MegatronCheckpointReader
    serves its weights."""
    from mindspeed_rl.models.checkpoint import MegatronCheckpointReader
    from mindspeed_rl.models.hf_bridge.mapping import gated_mlp
    from mindspeed_rl.models.hf_bridge.sharding import kind_of, merge_tp

    class StateReader(MegatronCheckpointReader):
        def read_mcore(self, name: str) -> torch.Tensor:
            shards = [index.tp_local(os.path.dirname(f), name, key, index.model_shape(os.path.dirname(f), name))
                      for f in self._files[name]]
            tied = not self.args.get("untie_embeddings_and_output_weights", False)
            return merge_tp(kind_of(name, tied, gated_mlp(self.args)), shards)

    return StateReader(path)


@torch.no_grad()
def load_state(path: str, manifest: Mapping[str, Any], model, optimizer, args: Mapping[str, Any]) -> int:
    """Fill this rank's optimizer from a checkpoint written by save_state, at any layout; returns the
    number of parameters restored. The fp32 main parameters are the saved ones."""
    from mindspeed_rl.models.checkpoint import _ranks
    from mindspeed_rl.models.hf_bridge.loader import model_parallel_ranks
    from mindspeed_rl.models.optimizer import use_fused_adam

    r, m = _ranks(), manifest
    same_mp = ((m["tp"], m["pp"], m.get("vpp", 1), m.get("ep", 1), m.get("etp", m["tp"]))
               == (r["tp"], r["pp"], r["vpp"], r["ep"], r["etp"]))
    names, index, readers, groups = _param_names(model), _SliceIndex(path), {}, {}
    restored = 0
    for p, start, end, main, inner in held(optimizer):
        chunk, local, name = names[id(p)]
        if same_mp:
            where = _dir_of(name, path, r)[0]
            values = {key: index.tp_local(where, name, key, tuple(p.shape)) for key in index.keys(where, name)}
            scalars = index.scalars.get(name, {})
        else:
            if not readers:
                keys = index.keys(*index.any_name())
                readers = {key: _state_reader(path, key, index) for key in keys}
                shared = index.shared_scalars()
            values = {key: shard_for(chunk, local, tuple(p.shape), reader, args, *model_parallel_ranks())
                      for key, reader in readers.items()}
            scalars = shared
        flat = {key: v.reshape(-1)[start:end] for key, v in values.items()}
        main.copy_(flat.pop("param").view_as(main))
        state = {key: v.to(device=main.device, dtype=main.dtype).view_as(main).clone() for key, v in flat.items()}
        scalars = dict(scalars)
        if GROUP_STEP in scalars:
            step = scalars.pop(GROUP_STEP)
            _group_of(inner, main, groups)["step"] = int(step) if float(step).is_integer() else step
        state.update({key: torch.tensor(v, dtype=torch.float32) for key, v in scalars.items()})
        if state:
            inner.state[main] = state
        restored += 1
    use_fused_adam(optimizer)  # the step counts onto the device where the fused kernel wants them
    return restored


def resumes_anywhere(manifest: Mapping[str, Any]) -> bool:
    """Whether the checkpoint's optimizer state loads at any layout (written by save_state)."""
    return bool(manifest.get("has_optimizer")) and manifest.get("optimizer_state") == PER_PARAMETER
