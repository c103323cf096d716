"""Config checks of the layers whose token mixer is not attention (config/validate.py calls mixer_problems): Qwen3.5's
Gated DeltaNet, Granite 4.0-H's Mamba-2 and LFM2's short-convolution layers (marks, sizes, TP), Nemotron-H's one-block
layers (models/hybrid_pattern.py) and Falcon-H1's attention with Mamba-2 beside it (models/parallel_hybrid.py)."""
from __future__ import annotations

from mindspeed_rl.config.schema import RoleConfig
from mindspeed_rl.models import hybrid_pattern


def mixer_problems(role: RoleConfig, path: str, tp: int) -> list[str]:
    """One sentence per problem of the role's Gated DeltaNet / Mamba-2 marks and sizes and its hybrid_override_pattern
    (`path`: the role's yaml path; `tp`: its tensor-parallel size)."""
    problems: list[str] = []
    if role.arch.linear_attention_layers is not None:
        _check_linear_attention(role, path, tp, problems)
    if role.arch.mamba_layers is not None:
        _check_mamba(role, path, tp, problems)
    if role.arch.parallel_hybrid:
        _check_parallel_hybrid(role, path, tp, problems)
    if role.arch.short_conv_layers is not None:
        _check_short_conv(role, path, tp, problems)
    if role.arch.attention_gate_proj and not role.arch.attention_output_gate:
        problems.append(f"model {role.model_name}: attention_gate_proj (the output gate's own projection, AFMoE's) needs "
                        f"attention_output_gate: true; set it, or drop attention_gate_proj.")
    return problems + hybrid_pattern.config_problems(role.arch, role.model_name)


def _check_parallel_hybrid(role: RoleConfig, path: str, tp: int, problems: list[str]) -> None:
    """Falcon-H1's layers (models/parallel_hybrid.py): attention and Mamba-2 in every layer, so no other layer kinds;
    the Mamba-2 sizes set and fitting TP."""
    from mindspeed_rl.models.mamba_layout import KEYS

    a = role.arch
    others = [k for k in ("mamba_layers", "linear_attention_layers", "hybrid_override_pattern")
              if getattr(a, k) not in (None, [], "") and (k == "hybrid_override_pattern" or any(getattr(a, k)))]
    if others:
        problems.append(f"model {role.model_name}: parallel_hybrid (attention and Mamba-2 side by side in every layer, "
                        f"Falcon-H1) cannot go with {', '.join(others)}; drop {'it' if len(others) == 1 else 'them'}.")
        return
    _sizes_and_shape(role, path, tp, problems, "parallel_hybrid needs the Mamba-2 sizes, but", KEYS, _mamba_shape)


def _check_mixer_layers(role: RoleConfig, path: str, tp: int, problems: list[str], key: str, mixer: str,
                        sizes: tuple, shape) -> None:
    """Layers whose token mixer is not attention, marked by `key` (one 0 / 1 per layer): their `sizes` set, and the
    mixer's shape (`shape(arch)`, with .problem(tp)) fitting TP."""
    if _marked(role, key, problems):
        _sizes_and_shape(role, path, tp, problems, f"{key} marks {mixer} layers but", sizes, shape)


def _marked(role: RoleConfig, key: str, problems: list[str]) -> bool:
    """Whether the layer marks `key` (one 0 / 1 per layer) mark any layer; a sentence in `problems` when they are not
    one 0 / 1 per layer."""
    a = role.arch
    marks = getattr(a, key)
    if not isinstance(marks, (list, tuple)) or any(m not in (0, 1) for m in marks) or \
            (a.num_layers and len(marks) != a.num_layers):
        problems.append(f"model {role.model_name}: {key} must list one 0 or 1 per layer "
                        f"({a.num_layers} layers); it is {marks!r}.")
        return False
    return any(marks)


def _sizes_and_shape(role: RoleConfig, path: str, tp: int, problems: list[str], needs: str, sizes: tuple,
                     shape) -> None:
    """The mixer's `sizes` set (`needs`: the sentence's start, what asks for them), and its shape (`shape(arch)`,
    with .problem(tp)) fitting TP."""
    a = role.arch
    missing = [k for k in sizes if getattr(a, k) is None]
    if missing:
        problems.append(f"model {role.model_name}: {needs} {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                        f"not set; set them or load a Hugging Face checkpoint whose config.json has them.")
        return
    problem = shape(a).problem(tp)
    if problem:
        problems.append(f"`{path}`: model {role.model_name}: {problem}")


def _mamba_shape(a):
    """The Mamba-2 shape of a model's arch keys (mamba_layout.MambaShape)."""
    from mindspeed_rl.models.mamba_layout import MambaShape

    return MambaShape(a.mamba_num_heads, a.mamba_head_dim, a.mamba_num_groups, a.mamba_state_dim,
                      in_multipliers=tuple(a.mamba_in_multipliers or ()))


def _check_linear_attention(role: RoleConfig, path: str, tp: int, problems: list[str]) -> None:
    """Qwen3.5's Gated DeltaNet layers: one 0 / 1 per layer, their sizes set, TP dividing the key heads."""
    from mindspeed_rl.models.delta_layout import DeltaNetShape

    _check_mixer_layers(role, path, tp, problems, "linear_attention_layers", "Gated DeltaNet",
                        ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"),
                        lambda a: DeltaNetShape(a.linear_num_key_heads, a.linear_num_value_heads, a.linear_key_head_dim,
                                                a.linear_value_head_dim, a.linear_conv_kernel_dim))


def _check_mamba(role: RoleConfig, path: str, tp: int, problems: list[str]) -> None:
    """Granite 4.0-H's Mamba-2 layers: one 0 / 1 per layer, not beside Gated DeltaNet ones, their sizes set, TP
    dividing the heads."""
    from mindspeed_rl.models.mamba_layout import KEYS

    a = role.arch
    if any(a.linear_attention_layers or ()) and isinstance(a.mamba_layers, (list, tuple)) and any(a.mamba_layers):
        problems.append(f"model {role.model_name}: mamba_layers and linear_attention_layers are both set; a model "
                        f"mixes tokens with one kind of linear layer (Granite 4.0-H: Mamba-2, Qwen3.5: Gated DeltaNet).")
        return
    _check_mixer_layers(role, path, tp, problems, "mamba_layers", "Mamba-2", KEYS, _mamba_shape)


def _check_short_conv(role: RoleConfig, path: str, tp: int, problems: list[str]) -> None:
    """LFM2's short-convolution layers (models/short_conv.py): one 0 / 1 per layer, no other kind of non-attention
    layer beside them, TP dividing hidden_size (their channels)."""
    a = role.arch
    if not _marked(role, "short_conv_layers", problems):
        return
    others = [k for k in ("mamba_layers", "linear_attention_layers", "hybrid_override_pattern", "parallel_hybrid")
              if getattr(a, k) not in (None, [], "", False) and (not isinstance(getattr(a, k), list) or any(getattr(a, k)))]
    if others:
        problems.append(f"model {role.model_name}: short_conv_layers (LFM2's conv layers) cannot go with "
                        f"{', '.join(others)}; a model mixes tokens with one kind of layer beside attention.")
        return
    if a.hidden_size and a.hidden_size % tp:
        problems.append(f"`{path}`: model {role.model_name}: tensor_model_parallel_size {tp} does not divide hidden_size "
                        f"{a.hidden_size} (the conv layers are split over TP by channels): use a TP size that divides it.")
