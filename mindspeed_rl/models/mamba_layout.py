"""Mamba-2's sizes and weight layouts (models/mamba2.py), without megatron: the HF bridge
(hf_bridge/mapping.py, hf_bridge/names.py) and the config checks use them before any worker starts.

H heads of head_dim P (d_inner = H x P), G groups of state size N (head h reads group h // (H / G)).
HF (Granite 4.0-H, Mamba2) stores one in_proj (2 H P + 2 G N + H, hidden) whose rows are
[z (H P) | x (H P) | B (G N) | C (G N) | dt (H)] and one conv1d over the channels [x | B | C]. The bridge
names the parts on their own (hf_bridge/names.py serves and writes them as that one tensor):
in_proj_z / in_proj_x / in_proj_bc / in_proj_dt and conv1d_x / conv1d_bc (weight and bias).

Megatron's mixer splits them over TP by heads: `in_proj_zxdt` is column-parallel and grouped by head,
per head h [z_h (P) | x_h (P) | dt_h (1)], so a TP shard of whole heads is a contiguous block and the
shards concatenated in rank order are the whole tensor; `in_proj_bc` (B and C of every group) and
`conv1d_bc` are whole on every rank (a group may feed heads on several ranks); `conv1d_x`, A_log, D,
dt_bias and the gated norm's weight (d_inner) are split by heads; `out_proj` is row-parallel.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch

from mindspeed_rl.models.delta_layout import _grouped, _ungrouped

KEYS = ("mamba_num_heads", "mamba_head_dim", "mamba_num_groups", "mamba_state_dim")


def has_mamba(args: Mapping[str, Any]) -> bool:
    """Whether Megatron-named model args have Mamba-2 mixers: layers of their own (mamba_layers: Granite 4.0-H,
    Nemotron-H) or beside attention in every layer (parallel_hybrid: Falcon-H1)."""
    return any(args.get("mamba_layers") or ()) or bool(args.get("parallel_hybrid"))


def mamba_step_limit(hf: Mapping[str, Any]) -> None:
    """Refuse a config.json time_step_limit other than (0, inf): the Mamba-2 step is used unclamped, as the Granite
    4.0-H and Nemotron-H releases' default says (transformers 5 writes its infinity as {"__float__": "Infinity"})."""
    limit = [float(v["__float__"]) if isinstance(v, Mapping) else float(v) for v in hf.get("time_step_limit") or ()]
    if limit and limit != [0.0, float("inf")]:
        raise ValueError(f"config.json time_step_limit {limit} is not supported; the Mamba-2 step is used "
                         f"unclamped, as the releases' default (0.0, inf) says.")


@dataclasses.dataclass(frozen=True)
class MambaShape:
    heads: int
    head_dim: int
    groups: int
    state: int
    conv_kernel: int = 4
    chunk: int = 256
    conv_bias: bool = True
    norm_eps: float = 1e-6
    norm: bool = True  # the gated RMSNorm before out_proj (Falcon-H1's mamba_rms_norm may turn it off: y x SiLU(z))
    # z, x, B, C and dt times these after in_proj (Falcon-H1's ssm_multipliers, its muP vector); () = all 1
    in_multipliers: tuple = ()

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> "MambaShape":
        """From the Megatron-named model args (Megatron-LM's mamba_* names; hf_granite_config.granite_hybrid_args)."""
        multipliers = tuple(float(m) for m in (args.get("mamba_in_multipliers") or ()))
        return cls(int(args["mamba_num_heads"]), int(args["mamba_head_dim"]), int(args.get("mamba_num_groups") or 1),
                   int(args["mamba_state_dim"]), int(args.get("mamba_conv_kernel") or 4),
                   int(args.get("mamba_chunk_size") or 256), args.get("mamba_conv_bias", True) is not False,
                   float(args.get("norm_epsilon", 1e-6)), args.get("mamba_norm", True) is not False,
                   () if all(m == 1.0 for m in multipliers) else multipliers)

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.groups

    def problem(self, tp: int) -> Optional[str]:
        """One sentence on why this shape cannot run at TP `tp`, or None."""
        if self.in_multipliers and (len(self.in_multipliers) != 5 or not all(
                isinstance(m, (int, float)) and not isinstance(m, bool) for m in self.in_multipliers)):
            return (f"mamba_in_multipliers must list 5 numbers (z, x, B, C, dt: Falcon-H1's ssm_multipliers); it is "
                    f"{list(self.in_multipliers)}.")
        if self.heads % self.groups:
            return (f"mamba_num_heads {self.heads} is not a multiple of mamba_num_groups {self.groups}: each group of "
                    f"B / C feeds the same number of heads.")
        if self.heads % tp:
            return (f"tensor_model_parallel_size {tp} does not divide mamba_num_heads {self.heads} (the Mamba-2 layers "
                    f"are split over TP by heads): use a TP size that divides it.")
        return None

    def head_widths(self) -> list[int]:
        """Rows per head of in_proj_zxdt's parts: z, x, dt."""
        return [self.head_dim, self.head_dim, 1]

    def stored_in_proj_widths(self) -> list[int]:
        """HF in_proj's parts, one after another: z, x, B, C, dt."""
        return [self.inner, self.inner, self.groups * self.state, self.groups * self.state, self.heads]

    def stored_conv_widths(self) -> list[int]:
        """HF conv1d's channels: x, B, C."""
        return [self.inner, self.groups * self.state, self.groups * self.state]


def zxdt_from_parts(z: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, shape: MambaShape,
                    heads: Optional[int] = None) -> torch.Tensor:
    """megatron's in_proj_zxdt weight from HF's z / x / dt rows (all heads, or the `heads` these rows hold)."""
    return _grouped([z, x, dt], shape.heads if heads is None else heads)


def zxdt_to_parts(weight: torch.Tensor, shape: MambaShape) -> tuple:
    """(z, x, dt) rows from megatron's whole in_proj_zxdt weight."""
    return tuple(_ungrouped(weight, shape.head_widths(), shape.heads))
