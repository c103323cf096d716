"""Qwen3.5's layers that megatron-core's local layer spec does not have (models/builder.py installs
them from the keys hf_config.qwen3_5_args sets):

- linear_attention_layers (one 0 / 1 per layer): the layers marked 1 mix tokens with Gated DeltaNet
  (models/gated_delta_net.py) in the self-attention slot; Qwen3.5 marks three of every four;
- attention_output_gate: the other layers' attention output is multiplied, per head and feature, by
  sigmoid(gate) before o_proj, the gate a second query-sized projection of the layer input.
  HF stores it inside q_proj, each head's query rows followed by its gate rows; megatron's linear_qkv
  here holds per query group [query heads | their gate heads | k | v] (megatron-core 0.16's layout for
  its attention_output_gate), so a TP shard of whole groups holds its heads' gates
  (hf_bridge/mapping.py, kind "qkv" with Dims.attention_gate).

The gate is taken from linear_qkv's output while the query, key and value are split off
(get_query_key_value_tensors) and applied by a pre-hook on linear_proj, so megatron's forward runs
unchanged on 0.12 and 0.16 (whose own output gate stays off), in every path that calls the attention's
forward (training, the native engine's cached decode).

AFMoE (Arcee's Trinity models) gates the same way with the gate's projection its own linear
(attention_gate_proj: HF self_attn.gate_proj, (heads x head_dim, hidden)): `ProjGatedSelfAttention`'s
linear_gate, column-parallel like linear_qkv (a TP shard holds its heads' gate rows, head-major as core
attention's output is), applied by the same pre-hook.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.transformer.attention import SelfAttention  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec, build_module  # noqa: E402
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules  # noqa: E402

from mindspeed_rl.models.gated_delta_net import DeltaNetShape, gated_delta_net_spec  # noqa: E402


class OutputGatedSelfAttention(SelfAttention):
    """megatron's SelfAttention with Qwen3.5's (Qwen3-Next's) sigmoid output gate."""

    def __init__(self, config, submodules, *args, **kwargs):
        super().__init__(config, submodules, *args, **kwargs)
        # linear_qkv again, with the gate's rows: per group [q heads | gate heads | k | v]
        self.linear_qkv = build_module(
            submodules.linear_qkv, config.hidden_size, 2 * self.query_projection_size + 2 * self.kv_projection_size,
            config=config, init_method=config.init_method, gather_output=False,
            bias=config.add_bias_linear or config.add_qkv_bias, skip_bias_add=False, is_expert=False,
            tp_comm_buffer_name="qkv")
        self._gate: Optional[torch.Tensor] = None
        self.linear_proj.register_forward_pre_hook(self._apply_gate)

    def _apply_gate(self, module, args):
        gate, self._gate = self._gate, None
        if gate is None:
            raise RuntimeError("the attention output gate was not computed before linear_proj "
                               "(OutputGatedSelfAttention.get_query_key_value_tensors did not run)")
        (x, *rest) = args
        return (x * torch.sigmoid(gate).reshape(x.shape), *rest)

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, *args, **kwargs):
        mixed, _ = self.linear_qkv(hidden_states)  # (s, b, groups * (2q + 2) * hn) of this rank
        groups, hn = self.num_query_groups_per_partition, self.hidden_size_per_attention_head
        per_group = self.num_attention_heads_per_partition // groups
        mixed = mixed.view(*mixed.shape[:-1], groups, (2 * per_group + 2) * hn)
        query, gate, key, value = torch.split(mixed, [per_group * hn, per_group * hn, hn, hn], dim=3)
        query = query.reshape(*query.shape[:2], -1, hn)
        self._gate = gate.reshape(*gate.shape[:2], -1)  # (s, b, heads * hn): core attention's output layout
        if self.q_layernorm is not None:
            query = self.q_layernorm(query)
        if self.k_layernorm is not None:
            key = self.k_layernorm(key)
        return query, key, value


class ProjGatedSelfAttention(OutputGatedSelfAttention):
    """megatron's SelfAttention with AFMoE's sigmoid output gate: sigmoid(linear_gate(x)) per head and feature."""

    def __init__(self, config, submodules, *args, **kwargs):
        SelfAttention.__init__(self, config, submodules, *args, **kwargs)  # (linear_qkv as megatron builds it)
        self.linear_gate = build_module(
            submodules.linear_qkv, config.hidden_size, self.query_projection_size, config=config,
            init_method=config.init_method, gather_output=False, bias=False, skip_bias_add=False, is_expert=False,
            tp_comm_buffer_name="qkv")
        self._gate: Optional[torch.Tensor] = None
        self.linear_proj.register_forward_pre_hook(self._apply_gate)

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, *args, **kwargs):
        gate, _ = self.linear_gate(hidden_states)  # (s, b, this rank's heads * hn): core attention's output layout
        self._gate = gate
        return SelfAttention.get_query_key_value_tensors(self, hidden_states, key_value_states, *args, **kwargs)


def gated_attention_spec(layer_spec: ModuleSpec, own_projection: bool = False) -> ModuleSpec:
    """A layer spec whose self-attention is OutputGatedSelfAttention (ProjGatedSelfAttention with own_projection)."""
    cls = ProjGatedSelfAttention if own_projection else OutputGatedSelfAttention
    attention = dataclasses.replace(layer_spec.submodules.self_attention, module=cls)
    return dataclasses.replace(layer_spec, submodules=dataclasses.replace(layer_spec.submodules,
                                                                          self_attention=attention))


def linear_attention_spec(layer_spec: ModuleSpec, shape: DeltaNetShape) -> ModuleSpec:
    """A layer spec whose token mixer is Gated DeltaNet (in the self-attention slot)."""
    mixer = gated_delta_net_spec(layer_spec.submodules.self_attention, shape)
    return dataclasses.replace(layer_spec, submodules=dataclasses.replace(layer_spec.submodules,
                                                                          self_attention=mixer))


def hybrid_block_spec(block: Any, args: dict, layers: Sequence[int]) -> Any:
    """`block` (a layer spec, or a block spec of the layers `layers`: global indices) with each layer's
    mixer as args say: Gated DeltaNet where linear_attention_layers marks it, else the attention,
    output-gated with attention_output_gate."""
    marks = args.get("linear_attention_layers") or []
    gated, own = bool(args.get("attention_output_gate")), bool(args.get("attention_gate_proj"))
    shape = DeltaNetShape.from_args(args) if any(marks) else None
    specs = block.layer_specs if isinstance(block, TransformerBlockSubmodules) else [block] * len(layers)
    out = []
    for spec, layer in zip(specs, layers):
        if layer < len(marks) and marks[layer]:
            out.append(linear_attention_spec(spec, shape))
        else:
            out.append(gated_attention_spec(spec, own) if gated else spec)
    if isinstance(block, TransformerBlockSubmodules):
        return dataclasses.replace(block, layer_specs=out)
    from megatron.core.transformer.transformer_block import LayerNormImpl

    return TransformerBlockSubmodules(layer_specs=out, layer_norm=LayerNormImpl)
