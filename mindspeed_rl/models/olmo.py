"""OLMo's layer pieces that megatron-core's local layer spec does not have (models/builder.py
installs them from the keys hf_config.model_config_from_hf sets):

- layernorm_affine: false — OLMo 1 (olmo) normalises with LayerNorms that have neither weight nor bias,
  computed in fp32 and cast back (transformers' OlmoLayerNorm): `NonParametricLayerNorm`, swapped into the
  spec for every norm (the final one too), so those layers have no norm parameters at all; with normalization
  RMSNorm the same for nanochat's weightless RMSNorms (their q / k norms included: models/nanochat.py);
- clip_qkv — OLMo 1 (OLMo-7B-0424 / 0724: 8) clamps the query, key and value projections to +-clip_qkv
  before anything else uses them (OLMoE clamps after its q / k norms, and vLLM's OLMoE not at all: refused): a forward hook on each layer's linear_qkv
  (`install_clip_qkv`); the rollout's decode steps clamp themselves (rollout/kv_cache.py, `clipped_qkv`);
- pre_norm: false with post_norm: true — OLMo 2 normalises the attention and MLP outputs only, before
  each residual add (`post_attention_layernorm`, `post_feedforward_layernorm`: models/gemma.py's post
  norms), and feeds the residual stream to attention and MLP un-normalised: the layer spec's
  input_layernorm and pre_mlp_layernorm become megatron's IdentityOp (`without_pre_norms`);
- qk_layernorm_across_heads: OLMo 2's q_norm / k_norm normalise each token's whole query (all heads x
  head_dim) and whole key, not each head as Qwen3's do. Megatron calls its q_layernorm on the
  (s, b, heads, head_dim) query of this TP rank's heads, so `AcrossHeadsRMSNorm` sums the squares
  over its heads, all-reduces that sum over the TP group (an autograd all-reduce: the gradient of
  every rank's loss reaches the other ranks' shares) and scales by its own slice of the weight.
  The weight is split over TP like the heads (mapping kind "column"), marked tensor-parallel so the
  gradient norm counts each slice once. megatron's finalize_model_grads sums over TP the gradient of
  every parameter named q_layernorm / k_layernorm (Qwen3's per-head norms are whole on every rank);
  for these slices that would add the other ranks' slices' gradients, so `kept_from_tp_sum` hides them
  from that rule (models/train_step.finalize_grads).

RMSNorm here is OLMo 2's: x / sqrt(mean(x^2) + eps) in fp32, times the weight, cast back.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterable, Iterator

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes  # noqa: E402
from megatron.core.transformer.identity_op import IdentityOp  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules  # noqa: E402


class NonParametricLayerNorm(torch.nn.Module):
    """A norm without weight or bias in fp32, cast back, built with megatron's norm signature: OLMo 1's LayerNorm
    (normalization LayerNorm), nanochat's RMSNorm x * rsqrt(mean(x^2) + eps) (normalization RMSNorm; transformers'
    NanoChatRMSNorm, in the layers, the final norm and per head as q / k norms)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        super().__init__()
        if config.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"layernorm_affine: false needs normalization LayerNorm or RMSNorm, not "
                             f"{config.normalization!r}.")
        self.hidden_size, self.eps, self.rms = int(hidden_size), float(eps), config.normalization == "RMSNorm"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return rms_normalized(x, self.eps)
        return torch.nn.functional.layer_norm(x.float(), (self.hidden_size,), None, None, self.eps).to(x.dtype)


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) over the last dimension in fp32, cast back (a weightless RMSNorm, as transformers'
    NanoChatRMSNorm computes it; Gemma 4's value norm takes pow(-0.5) instead, as its own does: gemma4.value_rms)."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def clipped_qkv(qkv: torch.Tensor, clip) -> torch.Tensor:
    """The projected queries, keys and values clamped to +-clip (OLMo's clip_qkv); unchanged for None."""
    return qkv if clip is None else qkv.clamp(-clip, clip)


def install_clip_qkv(model: torch.nn.Module, clip: float) -> None:
    """A forward hook on every layer's linear_qkv of this GPTModel chunk clamping its output (megatron's (output,
    bias) pair; the bias is inside the output: skip_bias_add is off for linear_qkv) to +-clip."""
    if not clip > 0:
        raise ValueError(f"clip_qkv {clip} must be > 0 (or null for none).")

    def hook(module, args, output):
        if isinstance(output, tuple):
            return (clipped_qkv(output[0], clip), *output[1:])
        return clipped_qkv(output, clip)

    for layer in model.decoder.layers:
        qkv = getattr(layer.self_attention, "linear_qkv", None)
        if qkv is None:
            raise ValueError("clip_qkv needs attention with one linear_qkv (not multi-latent attention or Gated "
                             "DeltaNet layers).")
        qkv.register_forward_hook(hook)


class AcrossHeadsRMSNorm(torch.nn.Module):
    """RMSNorm over all heads of a token's query (which="q") or key ("k"), TP-sharded by heads. Built
    by megatron's attention in the q_layernorm / k_layernorm slot (hidden_size = head_dim there).
    Its parameter is `sharded_weight` (this rank's heads' slice), a name of its own so the bridge
    splits it over TP instead of replicating it (hf_bridge/mapping.py)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, which: str = "q", **kwargs):
        super().__init__()
        tp = config.tensor_model_parallel_size
        heads = config.num_attention_heads if which == "q" else (config.num_query_groups or config.num_attention_heads)
        if heads % tp:
            raise ValueError(f"tensor_model_parallel_size {tp} does not divide the {heads} {which} heads of the "
                             f"across-heads {which}_norm.")
        self.eps, self.tp, self.full_width = float(eps), tp, heads * hidden_size
        self.sharded_weight = torch.nn.Parameter(torch.ones(heads // tp * hidden_size))
        set_tensor_model_parallel_attributes(self.sharded_weight, True, 0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # (s, b, heads of this rank, head_dim)
        h = x.reshape(*shape[:-2], -1).float()
        square_sum = h.pow(2).sum(-1, keepdim=True)
        if self.tp > 1:  # the other ranks' heads: their share of the sum, differentiably
            square_sum = torch.distributed.nn.functional.all_reduce(
                square_sum, group=parallel_state.get_tensor_model_parallel_group())
        h = h * torch.rsqrt(square_sum / self.full_width + self.eps)
        return (self.sharded_weight.float() * h).to(x.dtype).reshape(shape)


@contextlib.contextmanager
def kept_from_tp_sum(chunks: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Around megatron's finalize_model_grads: AcrossHeadsRMSNorm weights out of its TP all-reduce of
    q_layernorm / k_layernorm gradients. That rule picks parameters by name, requires_grad ones only, so
    they have requires_grad off for the call (restored after); DDP's data-parallel reduction, which
    works on its gradient buckets, still covers them. Without this, at TP 2 each slice's gradient came
    out as the sum of both slices' (100 % off, MiniMax-M2 and OLMo 2 alike)."""
    weights = [m.sharded_weight for chunk in chunks for m in chunk.modules()
               if isinstance(m, AcrossHeadsRMSNorm) and m.sharded_weight.requires_grad]
    for w in weights:
        w.requires_grad_(False)
    try:
        yield
    finally:
        for w in weights:
            w.requires_grad_(True)


def without_pre_norms(spec: Any, across_heads: bool, pre_norm: bool) -> Any:
    """A copy of a layer or block spec whose layers have no input / pre-MLP norms (pre_norm false)
    and, with across_heads, AcrossHeadsRMSNorm as q / k norms."""
    if isinstance(spec, TransformerBlockSubmodules):
        return dataclasses.replace(spec, layer_specs=[without_pre_norms(s, across_heads, pre_norm)
                                                      for s in spec.layer_specs])
    sub = spec.submodules
    changes: dict = {} if pre_norm else {"input_layernorm": IdentityOp, "pre_mlp_layernorm": IdentityOp}
    if across_heads:
        attention = sub.self_attention
        changes["self_attention"] = dataclasses.replace(attention, submodules=dataclasses.replace(
            attention.submodules, q_layernorm=ModuleSpec(module=AcrossHeadsRMSNorm, params={"which": "q"}),
            k_layernorm=ModuleSpec(module=AcrossHeadsRMSNorm, params={"which": "k"})))
    return dataclasses.replace(spec, submodules=dataclasses.replace(sub, **changes))
