"""Per-head q / k norms applied after RoPE (`qk_layernorm_after_rope: true`): HunYuan's
(hunyuan_v1_dense: Hunyuan-0.5B / 1.8B / 4B / 7B, -Pretrain / -Instruct), whose `query_layernorm` /
`key_layernorm` normalise each head of the rotated query and key. Megatron applies its q_layernorm /
k_layernorm to the query and key before rotating them (get_query_key_value_tensors), and RMSNorm does not
commute with a rotation by position (it scales each head by its norm, but its weight is per dimension).

How, without a layer of our own (models/builder.py calls `install` on the built model):
- each layer's q / k norm module gets a subclass of its own class whose forward is the identity, so
  megatron's call before RoPE does nothing; its real forward is `after_rope`. (The class is swapped on
  the built module: megatron's torch-norm fallback, WrappedTorchNorm, returns a torch.nn.RMSNorm from
  its constructor, so a subclass in the layer spec would never be built.) The modules, their parameters
  and names stay megatron's (`self_attention.q_layernorm.weight`), so the HF bridge, checkpoints and
  megatron's TP sum of q / k norm gradients treat them as Qwen3's per-head norms.
- a forward pre-hook on each layer's core attention, which megatron calls with the rotated query and
  key, normalises them there. Recompute (checkpointed attention) calls the same module, so the hook runs
  again.
- The native engine's decode paths rotate the query and key themselves (rollout/kv_cache.py:
  CachedCoreAttention and the static step) and call `rotated_norms` after rotating.

Positions: megatron rotates by sequence index, and elsewhere left padding does not matter because
attention sees relative positions only. A norm after RoPE breaks that: its weight differs between the two
dimensions a RoPE frequency rotates together, so the scores depend on absolute positions, and a left-padded
row would be computed at positions shifted by its padding (0.18 off transformers' logits in the parity
test). So before the norm each row's query and key are turned on by the difference between its position
ids and the sequence index (rotations compose: R(a) R(b) = R(a + b)), which puts every token at the
position transformers and vLLM give it (counted from the row's first real token). The position ids are
the ones GPTModel.forward receives (a forward pre-hook keeps them on `model.after_rope_positions`), or the
rollout's forward_stage; the static decode step computes them from its key mask. Plain RoPE only
(config.json's default or HunYuan's alpha, full rotary, Llama's pairs): the turn uses the model's inverse
frequencies (config/validate.py refuses the rest).
"""
from __future__ import annotations

import functools

import torch

from mindspeed_rl.models.rotary import rotate_half


class AfterRope:
    """Mixin over a norm class: the identity where megatron calls it (before RoPE); `after_rope` is the
    norm itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def after_rope(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm_forward(x)


@functools.lru_cache(maxsize=None)
def after_rope_class(cls: type) -> type:
    """`cls` (a norm module class) whose call is the identity and whose `after_rope` normalises (its forward
    as `norm_forward`, not reached through super(): torch.compile's tracer failed on that in the static
    decode step)."""
    return type(f"AfterRope{cls.__name__}", (AfterRope, cls), {"__module__": __name__, "norm_forward": cls.forward})


class Positions:
    """The position ids (b, s) of the forward under way on one GPTModel chunk, or None, and the model's
    inverse RoPE frequencies (rot / 2,)."""

    def __init__(self, inv_freq: torch.Tensor):
        self.ids = None
        self.inv_freq = inv_freq

    def angles(self, start: int, s: int) -> "torch.Tensor | None":
        """(s, b, 1, rot) angles that move queries / keys rotated at sequence indices start ... start + s - 1
        to their position ids; None without position ids."""
        if self.ids is None:
            return None
        index = torch.arange(start, start + s, device=self.ids.device)
        return shift_angles(self.ids[:, -s:].t() - index[:, None], self.inv_freq)


def shift_angles(delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """(s, b, 1, rot) angles of a turn by delta (s, b) positions, in megatron's layout for Llama's pairs
    (the frequencies twice, as its RotaryEmbedding concatenates them)."""
    inv = inv_freq.to(device=delta.device, dtype=torch.float32)
    return (delta.float()[..., None] * torch.cat([inv, inv]))[:, :, None, :]


def rotated_norms(attention: torch.nn.Module, q: torch.Tensor, k: torch.Tensor,
                  angles: "torch.Tensor | None" = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated q (s, b, heads, hn) and k (s, b, groups, hn), turned on by `angles` (s, b, 1, hn) to their
    position ids when given (RoPE's own rotation, models/rotary.rotate_half, in their dtype), normalised by the
    layer's q / k norms where they come after RoPE; unchanged otherwise."""
    q_norm = getattr(attention, "q_layernorm", None)
    if not isinstance(q_norm, AfterRope):
        return q, k
    if angles is not None:
        cos, sin = torch.cos(angles).to(q.dtype), torch.sin(angles).to(q.dtype)
        q, k = rotate_half(q, cos, sin), rotate_half(k, cos, sin)
    return q_norm.after_rope(q), attention.k_layernorm.after_rope(k)


def cached_norms(model: torch.nn.Module, attention: torch.nn.Module):
    """(q, k, start) -> (q, k) for the rollout's cached attention of one layer of `model`, the new tokens at
    sequence indices start ..., their position ids as forward_stage last set them; None for a model
    without norms after RoPE."""
    positions = getattr(model, "after_rope_positions", None)
    if positions is None:
        return None

    def norms(q, k, start):
        return rotated_norms(attention, q, k, positions.angles(start, q.shape[0]))
    return norms


def set_position_ids(model: torch.nn.Module, position_ids: "torch.Tensor | None") -> None:
    """Record the position ids of the forward about to run on `model` (rollout/kv_cache.forward_stage)."""
    positions = getattr(model, "after_rope_positions", None)
    if positions is not None:
        positions.ids = position_ids


def install(model: torch.nn.Module) -> None:
    """On every layer of this GPTModel chunk: the q / k norms made identities where megatron calls them, and
    applied to the rotated query and key as the core attention receives them (megatron calls it as
    core_attention(query, key, value, mask, ...)). Call before the model is placed or wrapped."""
    c = model.config
    if c.rotary_interleaved or float(getattr(c, "rotary_percent", 1.0) or 1.0) != 1.0 or \
            float(getattr(c, "rope_mscale", 1.0) or 1.0) != 1.0:
        raise ValueError("qk_layernorm_after_rope takes plain RoPE only: full rotary (rotary_percent 1), Llama's "
                         "pairs (rotary_interleaved: false), no attention factor.")
    positions = Positions(model.rotary_pos_emb.inv_freq)
    model.after_rope_positions = positions

    def keep_positions(module, args, kwargs):
        ids = args[1] if len(args) > 1 else kwargs.get("position_ids")
        positions.ids = ids if isinstance(ids, torch.Tensor) else None

    model.register_forward_pre_hook(keep_positions, with_kwargs=True)
    for layer in model.decoder.layers:
        attention = layer.self_attention
        for name in ("q_layernorm", "k_layernorm"):
            norm = getattr(attention, name, None)
            if norm is None or not any(True for _ in norm.parameters()):
                raise ValueError("qk_layernorm_after_rope needs qk_layernorm: true.")
            if not isinstance(norm, AfterRope):
                norm.__class__ = after_rope_class(type(norm))

        def hook(module, args, attention=attention):
            q, k = rotated_norms(attention, args[0], args[1], positions.angles(0, args[0].shape[0]))
            return (q, k, *args[2:])

        attention.core_attention.register_forward_pre_hook(hook)
