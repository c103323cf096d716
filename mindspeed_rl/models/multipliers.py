"""Granite's scalar multipliers on a megatron GPTModel: the embeddings times `embedding_multiplier`,
each attention and MLP output times `residual_multiplier` before its residual add, the logits times
`logits_multiplier` (1 / config.json's logits_scaling); its attention_multiplier is megatron's
softmax_scale. Gemma's embedding scale sqrt(hidden_size) (input_embeds_norm) is the embedding
multiplier rounded to the activations' dtype first (`embedding_multiplier_in_dtype`), as
transformers and vLLM round it. megatron-core has none of them, so they are forward hooks on the modules whose
output they scale, installed at build time (models/builder.py): every forward through the modules
(training, log-probs, the rollout's prefill and cached steps, the compiled layers) scales alike.
The rollout's lean and compiled decode steps call the linear layers themselves and multiply there
(rollout/kv_cache.py reads the same config attributes).

    install(model)                 # reads model.config.embedding_multiplier / residual_multiplier / logits_multiplier
"""
from __future__ import annotations

import torch


def _scale_output(factor: float, in_dtype: bool = False):
    def hook(module, args, output):
        if isinstance(output, tuple):  # megatron's (output, bias) of attention, MLP and the output layer
            out, bias = output[0], output[1]
            return (out * factor, bias * factor if bias is not None else None, *output[2:])
        return output * (torch.tensor(factor, dtype=output.dtype) if in_dtype else factor)
    return hook


def install(model: torch.nn.Module) -> None:
    """Hook the multipliers of model.config that are not 1 onto this GPTModel chunk's modules."""
    c = model.config
    embedding, residual, logits = (multiplier(c, n) for n in ("embedding_multiplier", "residual_multiplier",
                                                               "logits_multiplier"))
    if embedding != 1.0 and getattr(model, "pre_process", False):
        model.embedding.register_forward_hook(
            _scale_output(embedding, getattr(c, "embedding_multiplier_in_dtype", False)))
    if residual != 1.0:
        for layer in model.decoder.layers:
            layer.self_attention.register_forward_hook(_scale_output(residual))
            layer.mlp.register_forward_hook(_scale_output(residual))
    if logits != 1.0 and getattr(model, "post_process", False):
        model.output_layer.register_forward_hook(_scale_output(logits))


def multiplier(config, name: str) -> float:
    """config's `name` multiplier (1 when the model has none)."""
    return float(getattr(config, name, 1.0))


def scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    """t * factor, or t itself for 1 (no extra pass in the decode steps of models without multipliers)."""
    return t if factor == 1.0 else t * factor
