"""Gemma's (1, 2, 3) layer pieces that megatron-core's local layer spec does not have (models/builder.py
installs them from the MindSpeed-LLM keys hf_config.gemma_args sets; OLMo 2 uses the post norms too,
with a plain RMSNorm: models/olmo.py):

- add_rmsnorm_offset: every RMSNorm scales by (1 + weight), in fp32, then casts back, exactly as
  transformers' Gemma3RMSNorm and vLLM's GemmaRMSNorm compute it. `OffsetRMSNorm` takes megatron's
  norm signature and goes into the spec in place of its norm classes (`norms_replaced`), so the
  layer, q/k and final norms all use it and the checkpoint keeps HF's weights as they are (no +1 in
  the weight conversion). Nemotron's LayerNorm1P is the same offset on a LayerNorm with its bias
  (apply_layernorm_1p, Megatron-LM's --apply-layernorm-1p): `OffsetLayerNorm`, swapped in alike;
- post_norm: a norm on the attention output and on the MLP output before each residual add
  (Gemma's `post_attention_layernorm` / `post_feedforward_layernorm`; its `pre_feedforward_layernorm`
  is megatron's pre_mlp_layernorm). `install_post_norms` adds them to each layer as
  `post_self_attn_layernorm` / `post_mlp_layernorm` (parameters of the layer: in its state dict,
  gradients and optimizer) and normalises the attention / MLP output with a forward hook, so every
  forward through the modules (training, log-probs, the rollout's prefill) applies them; the
  rollout's lean and compiled decode steps call them themselves (rollout/kv_cache.py);
- soft caps (Gemma 2): the logits are capped to cap x tanh(logit / cap) by a hook on the output
  layer (`install_output_softcap`); the attention scores' cap is models/core_attention.py's;
- local rotary embedding: the sliding-window layers rotate with their own theta
  (rope_local_base_freq), a second megatron RotaryEmbedding whose table a forward pre-hook gives
  those layers' attention in place of the model's (`install_local_rope`); the default rope,
  unscaled, where the full layers' rope may scale (OLMo 3: YaRN's attention factor on the full
  layers only).

With sequence parallelism every norm weight here is marked `sequence_parallel` (its gradient is
all-reduced over TP, as models/parallel.SequenceParallelNorm's). On NPU these run as plain torch
ops (MindSpeed's fused RMSNorm has no offset).
"""
from __future__ import annotations

import copy
from typing import Any, Optional

import torch

from mindspeed_rl.models.spec_tree import swap_in_spec


