"""nanochat's two pieces that megatron-core's GPTModel does not have (models/builder.py installs them from the keys
hf_config.model_config_from_hf sets for config.json model_type nanochat; models/hf_nanochat_config.py):

- embedding_norm: the embeddings are RMS-normalised without a weight before the first layer (transformers'
  NanoChatModel applies its final norm, which has no weight, to them too): a forward hook on the first pipeline
  stage's `model.embedding`, which every forward calls (training, log-probs, and the rollout's prefill, lean and
  compiled decode steps: rollout/kv_cache.py), so they all normalise alike;
- rotary_negated: its rotate_half has flipped signs, cat(x2, -x1) for Llama's cat(-x2, x1), so q * cos + rotate_half(q)
  * sin turns each pair by minus its angle. cos(-a) = cos(a), sin(-a) = -sin(a): RoPE with the inverse frequencies
  negated, set once on the model's rotary embedding, whose table every rotation reads (megatron's and
  models/rotary.py's, the rollout cache's).

Its other pieces exist: weightless RMSNorms everywhere (layernorm_affine: false with normalization RMSNorm:
models/olmo.NonParametricLayerNorm), per-head q / k norms (qk_layernorm; nanochat applies them after RoPE, but a norm
without weight over a head commutes with the rotation, which keeps each head's length, so megatron's before-RoPE q / k
norms give the same result), relu(x)^2 MLP without a gate (squared_relu, its fc1 / fc2 named in hf_bridge/names.py) and
the logits' soft cap (output_logit_softcapping: 15).
"""
from __future__ import annotations

import torch

from mindspeed_rl.models.olmo import rms_normalized


def install(model: torch.nn.Module, embedding_norm: bool, rotary_negated: bool, eps: float) -> None:
    """Hook the weightless RMSNorm (epsilon eps) onto this GPTModel chunk's embedding (first stage only) and / or negate
    its rotary embedding's inverse frequencies (after builder.rotary_inv_freq set them)."""
    if embedding_norm and getattr(model, "pre_process", False):
        def hook(module, args, output):
            return rms_normalized(output, eps)

        model.embedding.register_forward_hook(hook)
    if rotary_negated:
        rotary = getattr(model, "rotary_pos_emb", None)
        if rotary is None:
            raise ValueError("rotary_negated needs RoPE (position_embedding_type: rope).")
        rotary.inv_freq = -rotary.inv_freq
