"""Gated DeltaNet's sizes and weight layouts (models/gated_delta_net.py), without megatron: the HF bridge
(hf_bridge/mapping.py) and the config checks use them before any worker starts.

G key heads of key_head_dim dk, G x r value heads of value_head_dim dv (value head i reads key head i // r).
HF (Qwen3.5) stores in_proj_qkv (q: G*dk rows | k: G*dk | v: G*r*dv), in_proj_z (G*r*dv), in_proj_b and
in_proj_a (G*r each). Megatron's in_proj here is grouped by key head, like its linear_qkv by query group:
per key head g, [q_g (dk) | k_g (dk) | v of g's value heads (r*dv) | z of them (r*dv) | b (r) | a (r)].
A TP shard of whole key heads is then a contiguous block, and the shards concatenated in rank order are
the whole tensor at any TP (what hf_bridge/sharding.merge_tp relies on). The conv1d's channels are
grouped the same way, per key head [q_g | k_g | v of g's value heads]; A_log and dt_bias are per value
head, whose order needs no regrouping.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch


@dataclasses.dataclass(frozen=True)
class DeltaNetShape:
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    norm_eps: float = 1e-6

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> "DeltaNetShape":
        """From the Megatron-named model args (hf_config.qwen3_5_args keeps HF's linear_* names)."""
        return cls(int(args["linear_num_key_heads"]), int(args["linear_num_value_heads"]),
                   int(args["linear_key_head_dim"]), int(args["linear_value_head_dim"]),
                   int(args.get("linear_conv_kernel_dim") or 4), float(args.get("norm_epsilon", 1e-6)))

    @property
    def ratio(self) -> int:
        return self.value_heads // self.key_heads

    def problem(self, tp: int) -> Optional[str]:
        """One sentence on why this shape cannot run at TP `tp`, or None."""
        if self.value_heads % self.key_heads:
            return (f"linear_num_value_heads {self.value_heads} is not a multiple of linear_num_key_heads "
                    f"{self.key_heads}: each value head reads one key head.")
        if self.key_heads % tp:
            return (f"tensor_model_parallel_size {tp} does not divide linear_num_key_heads {self.key_heads} "
                    f"(the linear-attention layers are split over TP by key heads): use a TP size that divides it.")
        return None

    def group_widths(self) -> list[int]:
        """Rows per key head of in_proj's parts: q, k, v, z, b, a."""
        r = self.ratio
        return [self.key_head_dim, self.key_head_dim, r * self.value_head_dim, r * self.value_head_dim, r, r]

    def conv_group_width(self) -> int:
        return sum(self.group_widths()[:3])


def _grouped(parts: list, groups: int) -> torch.Tensor:
    """Parts (rows = groups x their width each) -> per group the parts' rows one after another."""
    tail = parts[0].shape[1:]
    return torch.cat([p.reshape(groups, -1, *tail) for p in parts], dim=1).reshape(-1, *tail)


def _ungrouped(t: torch.Tensor, widths: list, groups: int) -> list:
    tail = t.shape[1:]
    return [p.reshape(-1, *tail) for p in t.reshape(groups, -1, *tail).split(widths, dim=1)]


def in_proj_from_parts(qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                       shape: DeltaNetShape, groups: Optional[int] = None) -> torch.Tensor:
    """megatron's in_proj weight from HF's in_proj_qkv / _z / _b / _a (all key heads, or the `groups`
    key heads these rows hold: a TP shard's)."""
    groups = shape.key_heads if groups is None else groups
    dk, dv = shape.key_head_dim, shape.ratio * shape.value_head_dim
    q, k, v = qkv.split([groups * dk, groups * dk, groups * dv])
    return _grouped([q, k, v, z, b, a], groups)


def in_proj_to_parts(weight: torch.Tensor, shape: DeltaNetShape) -> tuple:
    """(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) from megatron's whole in_proj weight."""
    q, k, v, z, b, a = _ungrouped(weight, shape.group_widths(), shape.key_heads)
    return torch.cat([q, k, v]), z, b, a


def conv_from_hf(weight: torch.Tensor, shape: DeltaNetShape, groups: Optional[int] = None) -> torch.Tensor:
    """The conv1d weight grouped by key head from HF's (channels q | k | v)."""
    groups = shape.key_heads if groups is None else groups
    dk, dv = shape.key_head_dim, shape.ratio * shape.value_head_dim
    return _grouped(list(weight.split([groups * dk, groups * dk, groups * dv])), groups)


def conv_to_hf(weight: torch.Tensor, shape: DeltaNetShape) -> torch.Tensor:
    return torch.cat(_ungrouped(weight, shape.group_widths()[:3], shape.key_heads))
