"""Gemma 4's config.json (gemma4_text: Gemma4ForCausalLM; `gemma4`, Gemma4ForConditionalGeneration, its text model:
hf_config.text_model_config) in Megatron names, and back (no megatron import: the driver reads it while validating).

Gemma 4's layers are Gemma 3's (sandwich norms, GeGLU, q / k norms, embeddings x sqrt(hidden), sliding layers with
their own default RoPE, the final logits soft-capped) with these differences (models/gemma4.py builds them):

- its RMSNorms scale by their weight, not (1 + weight) (Gemma 4's Gemma4RMSNorm): megatron's norms;
- the full-attention layers have a head dimension (global_head_dim, 512) and key / value heads
  (num_global_key_value_heads) of their own: kv_channels / num_query_groups here are the full layers', and
  sliding_kv_channels / sliding_num_query_groups the sliding layers' (config.json's head_dim / num_key_value_heads).
  transformers 5.24 writes them as `per_layer_config` ({layer: {head_dim, num_key_value_heads}} for the full
  layers), the releases as global_head_dim / num_global_key_value_heads; both are read;
- attention_k_eq_v: the full layers have no v_proj, their values are k_proj's output (before k_norm);
- every value head is normalised by an RMSNorm without weight (v_norm: value_norm);
- the attention scores are not scaled (scaling 1: softmax_scale 1);
- each layer's output is multiplied by its layer_scalar (a buffer in the checkpoint);
- the full layers' RoPE is "proportional": the first partial_rotary_factor of each head's frequency pairs rotate at
  the default frequencies of the whole head dimension, pairs (i, i + head_dim / 2) as every pair; the others do not
  (rope_scaling_type proportional, rope_proportion).

26B-A4B's MoE block (enable_moe_block: a dense MLP and experts side by side in every layer) is moe_dense_beside
(models/gemma4.Gemma4MoE). E2B / E4B's per-layer input embeddings (hidden_size_per_layer_input: per_layer_input_size,
vocab_size_per_layer_input: per_layer_input_vocab_size), their last layers reading an earlier layer's keys and values
(num_kv_shared_layers) and those layers' MLPs twice as wide (use_double_wide_mlp: kv_shared_double_mlp) are
models/gemma4.py's PerLayerInputs and kv sharing. Refused in one sentence: bidirectional attention.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

# transformers' Gemma4TextConfig defaults where config.json leaves a key out (global_head_dim is popped by its
# __post_init__, 512 when absent)
GEMMA4_DEFAULTS = {"head_dim": 256, "global_head_dim": 512, "sliding_window": 512, "rms_norm_eps": 1e-6,
                   "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                   "hidden_size_per_layer_input": 256, "max_position_embeddings": 131072}
GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}


def gemma4_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A Gemma 4 text config.json as the generic reader (hf_config.model_config_from_hf) reads a model: head_dim /
    num_key_value_heads are the full-attention layers', rope_parameters their RoPE at its theta (the proportion kept
    apart in `_gemma4`, with the sliding layers' sizes and theta). ValueError for what is not supported."""
    hf = {**hf, **{k: v for k, v in GEMMA4_DEFAULTS.items() if hf.get(k) is None}}
    if hf.get("use_bidirectional_attention"):
        raise ValueError(f"config.json use_bidirectional_attention={hf['use_bidirectional_attention']!r} "
                         f"(bidirectional attention) is not supported for gemma4_text; its causal language models "
                         f"(31B, 26B-A4B, E4B, E2B) attend causally.")
    missing = [k for k in ("num_experts", "top_k_experts", "moe_intermediate_size") if not hf.get(k)]
    if hf.get("enable_moe_block") and missing:
        raise ValueError(f"config.json enable_moe_block=true needs {', '.join(missing)} (Gemma 4 26B-A4B: 128, 8, 704).")
    if hf.get("attention_bias"):
        raise ValueError("config.json attention_bias=true is not supported for gemma4_text; its releases have none.")
    num_layers = int(hf["num_hidden_layers"])
    types = list(hf.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                           for i in range(num_layers)])
    if types and types[-1] != "full_attention":  # transformers forces it (with a warning)
        types[-1] = "full_attention"
    shared = int(hf.get("num_kv_shared_layers") or 0)
    first_shared = num_layers - shared
    if shared and (shared >= num_layers or not set(types[first_shared:]) <= set(types[:first_shared])):
        raise ValueError(f"config.json num_kv_shared_layers={shared} leaves no earlier layer of every attention type "
                         f"the last {shared} of {num_layers} layers read their keys and values from "
                         f"({sorted(set(types[first_shared:]) - set(types[:first_shared])) or 'no layer left'}); "
                         f"Gemma 4 E2B shares the last 20 of 35.")
    heads = int(hf["num_attention_heads"])
    sliding_groups = int(hf.get("num_key_value_heads") or heads)
    sliding_dim = int(hf["head_dim"])
    full_dim, full_groups = _full_layer_sizes(hf, types, sliding_dim, sliding_groups)
    rope = hf.get("rope_parameters") or GEMMA4_ROPE
    full, local = dict(rope.get("full_attention") or {}), dict(rope.get("sliding_attention") or {})
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"config.json rope_parameters.sliding_attention rope_type {local['rope_type']!r} is not "
                         f"supported; Gemma 4's sliding layers rotate with the default rope.")
    full_type = full.get("rope_type", "default")
    if full_type not in ("default", "proportional") or full.get("factor", 1.0) not in (1, 1.0):
        raise ValueError(f"config.json rope_parameters.full_attention {full!r} is not supported; Gemma 4's full "
                         f"layers rotate with the proportional or the default rope, without a factor.")
    proportion = float(full.get("partial_rotary_factor", 1.0)) if full_type == "proportional" else 1.0
    out = {k: v for k, v in hf.items() if k not in ("rope_parameters", "rope_scaling", "partial_rotary_factor")}
    out.update(head_dim=full_dim, num_key_value_heads=full_groups, layer_types=types,
               rope_parameters={"rope_type": "default", "rope_theta": float(full.get("rope_theta", 1000000.0))},
               _gemma4={"sliding_kv_channels": sliding_dim, "sliding_num_query_groups": sliding_groups,
                        "rope_proportion": proportion, "rope_local_base_freq": float(local.get("rope_theta", 10000.0))})
    return out


