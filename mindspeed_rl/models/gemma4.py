"""Gemma 4's layer pieces that megatron-core's local layer spec does not have (models/builder.py installs them from
the keys hf_gemma4_config.gemma4_args sets; the rest of its layer is Gemma 3's: models/gemma.py):

- layers of two shapes (sliding_kv_channels / sliding_num_query_groups): the sliding layers' attention has a head
  dimension and key / value heads of its own. `ShapedLayer` is megatron's TransformerLayer built from a copy of the
  model's config with those fields changed, so everything in the layer (its projections' sizes, the core
  attention's grouping, TP's split by whole query groups, the native engine's cache: rollout/kv_cache.new_cache)
  follows from the layer's own config;
- `Gemma4Attention` (every layer): the values normalised by an RMSNorm without weight, in fp32 (value_norm, HF's
  v_norm); with attention_k_eq_v (the full layers) linear_qkv holds per query group [its query heads | k] only and
  the values are the keys as projected, before k_norm (HF: no v_proj; vLLM loads k_proj into its V rows too);
- layer_scalar: each layer's output (the residual stream) times a constant of the layer, a buffer loaded from the
  checkpoint (HF's layer_scalar), applied by a forward hook, so every path through the layer's forward (training,
  log-probs, the native engine) applies it.

- Gemma 4 26B-A4B (moe_dense_beside): `Gemma4MoE` in the MLP slot, below.
- Gemma 4 E2B / E4B: `PerLayerInputs` (per_layer_input_size) and KV sharing (num_kv_shared_layers), below: the last
  layers' Gemma4Attention project queries only and attend over the keys and values an earlier layer of their kind
  computed in the same forward (its `shared_kv`, taken before RoPE, which each layer applies again with the same
  table), their MLPs twice as wide with kv_shared_double_mlp (ShapedLayer's ffn_hidden_size).

The full layers' rotary table is the model's (kv_channels wide, rope_scaling_type proportional: builder.rotary_inv_freq),
the sliding layers' the local one (models/gemma.install_local_rope, sliding_kv_channels wide).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Sequence

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.transformer.attention import SelfAttention  # noqa: E402
from megatron.core.transformer.moe.moe_layer import MoELayer  # noqa: E402
from megatron.core.transformer.spec_utils import build_module  # noqa: E402
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules  # noqa: E402
from megatron.core.transformer.transformer_layer import TransformerLayer  # noqa: E402

from mindspeed_rl.models.hf_config import window_pattern  # noqa: E402
from mindspeed_rl.models.hf_gemma4_config import kv_source, layer_ffn  # noqa: E402


def value_rms(value: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over each head, in fp32, cast back (HF's Gemma4RMSNorm without a weight)."""
    h = value.float()
    return (h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)).type_as(value)


