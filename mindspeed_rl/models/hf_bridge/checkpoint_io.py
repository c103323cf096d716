"""Read tensors (or row/column ranges of them) from a Hugging Face safetensors directory.

Both layouts are supported: a single `model.safetensors`, or shards listed by
`model.safetensors.index.json`. Tensors are looked up by the bridge's canonical HF names; an
architecture that stores some under other names or fused (Mixtral's names, Phi-3's q/k/v and
gate/up, by config.json's model_type) is translated here (hf_bridge/names.py), and messages name
the stored tensor. Files are opened lazily with `safetensors.safe_open` and only the
requested slice is read, so a TP rank reads only its shard of each tensor. Every failure is one
sentence naming the tensor and file: a missing shard, a missing tensor, a shape mismatch.

`DictReader` serves the same interface from an in-memory state dict (conversions and tests).
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional, Protocol

import torch
from safetensors import safe_open

from mindspeed_rl.models.hf_bridge.names import canonical_name, fused_name, fused_parts, own_names, stored_name
from mindspeed_rl.utils.errors import UserInputError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TORCH_BIN_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # the older format, not read here


def open_safetensors(path: str):
    """safe_open, with a corrupt or truncated file named in one sentence."""
    try:
        return safe_open(path, framework="pt")
    except Exception as err:  # safetensors raises SafetensorError / OSError; the cause is the file
        raise UserInputError(f"{path} is not a readable safetensors file ({err}); it is corrupt or "
                             "incompletely downloaded: download it again.") from None


class TensorReader(Protocol):
    def shape(self, name: str) -> tuple[int, ...]: ...
    def read(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor: ...
    def where(self, name: str) -> str: ...


class SafetensorsReader:
    """Lazy reader over a HF checkpoint directory."""

    def __init__(self, directory: str):
        self.directory = directory
        index_path = os.path.join(directory, INDEX_FILE)
        single_path = os.path.join(directory, SINGLE_FILE)
        self._handles: dict[str, object] = {}
        if os.path.isfile(index_path):
            with open(index_path) as f:
                try:
                    self.weight_map: dict[str, str] = json.load(f)["weight_map"]
                except (json.JSONDecodeError, KeyError) as err:
                    raise UserInputError(f"{index_path} is not a valid safetensors index ({err}).") from None
            missing = sorted({s for s in self.weight_map.values()
                              if not os.path.isfile(os.path.join(directory, s))})
            if missing:
                raise UserInputError(
                    f"{directory}: shard file(s) {', '.join(missing)} listed in {INDEX_FILE} are "
                    "missing; download the complete checkpoint.")
        elif os.path.isfile(single_path):
            self.weight_map = {k: SINGLE_FILE for k in open_safetensors(single_path).keys()}
        elif any(os.path.isfile(os.path.join(directory, f)) for f in TORCH_BIN_FILES):
            raise UserInputError(
                f"{directory} holds PyTorch .bin weights ({', '.join(f for f in TORCH_BIN_FILES if os.path.isfile(os.path.join(directory, f)))}), "
                f"which load: does not read (unpickling runs code); convert them to safetensors once with python -c "
                f"\"import transformers as t; t.AutoModelForCausalLM.from_pretrained('{directory}').save_pretrained("
                f"'{directory.rstrip('/')}-safetensors')\" (then copy the tokenizer files) and load that directory.")
        else:
            raise UserInputError(
                f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}; point load: at a Hugging "
                "Face checkpoint directory with safetensors weights.")
        config = _own_names_config(directory)
        self.model_type = config.get("model_type")
        self._parts: dict[str, tuple[str, int, int]] = {}  # canonical -> (fused stored name, first row, rows)
        self._stored: dict[str, str] = {}  # canonical -> the name the checkpoint stores it under
        if config:  # canonical name -> file; the stored name is stored_name(canonical) or a fused tensor
            canonical = {}
            for name, file in self.weight_map.items():
                parts = fused_parts(name, config)
                if parts is None:
                    canonical[canonical_name(name, self.model_type)] = file
                    self._stored[canonical_name(name, self.model_type)] = name
                for part, start, rows in parts or ():
                    canonical[part] = file
                    self._parts[part] = (name, start, rows)
            self.weight_map = canonical

    def where(self, name: str) -> str:
        return os.path.join(self.directory, self.weight_map.get(name, "?"))

    def stored(self, name: str) -> str:
        """Where the checkpoint stores the canonical tensor `name` (for messages): its own name, or
        the rows of a fused tensor."""
        if name in self._parts:
            fused, start, rows = self._parts[name]
            return f"{fused} (rows {start}-{start + rows - 1}, its {name.rsplit('.', 2)[-2]})"
        return self._stored.get(name) or fused_name(name, self.model_type) or stored_name(name, self.model_type)

    def _slice(self, name: str):
        """(safetensors slice, first row, rows or None for the whole tensor) of canonical `name`."""
        file = self.weight_map.get(name)
        stored, start, rows = self._parts.get(name, (self.stored(name), 0, None))
        if file is None:
            raise UserInputError(
                f"tensor {stored} is not in the checkpoint {self.directory}; the checkpoint does not "
                "match its config.json (or the architecture is not supported).")
        if file not in self._handles:
            self._handles[file] = open_safetensors(os.path.join(self.directory, file))
        return self._handles[file].get_slice(stored), start, rows

    def shape(self, name: str) -> tuple[int, ...]:
        sl, _, rows = self._slice(name)
        shape = tuple(sl.get_shape())
        return shape if rows is None else (rows, *shape[1:])

    def read(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor:
        sl, start, count = self._slice(name)
        if count is not None:  # a part of a fused tensor: its rows, shifted
            lo, hi, _ = (rows or slice(None)).indices(count)
            rows = slice(start + lo, start + max(lo, hi))
        if cols is not None:
            return sl[rows or slice(None), cols]
        return sl[rows] if rows is not None else sl[:]


def _own_names_config(directory: str) -> dict:
    """config.json where its model_type stores tensors under names or layouts of its own, else {}."""
    try:
        with open(os.path.join(directory, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) and own_names(config.get("model_type")) else {}


class DictReader:
    """The TensorReader interface over an in-memory {name: tensor} dict."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], label: str = "state dict"):
        self.tensors, self.label = tensors, label

    def where(self, name: str) -> str:
        return self.label

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.tensors:
            raise UserInputError(f"tensor {name} is not in the {self.label}.")
        return tuple(self.tensors[name].shape)

    def read(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor:
        self.shape(name)
        t = self.tensors[name]
        if cols is not None:
            return t[rows or slice(None), cols]
        return t[rows] if rows is not None else t


def check_shape(reader: TensorReader, name: str, expected: tuple[int, ...]) -> None:
    """Raise naming tensor and file when the stored shape differs from the config's."""
    got = reader.shape(name)
    if got != tuple(expected):
        raise UserInputError(
            f"tensor {getattr(reader, 'stored', str)(name)} in {reader.where(name)} has shape {list(got)}, "
            f"but config.json implies "
            f"{list(expected)}; the weights do not belong to this config.")
