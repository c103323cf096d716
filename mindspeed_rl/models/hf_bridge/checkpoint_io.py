"""Read tensors (or row/column ranges of them) from a Hugging Face safetensors directory.

Both layouts are supported: a single `model.safetensors`, or shards listed by
`model.safetensors.index.json`. Tensors are looked up by the bridge's canonical HF names; an
architecture that stores some under other names or fused (Mixtral's names, Phi-3's q/k/v and
gate/up, by config.json's model_type) is translated here (hf_bridge/names.py), and messages name
the stored tensor. Files are opened lazily with `safetensors.safe_open` and only the
requested slice is read, so a TP rank reads only its shard of each tensor. Quantized weights are
read dequantized: gpt-oss's MXFP4 experts (names.stacked_expert) and block-wise FP8 (`_fp8`: DeepSeek-V3's
release); their scales are no tensors of their own (`_aux`), and models/hf_quantization.check_quantization
refuses other formats. Every failure is one
sentence naming the tensor and file: a missing shard, a missing tensor, a shape mismatch.

`DictReader` serves the same interface from an in-memory state dict (conversions and tests).
"""

from __future__ import annotations

import json
import os
import re
from typing import Mapping, Optional, Protocol

import torch
from safetensors import safe_open

from mindspeed_rl.models.hf_bridge.names import (canonical_name, names_type, dequantize_mxfp4, fused_name, fused_parts,
                                                 grouped_name, grouped_parts, leading_one, own_names,
                                                 stacked_expert, stacked_layout, stacked_module_layout,
                                                 stacked_parts, stored_name)
from mindspeed_rl.utils.errors import UserInputError