def _full_layer_sizes(hf: Mapping[str, Any], types: list, sliding_dim: int, sliding_groups: int) -> tuple[int, int]:
    """(head_dim, key / value heads) of the full-attention layers: transformers 5.24's per_layer_config (one entry per
    full layer, all alike, none for a sliding layer), else global_head_dim and, with attention_k_eq_v,
    num_global_key_value_heads (transformers' reading of the releases)."""
    per_layer = hf.get("per_layer_config")
    if per_layer:
        entries = {int(k): dict(v) for k, v in per_layer.items()}
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        odd = sorted(set(entries) - set(full)) or sorted(i for i in full if i not in entries)
        sizes = {(int(e.get("head_dim", sliding_dim)), int(e.get("num_key_value_heads", sliding_groups)))
                 for e in entries.values()}
        extra = sorted({k for e in entries.values() for k in e} - {"head_dim", "num_key_value_heads"})
        if odd or len(sizes) != 1 or extra:
            raise ValueError(f"config.json per_layer_config must give every full_attention layer, and only those, the "
                             f"same head_dim and num_key_value_heads (Gemma 4's layout); it "
                             f"{'covers layers ' + str(odd) + ' otherwise' if odd else 'sets ' + ', '.join(extra) if extra else 'differs between layers'}.")
        return sizes.pop()
    full_groups = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v") else None
    return int(hf["global_head_dim"]), int(full_groups or sliding_groups)