class Gemma4Attention(SelfAttention):
    """megatron's SelfAttention with Gemma 4's value norm and, where the config says attention_k_eq_v, the keys as
    values (module docstring)."""

    def __init__(self, config, submodules, *args, **kwargs):
        super().__init__(config, submodules, *args, **kwargs)
        # the layer (0-based) whose keys and values this one attends over (KV sharing: install_kv_sharing), or None
        self.kv_source = getattr(config, "kv_source_layer", None)
        self.k_eq_v = bool(getattr(config, "attention_k_eq_v", False)) and self.kv_source is None
        self.value_norm = bool(getattr(config, "value_norm", False))
        rows = (self.query_projection_size if self.kv_source is not None  # queries only
                else self.query_projection_size + self.kv_projection_size if self.k_eq_v else None)
        if rows is not None:  # linear_qkv again, without the value rows: per group [q heads | k]; or queries only
            self.linear_qkv = build_module(
                submodules.linear_qkv, config.hidden_size, rows,
                config=config, init_method=config.init_method, gather_output=False,
                bias=config.add_bias_linear or config.add_qkv_bias, skip_bias_add=False, is_expert=False,
                tp_comm_buffer_name="qkv")
        if self.kv_source is not None:
            self.k_layernorm = None  # the keys come normalised from their layer

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, *args, **kwargs):
        if self.kv_source is not None:
            mixed, _ = self.linear_qkv(hidden_states)  # (s, b, heads * hn) of this rank
            query = mixed.view(*mixed.shape[:2], -1, self.hidden_size_per_attention_head)
            if self.q_layernorm is not None:
                query = self.q_layernorm(query)
            producer = self.__dict__.get("kv_producer")
            shared = producer.__dict__.get("shared_kv") if producer is not None else None
            if shared is None:
                raise RuntimeError(f"layer {self.layer_number} attends over layer {self.kv_source + 1}'s keys and "
                                   f"values (num_kv_shared_layers), which did not run before it in this forward "
                                   f"(models/gemma4.install_kv_sharing links them in one model chunk).")
            return query, shared[0], shared[1]
        if self.k_eq_v:
            mixed, _ = self.linear_qkv(hidden_states)  # (s, b, groups * (q + 1) * hn) of this rank
            groups, hn = self.num_query_groups_per_partition, self.hidden_size_per_attention_head
            per_group = self.num_attention_heads_per_partition // groups
            mixed = mixed.view(*mixed.shape[:-1], groups, (per_group + 1) * hn)
            query, key = torch.split(mixed, [per_group * hn, hn], dim=3)
            value = key
            query = query.reshape(*query.shape[:2], -1, hn)
            if self.q_layernorm is not None:
                query = self.q_layernorm(query)
            if self.k_layernorm is not None:
                key = self.k_layernorm(key)
        else:
            query, key, value = super().get_query_key_value_tensors(hidden_states, key_value_states, *args, **kwargs)
        if self.value_norm:
            value = value_rms(value, self.config.layernorm_epsilon)
        if self.__dict__.get("stores_kv"):  # read by the KV-sharing layers after this one (before RoPE)
            self.__dict__["shared_kv"] = (key, value)
        return query, key, value


class ShapedLayer(TransformerLayer):
    """megatron's TransformerLayer built from a copy of the model's config with `shape`'s fields (module docstring)."""

    def __init__(self, config, submodules, *args, shape: dict, **kwargs):
        config = copy.copy(config)
        for key, value in shape.items():
            setattr(config, key, value)
        super().__init__(config, submodules, *args, **kwargs)


def sliding_shape(args: dict) -> dict[str, Any]:
    """The config fields a sliding layer changes: its head dimension and key / value heads where args give them, and
    no keys as values."""
    shape: dict[str, Any] = {"attention_k_eq_v": False}
    if args.get("sliding_kv_channels"):
        shape["kv_channels"] = int(args["sliding_kv_channels"])
    if args.get("sliding_num_query_groups"):
        shape["num_query_groups"] = int(args["sliding_num_query_groups"])
    return shape


def layer_shape(args: dict, layer: int, pattern=None) -> dict[str, Any]:
    """The config fields layer `layer` (0-based) changes (ShapedLayer): a sliding layer's (sliding_shape), a
    KV-sharing layer's source (kv_source_layer: Gemma4Attention) and, with kv_shared_double_mlp, its MLP's width."""
    pattern = pattern if pattern is not None else window_pattern(args.get("window_attn_skip_freq"), int(args["num_layers"]))
    shape = sliding_shape(args) if pattern is None or pattern[layer] else {}
    source = kv_source(args, layer)
    if source is not None:
        shape["kv_source_layer"] = source
        if args.get("kv_shared_double_mlp"):
            shape["ffn_hidden_size"] = layer_ffn(args, layer)
    return shape


def block_spec(block: Any, args: dict, layers: Sequence[int], dense_mlp: Any = None) -> Any:
    """`block` (a layer spec, or a block spec of the layers `layers`: global indices) with Gemma4Attention in every
    layer and the layers whose config differs (the sliding ones: window_attn_skip_freq, all of them without it; the
    KV-sharing ones: layer_shape) ShapedLayers; with moe_dense_beside each (MoE) layer's MLP slot Gemma4MoE, its dense
    MLP `dense_mlp` (a dense layer spec's MLP)."""
    pattern = window_pattern(args.get("window_attn_skip_freq"), int(args["num_layers"]))
    specs = block.layer_specs if isinstance(block, TransformerBlockSubmodules) else [block] * len(layers)
    out = []
    for spec, layer in zip(specs, layers):
        attention = dataclasses.replace(spec.submodules.self_attention, module=Gemma4Attention)
        spec = dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=attention))
        if args.get("moe_dense_beside"):
            spec = moe_block_spec(spec, dense_mlp)
        shape = layer_shape(args, layer, pattern)
        if shape:
            spec = dataclasses.replace(spec, module=ShapedLayer, params={**(spec.params or {}), "shape": shape})
        out.append(spec)
    if isinstance(block, TransformerBlockSubmodules):
        return dataclasses.replace(block, layer_specs=out)
    from megatron.core.transformer.transformer_block import LayerNormImpl

    return TransformerBlockSubmodules(layer_specs=out, layer_norm=LayerNormImpl)


