"""Checks of a role's Gemma 4 keys (models/gemma4.py; config/validate.py runs them before any worker starts): the
two layer shapes of 31B / 26B-A4B, and E2B / E4B's per-layer inputs and KV sharing. Each problem one sentence naming
the key and the fix."""
from __future__ import annotations


def gemma4_problems(role, path: str, tp: int, pp: int) -> list[str]:
    """Every problem of the role's Gemma 4 keys (`path`: the role's yaml path; tp / pp: its TP and PP sizes)."""
    return _layer_shape_problems(role) + _per_layer_problems(role, path, tp, pp)


def _layer_shape_problems(role) -> list[str]:
    """Gemma 4's keys (models/gemma4.py): the sliding layers' own sizes need window_attn_skip_freq to name them and,
    with their own head dimension, their own rotary table; proportional RoPE needs its proportion (its range:
    config/ranges.py); experts beside the dense MLP need experts."""
    a, m, problems = role.arch, f"model {role.model_name}", []
    if (a.sliding_kv_channels or a.sliding_num_query_groups) and not isinstance(a.window_attn_skip_freq, (list, int)):
        problems.append(f"{m}: sliding_kv_channels / sliding_num_query_groups size the sliding-window layers, which "
                        f"window_attn_skip_freq names; set it (a list, 1 = sliding) or drop them.")
    if a.sliding_kv_channels and not a.rope_local_base_freq:
        problems.append(f"{m}: sliding_kv_channels {a.sliding_kv_channels} needs rope_local_base_freq: the sliding "
                        f"layers rotate with a table of their own head dimension (Gemma 4: 10000).")
    if (a.rope_scaling_type == "proportional") != (a.rope_proportion is not None):
        problems.append(f"{m}: rope_scaling_type proportional and rope_proportion go together (Gemma 4: proportional, "
                        f"0.25); set both or neither.")
    if a.moe_dense_beside and (a.num_experts or 0) <= 1:
        problems.append(f"{m}: moe_dense_beside puts experts beside each layer's dense MLP, but num_experts is "
                        f"{a.num_experts}; set num_experts (Gemma 4 26B-A4B: 128) or drop moe_dense_beside.")
    return problems


def _per_layer_problems(role, path: str, tp: int, pp: int) -> list[str]:
    """Gemma 4 E2B / E4B's keys (models/gemma4.py): the per-layer input table's rows (split over TP), the KV-sharing
    layers' sources. Both read what an earlier part of the model computed in the same forward, so they need the whole
    model on one pipeline rank; KV sharing also needs the layers that read and the one that computed the keys in one
    backward (no full recompute, which recomputes layers apart)."""
    a, m, p, problems = role.arch, f"model {role.model_name}", role.parallel, []
    ple, shared = a.per_layer_input_size, a.num_kv_shared_layers or 0
    if ple and not a.per_layer_input_vocab_size:
        problems.append(f"{m}: per_layer_input_size {ple} needs per_layer_input_vocab_size, the rows of its table "
                        f"(Gemma 4: 262144); set it or drop per_layer_input_size.")
    if a.per_layer_input_vocab_size and not ple:
        problems.append(f"{m}: per_layer_input_vocab_size is set without per_layer_input_size; set both (Gemma 4 "
                        f"E2B: 256 and 262144) or neither.")
    if ple and a.per_layer_input_vocab_size and a.per_layer_input_vocab_size % tp:
        problems.append(f"`{path}.tensor_model_parallel_size: {tp}` does not divide per_layer_input_vocab_size "
                        f"{a.per_layer_input_vocab_size} of {m} (its rows are split over TP); pick a TP that divides it.")
    if a.kv_shared_double_mlp and not shared:
        problems.append(f"{m}: kv_shared_double_mlp widens the MLPs of the num_kv_shared_layers layers, but "
                        f"num_kv_shared_layers is 0; set it (Gemma 4 E2B: 20) or drop kv_shared_double_mlp.")
    if not (ple or shared):
        return problems
    what = " and ".join(w for w, on in (("per_layer_input_size", ple), ("num_kv_shared_layers", shared)) if on)
    vpp = p.virtual_pipeline_model_parallel_size or 1
    if pp > 1 or vpp > 1 or p.num_layers_per_virtual_pipeline_stage:
        problems.append(f"`{path}.pipeline_model_parallel_size: {pp}` with {what} of {m} is not supported: its "
                        f"layers read what the embedding{' / an earlier layer' if shared else ''} computed in the same "
                        f"forward; use pipeline_model_parallel_size 1 (Gemma 4 E2B / E4B fit with TP and DP).")
    if shared and (p.recompute_granularity == "full"):
        problems.append(f"`{path}.recompute_granularity: full` with num_kv_shared_layers of {m} is not supported: a "
                        f"layer recomputed apart from the one whose keys it reads cannot pass their gradient back; "
                        f"use recompute_granularity: selective or none.")
    others = [k for k in ("multi_latent_attention", "linear_attention_layers", "mamba_layers", "short_conv_layers",
                          "hybrid_override_pattern", "parallel_hybrid") if _set(getattr(a, k, None))]
    if others:
        problems.append(f"{m}: {what} {'is' if ' and ' not in what else 'are'} supported with Gemma 4's attention "
                        f"layers only, not with {', '.join(others)}; drop one of them.")
    if shared and a.num_layers:
        from mindspeed_rl.models.hf_gemma4_config import kv_source

        args = {"num_layers": a.num_layers, "num_kv_shared_layers": shared, "sliding_window": a.sliding_window,
                "window_attn_skip_freq": a.window_attn_skip_freq}
        try:
            if shared >= a.num_layers:
                raise ValueError(f"num_kv_shared_layers {shared} leaves no layer of {a.num_layers} with keys and "
                                 f"values of its own; lower it (Gemma 4 E2B: 20 of 35).")
            for layer in range(a.num_layers - shared, a.num_layers):
                kv_source(args, layer)
        except ValueError as err:
            problems.append(f"{m}: {err}")
    return problems


def _set(value) -> bool:
    """A key that turns a feature on: true, a non-empty pattern, a list with a 1 in it."""
    return any(value) if isinstance(value, (list, tuple)) else bool(value)
