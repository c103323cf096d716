"""Short convolution: the token mixer of LFM2's conv layers (Liquid AI's LFM2-350M to 2.6B: most of their
layers; the others attend), as a megatron module in the self-attention slot of a TransformerLayer, split over
TP by channels.

Per token x (hidden H) the mixer projects B, C and x (H each); B x goes through a causal depthwise conv1d
(kernel short_conv_kernel, no activation), is multiplied by C and projected back by out_proj
(transformers' Lfm2ShortConv). Every channel is independent up to out_proj, so rank r holds channels
r*H/TP .. (r+1)*H/TP - 1 of B, C, x and the conv, and nothing is communicated inside the mixer:
`in_proj_bcx` is column-parallel (interleaved per channel: models/short_conv_layout.py), `conv_out_proj`
row-parallel. With short_conv_bias, in_proj, the conv and out_proj have biases.

Padding: the training forward passes megatron's (B, 1, S, S) mask. Padded tokens' conv input (B x) is zeroed,
so with left padding the real tokens see a zero history: the same as the unpadded sequence, which is what
vLLM computes. transformers zeroes the layer input instead, the same thing when in_proj has no bias (the
releases'); with a bias its left-padded rows would see in_proj's bias through the conv.

Incremental use (generation): `forward(..., delta_state=DeltaState)` (Gated DeltaNet's state object and call,
so the native engine's cache treats all three mixers alike; no recurrent state) starts from the state's conv
history, the last short_conv_kernel - 1 conv inputs, and leaves the new one in it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec, build_module  # noqa: E402

from mindspeed_rl.models.gated_delta_net import DeltaState, causal_conv, token_keep  # noqa: E402
from mindspeed_rl.models.short_conv_layout import is_conv_layer  # noqa: E402
from mindspeed_rl.models.spec_tree import with_mixers  # noqa: E402


@dataclasses.dataclass
class ShortConvSubmodules:
    in_proj: Any = ColumnParallelLinear
    out_proj: Any = RowParallelLinear


class ShortConv(MegatronModule):
    def __init__(self, config, submodules: Optional[ShortConvSubmodules] = None, layer_number: int = 1,
                 kernel: int = 3, bias: bool = False, **kwargs):
        super().__init__(config=config)
        submodules = submodules or ShortConvSubmodules()
        self.tp = tp = parallel_state.get_tensor_model_parallel_world_size()
        hidden = config.hidden_size
        if hidden % tp:
            raise ValueError(f"tensor_model_parallel_size {tp} does not divide hidden_size {hidden} (LFM2's conv "
                             f"layers are split over TP by channels): use a TP size that divides it.")
        self.layer_number, self.kernel = layer_number, kernel
        self.in_proj_bcx = build_module(submodules.in_proj, hidden, 3 * hidden, config=config,
                                        init_method=config.init_method, gather_output=False, bias=bias,
                                        skip_bias_add=False, is_expert=False)
        local = hidden // tp
        self.conv = torch.nn.Conv1d(local, local, kernel, groups=local, bias=bias,
                                    dtype=config.params_dtype)  # its parameters only: causal_conv pads itself
        for p in self.conv.parameters():
            set_tensor_model_parallel_attributes(p, True, 0, 1)
        self.conv_out_proj = build_module(submodules.out_proj, hidden, hidden, config=config,
                                          init_method=config.output_layer_init_method, bias=bias,
                                          input_is_parallel=True, skip_bias_add=True, is_expert=False)

    def delta_state(self, batch: int) -> DeltaState:
        """A zero generation state for `batch` rows (no history), on this mixer's device: the conv history
        (batch, local channels, kernel - 1) in the weights' dtype."""
        weight = self.conv.weight
        return DeltaState(weight.new_zeros(batch, weight.shape[0], self.kernel - 1))

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                delta_state: Optional[DeltaState] = None, **kwargs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """hidden_states (S, B, hidden) [S / TP under sequence parallelism] -> (output, out_proj's bias or None)."""
        bcx, _ = self.in_proj_bcx(hidden_states)  # (S, B, 3 x this rank's channels)
        bcx = bcx.transpose(0, 1)  # (B, S, .)
        batch, seq = bcx.shape[:2]
        b, c, x = bcx.reshape(batch, seq, -1, 3).unbind(-1)
        bx = b * x
        keep = token_keep(attention_mask, batch, seq)
        if keep is not None:
            bx = bx * keep.unsqueeze(-1).to(bx.dtype)
        y = causal_conv(bx.transpose(1, 2), self.conv.weight, self.conv.bias, delta_state).transpose(1, 2)
        y = (c * y).transpose(0, 1).contiguous()  # (S, B, local channels)
        return self.conv_out_proj(y)


def short_conv_spec(attention_spec: ModuleSpec, kernel: int, bias: bool) -> ModuleSpec:
    """The mixer's spec for a layer's self_attention slot (attention_spec: the spec it replaces; its linear
    classes are reused, so a platform's linear layers apply here too)."""
    sub = attention_spec.submodules
    linears = ShortConvSubmodules(in_proj=getattr(sub, "linear_qkv", ColumnParallelLinear),
                                  out_proj=getattr(sub, "linear_proj", RowParallelLinear))
    return ModuleSpec(module=ShortConv, submodules=linears, params={"kernel": kernel, "bias": bias})


def hybrid_block_spec(block: Any, args: dict, layers) -> Any:
    """`block` (a layer spec, or a block spec of the layers `layers`: global indices) with the short convolution
    in the self-attention slot of the layers short_conv_layers marks."""
    kernel, bias = int(args.get("short_conv_kernel") or 3), bool(args.get("short_conv_bias"))
    return with_mixers(block, layers, lambda attention, layer: short_conv_spec(attention, kernel, bias)
                       if is_conv_layer(args, layer) else None)