def _scale_output(module, args, output):
    if isinstance(output, tuple):  # megatron's (hidden, context)
        return (output[0] * module.layer_scalar.to(output[0].dtype), *output[1:])
    return output * module.layer_scalar.to(output.dtype)


def install(model: torch.nn.Module, per_layer_input_size=None, per_layer_input_vocab_size=None,
            kv_sharing: bool = False, layer_scalar: bool = False) -> None:
    """What Gemma 4 adds to a built GPTModel chunk (models/builder.py), in this order: E2B / E4B's per-layer inputs and
    KV sharing, then each layer's scalar (whose hook must run after the per-layer input's)."""
    if per_layer_input_size:
        install_per_layer_inputs(model, int(per_layer_input_size), int(per_layer_input_vocab_size))
    if kv_sharing:
        install_kv_sharing(model)
    if layer_scalar:
        install_layer_scalar(model)


def install_layer_scalar(model: torch.nn.Module) -> None:
    """Give every layer of this GPTModel chunk its `layer_scalar` (1 until loaded; a buffer: in the state dict, not
    trained) and multiply the layer's output by it. Call before the model is placed (models/builder.py)."""
    for layer in model.decoder.layers:
        layer.register_buffer("layer_scalar", torch.ones(1))
        layer.register_forward_hook(_scale_output)


# ---------------------------------------------------------------------------------------------
# Gemma 4 26B-A4B: a dense MLP and a mixture of experts side by side in every layer (moe_dense_beside)

class Gemma4MoE(MoELayer):
    """megatron's MoELayer (router, experts: their names and parallel layouts as every MoE model's) with Gemma 4's
    dense MLP beside it (`dense`, ffn_hidden_size wide, split over TP as a dense layer's MLP) and the four norms around
    the two: out = post_dense_norm(dense(pre_dense_norm(x))) + post_experts_norm(experts(pre_experts_norm(x))), x the
    layer's residual stream (the layer's own pre-MLP norm is an identity; its post-MLP norm follows, models/gemma.py).
    The router reads x RMS-normalised without weight, x its `scale` (per feature) x hidden^-0.5, routes softmax top-k
    renormalised (megatron's top-k then softmax), and its probabilities are multiplied by `per_expert_scale`
    (HF's router.scale / router.per_expert_scale). The experts' input norm is per token, so it is applied to the
    dispatched tokens (a pre-hook on the experts), after any permutation or exchange between ranks."""

    def __init__(self, config, submodules=None, *args, dense=None, **kwargs):
        super().__init__(config, submodules, *args, **kwargs)
        from mindspeed_rl.models.gemma import post_norm_cls

        h, cls = config.hidden_size, post_norm_cls(config)
        self.dense = build_module(dense, config=config)
        self.pre_dense_norm, self.post_dense_norm, self.pre_experts_norm, self.post_experts_norm = (
            cls(config, h, eps=config.layernorm_epsilon) for _ in range(4))
        self.router.scale = torch.nn.Parameter(torch.ones(h, dtype=config.params_dtype))
        self.router.per_expert_scale = torch.nn.Parameter(torch.ones(config.num_moe_experts, dtype=config.params_dtype))
        for p in (self.router.scale, self.router.per_expert_scale):  # under SP each TP rank routes its own tokens: their
            setattr(p, "sequence_parallel", bool(config.sequence_parallel))  # gradients summed over TP, as the router's
        self.router.register_forward_pre_hook(_router_input)
        self.router.register_forward_hook(_expert_scale)

    def _experts_input(self, module, args):
        return (self.pre_experts_norm(args[0]), *args[1:])

    def forward(self, hidden_states, *args, **kwargs):
        # the experts' input norm, hooked on the experts module this layer holds now (models/grouped_experts.py may
        # have put its own in place of megatron's since construction)
        if self.__dict__.get("_hooked_experts") is not self.experts:  # (kept out of the module tree: no submodule)
            self.experts.register_forward_pre_hook(self._experts_input)
            self.__dict__["_hooked_experts"] = self.experts
        dense, _ = self.dense(self.pre_dense_norm(hidden_states))
        routed, _ = super().forward(hidden_states, *args, **kwargs)
        return self.post_dense_norm(dense) + self.post_experts_norm(routed), None