def gemma4_args(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-named args of what gemma4_config read, beyond the generic ones (module docstring)."""
    g = hf["_gemma4"]
    types = hf["layer_types"]
    args = {"swiglu": False, "geglu": True, "post_norm": True, "input_embeds_norm": True, "qk_layernorm": True,
            "value_norm": True, "layer_scalar": True, "softmax_scale": 1.0,
            "attention_k_eq_v": bool(hf.get("attention_k_eq_v")),
            "window_attn_skip_freq": [int(t == "sliding_attention") for t in types],
            "rope_local_base_freq": g["rope_local_base_freq"]}
    if g["rope_proportion"] != 1.0:
        args.update(rope_scaling_type="proportional", rope_proportion=g["rope_proportion"])
    if g["sliding_kv_channels"] != int(hf["head_dim"]):
        args["sliding_kv_channels"] = g["sliding_kv_channels"]
    if g["sliding_num_query_groups"] != int(hf["num_key_value_heads"]):
        args["sliding_num_query_groups"] = g["sliding_num_query_groups"]
    if g["sliding_num_query_groups"] != int(hf["num_attention_heads"]):
        args["group_query_attention"] = True
    window = hf.get("sliding_window")
    if hf.get("enable_moe_block"):  # 26B-A4B: experts beside the dense MLP in every layer (models/gemma4.Gemma4MoE)
        args.update(num_experts=int(hf["num_experts"]), moe_router_topk=int(hf["top_k_experts"]),
                    moe_ffn_hidden_size=int(hf["moe_intermediate_size"]), moe_dense_beside=True)
    if window and int(window) < int(hf.get("max_position_embeddings") or 0):
        args["sliding_window"] = int(window)
    if hf.get("final_logit_softcapping"):
        args["output_logit_softcapping"] = float(hf["final_logit_softcapping"])
    if int(hf.get("hidden_size_per_layer_input") or 0):  # E2B / E4B (models/gemma4.PerLayerInputs)
        args.update(per_layer_input_size=int(hf["hidden_size_per_layer_input"]),
                    per_layer_input_vocab_size=int(hf.get("vocab_size_per_layer_input") or 262144))
    if int(hf.get("num_kv_shared_layers") or 0):  # E2B / E4B: the last layers read an earlier layer's keys / values
        args["num_kv_shared_layers"] = int(hf["num_kv_shared_layers"])
        if hf.get("use_double_wide_mlp"):
            args["kv_shared_double_mlp"] = True
    return args


def layer_attention(args: Mapping[str, Any], layer: int) -> tuple[int, int, bool]:
    """(head dim, key / value heads, values = keys) of layer `layer` (0-based) of Megatron-named args: a sliding layer
    (window_attn_skip_freq; without it every layer when there is a sliding_window) has sliding_kv_channels /
    sliding_num_query_groups where set and its own values; attention_k_eq_v applies to the full layers."""
    from mindspeed_rl.models.hf_config import kv_channels

    heads = int(args["num_attention_heads"])
    groups = int(args.get("num_query_groups") or heads) if args.get("group_query_attention") else heads
    if _sliding(args, layer):
        return int(args.get("sliding_kv_channels") or kv_channels(args)), int(args.get("sliding_num_query_groups") or groups), False
    return kv_channels(args), groups, bool(args.get("attention_k_eq_v"))


def has_layer_shapes(args: Mapping[str, Any]) -> bool:
    """Whether the layers of these args differ in their attention's sizes or values (layer_attention), in whether
    they have keys and values of their own (kv_source) or in their MLP's width (layer_ffn)."""
    return bool(args.get("sliding_kv_channels") or args.get("sliding_num_query_groups") or args.get("attention_k_eq_v")
                or int(args.get("num_kv_shared_layers") or 0))


def _sliding(args: Mapping[str, Any], layer: int) -> bool:
    from mindspeed_rl.models.hf_config import window_pattern

    pattern = window_pattern(args.get("window_attn_skip_freq"), int(args["num_layers"]))
    return bool(pattern[layer]) if pattern is not None else bool(args.get("sliding_window"))


def kv_source(args: Mapping[str, Any], layer: int) -> Optional[int]:
    """The layer (0-based) whose keys and values layer `layer` attends over, None for its own: each of the last
    num_kv_shared_layers layers reads the last earlier layer of its kind (sliding or full; window_attn_skip_freq)
    that has its own (HF's kv_sharing_modes "reuse" / "store"). ValueError where there is none."""
    layers, shared = int(args["num_layers"]), int(args.get("num_kv_shared_layers") or 0)
    first = layers - shared
    if not shared or layer < first:
        return None
    kind = _sliding(args, layer)
    for source in range(first - 1, -1, -1):
        if _sliding(args, source) == kind:
            return source
    raise ValueError(f"num_kv_shared_layers {shared}: layer {layer} ({'sliding' if kind else 'full'} attention) has "
                     f"no earlier layer of its kind to read keys and values from; lower num_kv_shared_layers.")


def layer_ffn(args: Mapping[str, Any], layer: int) -> int:
    """The MLP width of layer `layer`: ffn_hidden_size, twice it in a KV-sharing layer with kv_shared_double_mlp."""
    ffn = int(args.get("ffn_hidden_size") or 4 * int(args["hidden_size"]))
    return 2 * ffn if args.get("kv_shared_double_mlp") and kv_source(args, layer) is not None else ffn


# what only Gemma 4's config.json says
GEMMA4_KEYS = ("value_norm", "layer_scalar", "per_layer_input_size", "num_kv_shared_layers")


def gemma4_export_config(args: Mapping[str, Any], vocab_size: int, dtype) -> dict[str, Any]:
    """Gemma 4's config.json (gemma4_text, Gemma4ForCausalLM; read back the same by gemma4_config) for args with its
    keys (GEMMA4_KEYS); what else the args say is refused in one sentence."""
    from mindspeed_rl.models.hf_export_base import base_config, layer_types_config

    want = {"value_norm": True, "layer_scalar": True, "post_norm": True, "input_embeds_norm": True, "geglu": True,
            "qk_layernorm": True}
    wrong = [k for k, v in want.items() if bool(args.get(k)) != v]
    if int(args.get("num_experts") or 0) > 1 and not args.get("moe_dense_beside"):
        wrong.append("num_experts without moe_dense_beside (Gemma 4's experts sit beside a dense MLP)")
    wrong += [k for k in ("moe_shared_expert_intermediate_size", "moe_router_enable_expert_bias", "moe_router_num_groups",
                          "moe_router_topk_scaling_factor") if args.get(k)]
    freq = args.get("moe_layer_freq")
    if freq not in (None, 1) and not (isinstance(freq, list) and all(freq)):
        wrong.append("moe_layer_freq (Gemma 4's experts are in every layer)")
    if args.get("moe_router_score_function") not in (None, "softmax") or args.get("moe_router_pre_softmax"):
        wrong.append("the router (Gemma 4's: softmax, the top-k renormalised)")
    wrong += [k for k in ("add_rmsnorm_offset", "add_qkv_bias", "no_rope_freq", "attn_logit_softcapping",
                          "qk_layernorm_across_heads", "rotary_interleaved") if args.get(k)]
    wrong += [k for k in ("embedding_multiplier_scale", "residual_multiplier", "output_multiplier_scale",
                          "rotary_percent") if float(args.get(k) or 1.0) != 1.0]
    if float(args.get("softmax_scale") or 0.0) != 1.0:
        wrong.append("softmax_scale (Gemma 4's is 1)")
    if args.get("rope_scaling_type") not in (None, "proportional"):
        wrong.append(f"rope_scaling_type {args['rope_scaling_type']}")
    if wrong:
        raise ValueError(f"{' / '.join(k for k in GEMMA4_KEYS if args.get(k))} ha{'s' if sum(bool(args.get(k)) for k in GEMMA4_KEYS) == 1 else 've'} a config.json form only as Gemma 4 (gemma4_text: "
                         f"{', '.join(want)}, softmax_scale 1, nothing else); this model differs in {', '.join(wrong)}.")
    layers = int(args["num_layers"])
    shapes = [layer_attention(args, i) for i in range(layers)]
    pattern = layer_types_config(args, {"num_hidden_layers": layers,
                                        "max_position_embeddings": int(args.get("max_position_embeddings") or 4096)})
    types = pattern["layer_types"]
    if types[-1] != "full_attention":
        raise ValueError("Gemma 4's last layer attends fully (transformers forces it); window_attn_skip_freq marks it "
                         "sliding.")
    sliding = shapes[types.index("sliding_attention")] if "sliding_attention" in types else shapes[-1]
    full = shapes[-1]
    if not args.get("attention_k_eq_v") and full[1] != sliding[1]:
        raise ValueError(f"Gemma 4's config.json gives the full-attention layers key / value heads of their own only "
                         f"with attention_k_eq_v; these args have {full[1]} there and {sliding[1]} in the sliding ones.")
    full_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(args.get("rotary_base") or 10000.0)}
    if args.get("rope_scaling_type") == "proportional":
        full_rope.update(rope_type="proportional", partial_rotary_factor=float(args["rope_proportion"]))
    config = base_config(args, vocab_size, dtype, "gemma4_text", "Gemma4ForCausalLM", full_rope, eps=1e-6)
    for key in ("rope_theta", "rope_scaling"):
        config.pop(key, None)
    config.update(pattern, head_dim=sliding[0], num_key_value_heads=sliding[1], global_head_dim=full[0],
                  attention_k_eq_v=bool(args.get("attention_k_eq_v")), hidden_activation="gelu_pytorch_tanh",
                  attention_bias=False, hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=False,
                  rope_parameters={"full_attention": full_rope, "sliding_attention": {
                      "rope_type": "default", "rope_theta": float(args.get("rope_local_base_freq") or 10000.0)}},
                  final_logit_softcapping=(float(args["output_logit_softcapping"])
                                           if args.get("output_logit_softcapping") else None))
    if args.get("attention_k_eq_v"):
        config["num_global_key_value_heads"] = full[1]
    if args.get("per_layer_input_size"):  # E2B / E4B (models/gemma4.PerLayerInputs)
        config.update(hidden_size_per_layer_input=int(args["per_layer_input_size"]),
                      vocab_size_per_layer_input=int(args["per_layer_input_vocab_size"]))
    if int(args.get("num_kv_shared_layers") or 0):
        config.update(num_kv_shared_layers=int(args["num_kv_shared_layers"]),
                      use_double_wide_mlp=bool(args.get("kv_shared_double_mlp")))
    if args.get("moe_dense_beside"):
        config.update(enable_moe_block=True, num_experts=int(args["num_experts"]),
                      top_k_experts=int(args.get("moe_router_topk") or 2),
                      moe_intermediate_size=int(args.get("moe_ffn_hidden_size") or args["ffn_hidden_size"]))
    return config