class OffsetRMSNorm(torch.nn.Module):
    """x / sqrt(mean(x^2) + eps) * (1 + weight), in fp32, cast back to x's dtype (Gemma's RMSNorm).
    Same constructor as megatron's norm modules; the weight starts at 0 (a scale of 1)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):
        super().__init__()
        if config.normalization != "RMSNorm":
            raise ValueError(f"add_rmsnorm_offset needs normalization: RMSNorm, not {config.normalization!r}.")
        self.eps = float(eps)
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size))
        setattr(self.weight, "sequence_parallel", bool(getattr(config, "sequence_parallel", False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class OffsetLayerNorm(torch.nn.Module):
    """layer_norm(x) * (1 + weight) + bias, in fp32, cast back to x's dtype (Nemotron's LayerNorm1P, which
    transformers and vLLM compute as F.layer_norm(x, weight + 1, bias)). Megatron's norm constructor; the
    weight and bias start at 0 (a scale of 1, no shift)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        super().__init__()
        if config.normalization != "LayerNorm":
            raise ValueError(f"apply_layernorm_1p needs normalization: LayerNorm, not {config.normalization!r}.")
        self.eps = float(eps)
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(hidden_size))
        for p in (self.weight, self.bias):
            setattr(p, "sequence_parallel", bool(getattr(config, "sequence_parallel", False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.layer_norm(x.float(), self.weight.shape, 1.0 + self.weight.float(), self.bias.float(),
                                           self.eps)
        return h.type_as(x)


def norms_replaced(spec: Any, cls: type) -> Any:
    """A copy of a block spec (TransformerBlockSubmodules) with each of norm_classes() (megatron's norm
    implementations and models/parallel.SequenceParallelNorm) replaced by `cls`: OffsetRMSNorm, OffsetLayerNorm or
    models/cohere.WeightOnlyLayerNorm."""
    for old in norm_classes():
        spec = swap_in_spec(spec, old, cls)
    return spec


def _post_norm_hook(norm: torch.nn.Module):
    def hook(module, args, output):
        if isinstance(output, tuple):  # megatron's (output, bias): the norm sees output + bias
            out, bias = output[0], output[1]
            out = out + bias if bias is not None else out
            return (norm(out), None, *output[2:])
        return norm(output)
    return hook


def post_norm_cls(config) -> type:
    """The norm class of the post norms: OffsetRMSNorm with add_rmsnorm_offset, else torch's."""
    if getattr(config, "add_rmsnorm_offset", False):
        return OffsetRMSNorm
    from mindspeed_rl.models.parallel import SequenceParallelNorm

    return SequenceParallelNorm


def install_post_norms(model: torch.nn.Module) -> None:
    """Give every layer of this GPTModel chunk `post_self_attn_layernorm` / `post_mlp_layernorm`
    and hook them onto the attention / MLP outputs (module docstring). Call before the model is
    placed (models/builder.py): the new weights follow the model's device and dtype."""
    config = model.config
    cls = post_norm_cls(config)
    for layer in model.decoder.layers:
        layer.post_self_attn_layernorm = cls(config, config.hidden_size, eps=config.layernorm_epsilon)
        layer.post_mlp_layernorm = cls(config, config.hidden_size, eps=config.layernorm_epsilon)
        layer.self_attention.register_forward_hook(_post_norm_hook(layer.post_self_attn_layernorm))
        layer.mlp.register_forward_hook(_post_norm_hook(layer.post_mlp_layernorm))


def post_norm(layer: torch.nn.Module, name: str, out: torch.Tensor) -> torch.Tensor:
    """The layer's post norm `name` (post_self_attn_layernorm / post_mlp_layernorm) applied to out,
    or out itself in a model without post norms (the rollout's decode steps)."""
    norm = getattr(layer, name, None)
    return out if norm is None else norm(out)


def softcap(t: torch.Tensor, cap) -> torch.Tensor:
    """cap x tanh(t / cap) (Gemma 2's soft cap), or t itself for no cap; computed as transformers does
    (divide, tanh, multiply)."""
    return t if not cap else torch.tanh(t / cap) * cap


def install_output_softcap(model: torch.nn.Module, cap: float) -> None:
    """Soft-cap the logits of this GPTModel chunk's output layer (its last pipeline stage): a forward
    hook, so training, log-probs and the rollout's prefill see capped logits; the lean decode steps
    cap their own (rollout/kv_cache.py). Element-wise, so vocab-parallel shards cap alike."""
    def hook(module, args, output):
        if isinstance(output, tuple):
            return (softcap(output[0], cap), *output[1:])
        return softcap(output, cap)
    model.output_layer.register_forward_hook(hook)


def local_inv_freq(rotary: torch.nn.Module, base: float, dim: Optional[int] = None) -> torch.Tensor:
    """The default inverse frequencies of `rotary`'s dimension (or `dim`) at theta `base` (HF and megatron alike)."""
    dim = dim or rotary.inv_freq.numel() * 2
    return 1.0 / (float(base) ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def install_local_rope(model: torch.nn.Module, base: float, uses_local, dim: Optional[int] = None) -> None:
    """model.local_rotary_pos_emb: a copy of its rotary embedding at theta `base`, unscaled (`dim` wide where the
    local layers' heads differ from the model's: Gemma 4's sliding_kv_channels); the
    layers `uses_local(layer_number)` marks get its table instead of the model's (a forward
    pre-hook on every layer's attention, which receives `rotary_pos_emb` as a keyword in megatron-core
    0.12 and 0.16, acting where the attention's `local_rope` is true). The table is megatron's (s, 1, 1, rot) for the same length, one object per length
    (megatron lru-caches it), so models/rotary.py computes its cos / sin once per forward too."""
    # a shallow copy: megatron's RotaryEmbedding has no parameters or buffers (inv_freq is a plain
    # attribute, replaced below), and megatron-core 0.16's holds a process group deepcopy cannot copy
    local = copy.copy(model.rotary_pos_emb)
    local.inv_freq = local_inv_freq(model.rotary_pos_emb, base, dim).to(model.rotary_pos_emb.inv_freq.device)
    model.local_rotary_pos_emb = local

    def swap(module, args, kwargs):
        emb = kwargs.get("rotary_pos_emb")
        if emb is None or not module.local_rope:
            return None
        if isinstance(emb, tuple):  # (q, k) tables of one length
            return args, {**kwargs, "rotary_pos_emb": tuple(local(e.shape[0]) for e in emb)}
        return args, {**kwargs, "rotary_pos_emb": local(emb.shape[0])}

    # the full layers' rope may scale cos / sin (config.rope_mscale: OLMo 3's YaRN attention factor); the
    # local table is the default rope, so those layers' attention rotates with a config copy at 1
    # (megatron's attention passes its own config to apply_rotary_pos_emb, models/rotary.py reads it)
    unscaled = None
    if float(getattr(model.config, "rope_mscale", 1.0)) != 1.0:
        unscaled = copy.copy(model.config)
        unscaled.rope_mscale = 1.0
    for layer in model.decoder.layers:  # every layer, told apart by an attribute (as sliding_window.install)
        layer.self_attention.local_rope = bool(uses_local(layer.layer_number))
        layer.self_attention.register_forward_pre_hook(swap, with_kwargs=True)
        if unscaled is not None and layer.self_attention.local_rope:
            layer.self_attention.config = unscaled


def norm_classes() -> tuple:
    """megatron's norm implementations a local spec may hold, and models/parallel.py's SP norm."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import LayerNormImpl

    from mindspeed_rl.models.parallel import SequenceParallelNorm

    return tuple({WrappedTorchNorm, LayerNormImpl, SequenceParallelNorm})


def as_block_spec(spec: Any, num_layers_here: int) -> Any:
    """A layer spec as the block spec megatron would make of it (the final norm explicit)."""
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    if isinstance(spec, TransformerBlockSubmodules):
        return spec
    return TransformerBlockSubmodules(layer_specs=[spec] * num_layers_here, layer_norm=LayerNormImpl)