def _router_input(router, args):
    x = args[0]
    normed = value_rms(x, router.config.layernorm_epsilon)
    return (normed * router.scale.to(x.dtype) * (x.shape[-1] ** -0.5), *args[1:])


def _expert_scale(router, args, output):
    probs, routing_map = output[0], output[1]
    return (probs * router.per_expert_scale.to(probs.dtype), routing_map, *output[2:])


def moe_block_spec(layer_spec, dense_spec) -> Any:
    """A MoE layer spec with Gemma4MoE in the MLP slot (the dense MLP's spec `dense_spec`) and no pre-MLP norm."""
    from megatron.core.transformer.identity_op import IdentityOp

    mlp = dataclasses.replace(layer_spec.submodules.mlp, module=Gemma4MoE,
                              params={**(layer_spec.submodules.mlp.params or {}), "dense": dense_spec})
    return dataclasses.replace(layer_spec, submodules=dataclasses.replace(
        layer_spec.submodules, mlp=mlp, pre_mlp_layernorm=IdentityOp))


# ---------------------------------------------------------------------------------------------
# Gemma 4 E2B / E4B: KV sharing (num_kv_shared_layers) and per-layer inputs (per_layer_input_size)

def install_kv_sharing(model: torch.nn.Module) -> None:
    """Link each KV-sharing layer's attention (Gemma4Attention with a kv_source) to the attention of its source layer,
    which then keeps its keys and values (`shared_kv`) for them until the decoder's forward ends. Both must be in this
    model chunk (validation: pipeline_model_parallel_size 1)."""
    by_layer = {layer.layer_number - 1: layer.self_attention for layer in model.decoder.layers}
    producers = []
    for attention in by_layer.values():
        source = getattr(attention, "kv_source", None)
        if source is None:
            continue
        if source not in by_layer:
            raise ValueError(f"layer {attention.layer_number} attends over layer {source + 1}'s keys and values "
                             f"(num_kv_shared_layers), which another pipeline stage holds; use "
                             f"pipeline_model_parallel_size 1.")
        attention.__dict__["kv_producer"] = by_layer[source]  # not a submodule: no second copy in the state dict
        by_layer[source].__dict__["stores_kv"] = True
        producers.append(by_layer[source])

    def release(module, args, output):
        for producer in producers:
            producer.__dict__.pop("shared_kv", None)

    model.decoder.register_forward_hook(release)