INDEX_FILE = "model.safetensors.index.json"
FP8_BLOCK = 128  # block-wise FP8 checkpoints' weight_block_size (DeepSeek-V3, Kimi K2, Qwen3-FP8)
_AUX = re.compile(r"(\.weight_scale_inv|_proj_scales)$")  # quantization scales (SafetensorsReader)
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
        # quantization scales are read with their weights, never as tensors of their own: gpt-oss's MXFP4
        # `<proj>_scales` (names.stacked_expert), block-FP8 `<weight>_scale_inv` (DeepSeek-V3 / R1, Kimi K2,
        # Qwen3-FP8: _fp8)
        self._aux = {n: f for n, f in self.weight_map.items() if _AUX.search(n)}
        self.weight_map = {n: f for n, f in self.weight_map.items() if n not in self._aux}
        config = _own_names_config(directory)
        self.model_type = names_type(config)
        self._parts: dict[str, tuple[str, int, int]] = {}  # canonical -> (fused stored name, first row, rows)
        # canonical -> (grouped stored name, its rows there, the rows config.json implies the stored tensor has)
        self._grouped: dict[str, tuple[str, torch.Tensor, int]] = {}
        self._stored: dict[str, str] = {}  # canonical -> the name the checkpoint stores it under
        # canonical expert tensor -> (stacked stored name, expert, part) (gpt-oss: names.stacked_parts)
        self._stacked: dict[str, tuple[str, int, str]] = {}
        self._decoded: tuple = (None, None)  # ((stored name, expert), its dequantized MXFP4 slice)
        self._module_layout = False  # stacked experts as transformers' modules hold them (_stacked_in_module_layout)
        if config:  # canonical name -> file; the stored name is stored_name(canonical) or a fused tensor
            canonical = {}
            text = config.get("text_config") or config  # an image-text model's experts are its text model's
            experts = int(text.get("num_local_experts") or text.get("num_experts") or 0)
            for name, file in self.weight_map.items():
                stacked = stacked_parts(canonical_name(name, self.model_type, config), self.model_type, experts)
                for part, expert, what in stacked or ():
                    canonical[part] = file
                    self._stacked[part] = (name, expert, what)
                if stacked is not None:
                    continue
                grouped = grouped_parts(name, config)
                for part, rows in grouped or ():  # Qwen3-Next's per-key-head in_proj_qkvz / in_proj_ba
                    canonical[part] = file
                    self._grouped[part] = (name, rows, sum(len(r) for _, r in grouped))
                if grouped is not None:
                    continue
                parts = fused_parts(name, config)
                if parts is None:
                    canonical[canonical_name(name, self.model_type, config)] = file
                    self._stored[canonical_name(name, self.model_type, config)] = name
                for part, start, rows in parts or ():
                    canonical[part] = file
                    self._parts[part] = (name, start, rows)
            self.weight_map = canonical
            self._module_layout = (stacked_module_layout(self.model_type) or self._stacked_in_module_layout(text)
                                   if self._stacked else False)

    def _slice_of(self, file: str, stored: str):
        """The safetensors slice of tensor `stored` in `file` (the file opened once, lazily)."""
        if file not in self._handles:
            self._handles[file] = open_safetensors(os.path.join(self.directory, file))
        return self._handles[file].get_slice(stored)

    def _stacked_in_module_layout(self, text: dict) -> bool:
        """Whether the stacked experts are stored as transformers 5's modules hold them ((E, 2f, h) gate_up,
        (E, h, f) down: its save_pretrained of Qwen3-VL-MoE) rather than as the releases ((E, h, 2f),
        (E, f, h): x @ W), told by the shapes (down_proj's where gate_up is square)."""
        h, f = int(text["hidden_size"]), int(text.get("moe_intermediate_size") or text["intermediate_size"])
        shapes = {}
        for canonical, (name, _, part) in self._stacked.items():
            if part in ("gate", "down") and part not in shapes and not name.endswith("_blocks"):
                shapes[part] = tuple(self._slice_of(self.weight_map[canonical], name).get_shape())[1:]
        if "gate" in shapes and 2 * f != h:
            return shapes["gate"] == (2 * f, h)
        return shapes.get("down") == (h, f) and h != f

    def where(self, name: str) -> str:
        return os.path.join(self.directory, self.weight_map.get(name, "?"))

    def stored(self, name: str) -> str:
        """Where the checkpoint stores the canonical tensor `name` (for messages): its own name, or
        the rows of a fused tensor."""
        if name in self._stacked:
            stacked, expert, part = self._stacked[name]
            return f"{stacked}[{expert}] (its {part.replace('_bias', ' bias')})"
        if name in self._parts:
            fused, start, rows = self._parts[name]
            return f"{fused} (rows {start}-{start + rows - 1}, its {name.rsplit('.', 2)[-2]})"
        if name in self._grouped:
            return f"{self._grouped[name][0]} (its {name.rsplit('.', 2)[-2]} rows of every head group)"
        return (self._stored.get(name) or fused_name(name, self.model_type) or grouped_name(name, self.model_type)
                or stored_name(name, self.model_type))

    def _slice(self, name: str):
        """(safetensors slice, first row, rows or None for the whole tensor) of canonical `name`."""
        file = self.weight_map.get(name)
        stored, start, rows = self._parts.get(name, (self.stored(name), 0, None))
        if name in self._grouped:
            stored = self._grouped[name][0]
        if file is None:
            raise UserInputError(
                f"tensor {stored} is not in the checkpoint {self.directory}; the checkpoint does not "
                "match its config.json (or the architecture is not supported).")
        return self._slice_of(file, stored), start, rows

    def _expert(self, name: str) -> torch.Tensor:
        """The canonical tensor of one expert from its stacked tensor (names.stacked_expert); an MXFP4
        weight is dequantized once per (tensor, expert) and kept for its other part."""
        stored, expert, part = self._stacked[name]
        layout, module = stacked_layout(self.model_type), self._module_layout
        if not stored.endswith("_blocks"):
            return stacked_expert(self._slice_of(self.weight_map[name], stored)[expert], part, layout, module)
        key = (stored, expert)
        if self._decoded[0] != key:
            blocks = self._slice_of(self.weight_map[name], stored)[expert]
            scales = self._aux_slice(stored[: -len("_blocks")] + "_scales", stored)[expert]
            self._decoded = (key, dequantize_mxfp4(blocks, scales))
        return stacked_expert(self._decoded[1], part, layout, module)

    def quantized(self, name: str) -> bool:
        """Whether the checkpoint stores canonical `name` quantized (MXFP4 or block FP8; read dequantized)."""
        if name in self._stacked:
            return self._stacked[name][0].endswith("_blocks")
        return self._slice(name)[0].get_dtype() == "F8_E4M3"

    def _aux_slice(self, scales: str, of: str):
        """The safetensors slice of the quantization scales `scales` of the stored tensor `of` (one
        sentence when the checkpoint lacks them)."""
        file = self._aux.get(scales)
        if file is None:
            raise UserInputError(f"tensor {scales} (the quantization scales of {of}) is not in the checkpoint "
                                 f"{self.directory}; download the complete checkpoint.")
        return self._slice_of(file, scales)

    def _fp8(self, sl, stored: str, rows: slice, cols: Optional[slice]) -> torch.Tensor:
        """Rows `rows` (absolute) and columns `cols` of a block-FP8 weight (float8_e4m3fn), dequantized to
        fp32 with its `_scale_inv` blocks (one scale per FP8_BLOCK x FP8_BLOCK weights; DeepSeek's
        weight_dequant: fp8 x scale)."""
        out_rows, in_cols = sl.get_shape()
        rows = slice(*rows.indices(out_rows)[:2])
        cols = slice(*(cols or slice(None)).indices(in_cols)[:2])
        scale = self._aux_slice(stored + "_scale_inv", stored)[:].float()
        if scale.shape != (-(-out_rows // FP8_BLOCK), -(-in_cols // FP8_BLOCK)):
            raise UserInputError(f"tensor {stored}_scale_inv in {self.directory} has shape {list(scale.shape)}, not one "
                                 f"scale per {FP8_BLOCK} x {FP8_BLOCK} block of {stored} {[out_rows, in_cols]}; only "
                                 f"block-wise FP8 (weight_block_size [{FP8_BLOCK}, {FP8_BLOCK}]) is read.")
        r = torch.arange(rows.start, rows.stop) // FP8_BLOCK
        c = torch.arange(cols.start, cols.stop) // FP8_BLOCK
        return sl[rows, cols].float() * scale[r][:, c]

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._stacked:  # from the stacked tensor's header (names.stacked_expert's layouts)
            stored, _, part = self._stacked[name]
            shape = tuple(self._slice_of(self.weight_map[name], stored).get_shape())[1:]
            if stored.endswith("_blocks"):  # (rows, cols / 32, 16) -> the dequantized (cols, rows)
                shape = (shape[1] * shape[2] * 2, shape[0])
            if part.endswith("_bias"):
                return (shape[0] // 2,) if part != "down_bias" else shape
            if self._module_layout:  # (2f, h) / (h, f) already
                return (shape[0] // 2, shape[1]) if part in ("gate", "up") else shape
            return (shape[1] // 2, shape[0]) if part in ("gate", "up") else (shape[1], shape[0])
        sl, _, rows = self._slice(name)
        shape = tuple(sl.get_shape())
        if name in self._grouped:
            stored, rows, total = self._grouped[name]
            if shape[0] != total:
                keys = ("num_attention_heads / hidden_size" if self.model_type == "gpt_neox"
                        else "linear_num_* / linear_*_head_dim")
                raise UserInputError(f"tensor {stored} in {self.where(name)} has {shape[0]} rows, but config.json's "
                                     f"{keys} imply {total}; the weights do not belong to this config.")
            return (len(rows), *shape[1:])
        if leading_one(name, self.model_type) and shape[:1] == (1,):  # ERNIE 4.5 MoE's (1, E) expert bias
            return shape[1:]
        return shape if rows is None else (rows, *shape[1:])

    def read(self, name: str, rows: Optional[slice] = None, cols: Optional[slice] = None) -> torch.Tensor:
        if name in self._stacked:
            t = self._expert(name)
            if cols is not None:
                return t[rows or slice(None), cols]
            return t[rows] if rows is not None else t
        sl, start, count = self._slice(name)
        if name in self._grouped:  # the part's rows of a grouped tensor: the span holding them, then picked
            self.shape(name)  # the stored rows checked against config.json
            stored, index, _ = self._grouped[name]
            index = index[rows] if rows is not None else index
            if not len(index):
                return self._rows(sl, stored, slice(0, 0), cols)
            lo, hi = int(index.min()), int(index.max()) + 1
            return self._rows(sl, stored, slice(lo, hi), cols)[index - lo]
        if leading_one(name, self.model_type) and tuple(sl.get_shape())[:1] == (1,):  # stored (1, n): read as (n,)
            t = sl[:][0]
            return t[rows] if rows is not None else t
        if count is not None:  # a part of a fused tensor: its rows, shifted
            lo, hi, _ = (rows or slice(None)).indices(count)
            rows = slice(start + lo, start + max(lo, hi))
        return self._rows(sl, self._parts[name][0] if name in self._parts else self.stored(name), rows, cols)

    def _rows(self, sl, stored: str, rows: Optional[slice], cols: Optional[slice]) -> torch.Tensor:
        """Rows `rows` (absolute; None: all) and columns `cols` of the stored tensor `stored` (its slice `sl`)."""
        if sl.get_dtype() == "F8_E4M3":  # block-wise FP8 (DeepSeek-V3's release): dequantized here
            return self._fp8(sl, stored, rows or slice(None), cols)
        if cols is not None:
            return sl[rows or slice(None), cols]
        if rows is None:  # the whole tensor; `...` also reads a 0-d one (Apertus's xIELU beta / eps)
            return sl[...]
        return sl[rows]


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
