"""Falcon-H1's layer: attention and Mamba-2 side by side on the same normed input, their outputs summed into
the one residual add, then the MLP as usual.

    x = input_layernorm(h)
    h = h + attn(x * attention_in_multiplier) * attention_out_multiplier + mamba(x * ssm_in_multiplier) * ssm_out_multiplier
    h = h + mlp(pre_mlp_layernorm(h))

`ParallelHybridAttention` is megatron's SelfAttention (its parameters keep their names, TP split, KV-cache swap
of core_attention and softmax_scale) holding the Mamba-2 mixer (models/mamba2.py) as its child `mamba`, so the
layer spec only changes the self-attention slot. Falcon-H1's other multipliers: the key's (key_multiplier) is
the scores' scale times it (models/builder.py: exact in real arithmetic); the MLP's gate and down multipliers
are hooks on linear_fc1's gate half and on the MLP's output (`install_mlp_multipliers`); the embedding and
logits ones are Granite's (models/multipliers.py). None is folded into a weight: the parameters stay
transformers' and vLLM's, and so do their gradients.

    spec = block_spec(spec, args, layers)   # every layer of a parallel_hybrid model
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.transformer.attention import SelfAttention  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec, build_module  # noqa: E402

from mindspeed_rl.models.mamba2 import mamba2_spec  # noqa: E402
from mindspeed_rl.models.mamba_layout import MambaShape  # noqa: E402
from mindspeed_rl.models.multipliers import _scale_output, scaled  # noqa: E402


class ParallelHybridAttention(SelfAttention):
    """megatron's SelfAttention plus a Mamba-2 mixer (`self.mamba`) reading the same input; returns the sum."""

    def __init__(self, config, submodules, *args, mamba: Optional[ModuleSpec] = None, **kwargs):
        super().__init__(config, submodules, *args, **kwargs)
        if mamba is None:
            raise ValueError("ParallelHybridAttention needs its Mamba-2 mixer's spec (params: mamba).")
        self.mamba = build_module(mamba, config=config, layer_number=self.layer_number)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, *args,
                delta_state=None, **kwargs):
        """(S, B, hidden) -> (attention + Mamba-2 output, bias None); `delta_state`: the mixer's generation
        state (rollout/kv_cache.py), the attention's KV cache is its core_attention's as for any layer."""
        c = self.config
        out, bias = super().forward(scaled(hidden_states, c.attention_in_multiplier), attention_mask, *args, **kwargs)
        if bias is not None:
            raise ValueError("ParallelHybridAttention: an attention output bias is not supported (Falcon-H1 has none).")
        mixed, _ = self.mamba(scaled(hidden_states, c.ssm_in_multiplier), attention_mask, delta_state=delta_state)
        return scaled(out, c.attention_out_multiplier) + scaled(mixed, c.ssm_out_multiplier), None


def block_spec(block: Any, args: dict, layers) -> Any:
    """`block` (a layer spec, or a block spec of the layers `layers`: global indices) with every layer's
    self-attention slot a ParallelHybridAttention around the attention it had."""
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    shape = MambaShape.from_args(args)
    specs = block.layer_specs if isinstance(block, TransformerBlockSubmodules) else [block] * len(layers)
    out = []
    for spec in specs:
        attention = spec.submodules.self_attention
        hybrid = dataclasses.replace(attention, module=ParallelHybridAttention,
                                     params={**(attention.params or {}), "mamba": mamba2_spec(attention, shape)})
        out.append(dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=hybrid)))
    if isinstance(block, TransformerBlockSubmodules):
        return dataclasses.replace(block, layer_specs=out)
    return TransformerBlockSubmodules(layer_specs=out, layer_norm=LayerNormImpl)


def install_mlp_multipliers(model: torch.nn.Module, gate: float, down: float) -> None:
    """Falcon-H1's mlp_multipliers: the gate projection times `gate` before its SiLU (the first half of each TP
    rank's linear_fc1 output, [gate | up]), the MLP's output times `down`."""
    for layer in model.decoder.layers:
        mlp = layer.mlp
        if gate != 1.0:
            mlp.linear_fc1.register_forward_hook(_gate_half(gate))
        if down != 1.0:
            mlp.register_forward_hook(_scale_output(down))  # (Granite's residual_multiplier hook)


def _gate_half(factor: float):
    def hook(module, args, output):
        out, bias = output if isinstance(output, tuple) else (output, None)
        if bias is not None:
            raise ValueError("Falcon-H1's MLP gate multiplier with a linear_fc1 bias is not supported.")
        half = out.shape[-1] // 2
        out = torch.cat([out[..., :half] * factor, out[..., half:]], dim=-1)
        return (out, None) if isinstance(output, tuple) else out
    return hook