class PerLayerInputs(torch.nn.Module):
    """Gemma 4 E2B / E4B's per-layer inputs (HF's embed_tokens_per_layer, per_layer_model_projection,
    per_layer_projection_norm): for every token a (num_layers, size) input, the layers' slices of

        (norm(projection(e) * hidden^-0.5) + table[token] * sqrt(size)) * 2^-0.5

    e the (scaled) embedding of the token. The table (vocab x num_layers * size) is split over TP by rows as the word
    embeddings (megatron's VocabParallelEmbedding: under SP reduce-scattered to each rank's positions); the projection
    and the norm are whole on every rank (their gradients summed over TP under SP: `sequence_parallel`)."""

    def __init__(self, config, num_layers: int, size: int, vocab: int):
        super().__init__()
        from megatron.core.tensor_parallel import VocabParallelEmbedding

        from mindspeed_rl.models.gemma import post_norm_cls

        self.num_layers, self.size = num_layers, size
        self.embeddings = VocabParallelEmbedding(vocab, num_layers * size, init_method=config.init_method,
                                                 reduce_scatter_embeddings=bool(config.sequence_parallel), config=config)
        self.projection = torch.nn.Linear(config.hidden_size, num_layers * size, bias=False)
        with torch.no_grad():
            config.init_method(self.projection.weight)
        setattr(self.projection.weight, "sequence_parallel", bool(config.sequence_parallel))
        self.norm = post_norm_cls(config)(config, size, eps=config.layernorm_epsilon)

    def forward(self, input_ids: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """input_ids (b, s); embedded (s', b, h) the embedding's output (s' = s / TP under SP) -> (s', b, layers, size)."""
        table = self.embeddings(input_ids)  # (b, s, n) whole, or (s', b, n) reduce-scattered under SP
        if not self.embeddings.reduce_scatter_embeddings:
            table = table.transpose(0, 1)
        table = table * torch.tensor(self.size ** 0.5, dtype=table.dtype)  # HF's embed_scale, in the table's dtype
        s, b, h = embedded.shape
        projected = self.projection(embedded) * (h ** -0.5)
        projected = self.norm(projected.reshape(s, b, self.num_layers, self.size))
        return (projected + table.reshape(s, b, self.num_layers, self.size)) * (2.0 ** -0.5)


def install_per_layer_inputs(model: torch.nn.Module, size: int, vocab: int) -> None:
    """Give this GPTModel chunk Gemma 4's per-layer inputs: `embedding.per_layer` (PerLayerInputs) and in every layer
    per_layer_input_gate (h -> size), per_layer_projection (size -> h) and post_per_layer_input_norm, whole on every TP
    rank. Each layer's output x becomes x + norm(projection(gelu_tanh(gate(x)) * its input)), before its layer_scalar
    (install before install_layer_scalar). The inputs reach the layers as the decoder's `context` (which megatron's
    layers pass through untouched and its full recompute checkpoints with the hidden states): a pre-hook on the
    embedding keeps the token ids, one on the decoder computes the inputs from them and the embedding's output."""
    from mindspeed_rl.models.gemma import post_norm_cls

    config, h = model.config, model.config.hidden_size
    if not model.pre_process:
        raise ValueError("per_layer_input_size: the per-layer inputs are computed with the embedding; use "
                         "pipeline_model_parallel_size 1.")
    embedding = model.embedding
    embedding.per_layer = PerLayerInputs(config, len(model.decoder.layers), size, vocab)
    norm_cls = post_norm_cls(config)
    for layer in model.decoder.layers:
        layer.per_layer_input_gate = torch.nn.Linear(h, size, bias=False)
        layer.per_layer_projection = torch.nn.Linear(size, h, bias=False)
        layer.post_per_layer_input_norm = norm_cls(config, h, eps=config.layernorm_epsilon)
        for linear in (layer.per_layer_input_gate, layer.per_layer_projection):
            with torch.no_grad():
                config.init_method(linear.weight)
            setattr(linear.weight, "sequence_parallel", bool(config.sequence_parallel))
        layer.register_forward_hook(_add_per_layer_input, with_kwargs=True)

    def remember_ids(module, args, kwargs):
        module.__dict__["per_layer_ids"] = kwargs["input_ids"] if "input_ids" in kwargs else args[0]

    def per_layer_context(decoder, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        ids = embedding.__dict__.pop("per_layer_ids", None)
        if ids is None:
            raise RuntimeError("per-layer inputs (per_layer_input_size): the decoder ran without the embedding "
                               "before it, so there are no token ids to read the per-layer table with.")
        return args, {**kwargs, "context": embedding.per_layer(ids, hidden)}

    embedding.register_forward_pre_hook(remember_ids, with_kwargs=True)
    model.decoder.register_forward_pre_hook(per_layer_context, with_kwargs=True)


def _add_per_layer_input(layer, args, kwargs, output):
    hidden, context = output if isinstance(output, tuple) else (output, None)
    inputs = kwargs.get("context")
    if inputs is None:
        raise RuntimeError(f"layer {layer.layer_number}: no per-layer inputs reached it (the decoder's context).")
    gate = torch.nn.functional.gelu(layer.per_layer_input_gate(hidden), approximate="tanh")
    out = layer.post_per_layer_input_norm(layer.per_layer_projection(gate * inputs[:, :, layer.layer_number - 1]))
    hidden = hidden + out
    return (hidden, context) if isinstance(output, tuple) else hidden
