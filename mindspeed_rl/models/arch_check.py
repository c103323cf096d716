"""A model yaml against the config.json of the HF checkpoint it loads.

When `load:` is a HF directory the architecture can come from its config.json alone; a model
yaml may still set keys (MindSpeed's shipped yamls set them all). A key the yaml sets must agree
with config.json, else the weights would not fit (or would silently compute something else):

    check_arch_against_hf({"num_layers": 28, ...}, hf_dir, "qwen25-7b")
    -> UserInputError: model.qwen25-7b.num_layers is 28 but config.json in DIR says 24
       (num_hidden_layers); fix the model yaml or drop the key to take it from config.json.

Only the keys the user set are compared: the loader records them (RoleConfig.arch_set, from the
composed yaml and the overrides) so a schema default is never mistaken for a user's choice.
`resolve_arch` gives config.json's architecture with the user-set keys on top, and
`check_shapes_against_safetensors` holds the result against the safetensors headers (shapes only,
no weight is read), so a mismatch fails in validation (and dry_run), not after Ray started.
`arch_from_hf_or_yaml` returns the yaml keys plus every architecture key it leaves out. Compared: everything that changes the weights or the math. Not compared:
max_position_embeddings (a run's length limit; filled when missing) and padded_vocab_size, which may exceed
config.json's vocab_size (megatron pads the vocabulary) but must not be smaller.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping, Optional

from mindspeed_rl.models import hybrid_pattern
from mindspeed_rl.models.hf_bridge.loader import read_hf_config
from mindspeed_rl.models.hf_bridge.mapping import gated_mlp
from mindspeed_rl.models.hf_bridge.sharding import moe_layers
from mindspeed_rl.models.hf_config import kv_channels
from mindspeed_rl.models.hf_gemma4_config import has_layer_shapes, kv_source, layer_attention, layer_ffn
from mindspeed_rl.models.hf_moe_config import mtp_layer_count
from mindspeed_rl.utils.errors import UserInputError

# Megatron key -> config.json key, for the message
_HF_KEY = {
    "num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads", "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim", "rotary_base": "rope_theta", "norm_epsilon": "rms_norm_eps",
    "add_qkv_bias": "model_type / attention_bias", "qk_layernorm": "model_type",
    "untie_embeddings_and_output_weights": "tie_word_embeddings", "swiglu": "hidden_act",
    "disable_bias_linear": "mlp_bias / attention_bias",
    "normalization": "model_type", "position_embedding_type": "model_type",
    "rope_scaling_type": "rope_scaling", "rope_scaling_factor": "rope_scaling.factor",
    "low_freq_factor": "rope_scaling.low_freq_factor", "high_freq_factor": "rope_scaling.high_freq_factor",
    "original_max_position_embeddings": "rope_scaling.original_max_position_embeddings",
    "num_experts": "num_experts", "moe_router_topk": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob",
    "moe_shared_expert_intermediate_size": "shared_expert_intermediate_size", "shared_expert_gate": "model_type",
    "rotary_percent": "partial_rotary_factor", "rope_short_factor": "rope_scaling.short_factor",
    "rope_attention_factor": "rope_scaling.attention_factor",
    "rope_scaling_beta_fast": "rope_scaling.beta_fast", "rope_scaling_beta_slow": "rope_scaling.beta_slow",
    "rope_scaling_mscale": "rope_scaling.mscale", "rope_scaling_mscale_all_dim": "rope_scaling.mscale_all_dim",
    "rope_scaling_truncate": "rope_scaling.truncate", "no_rope_freq": "no_rope_layers (inverted)",
    "sliding_window": "sliding_window", "embedding_multiplier_scale": "embedding_multiplier",
    "residual_multiplier": "residual_multiplier", "output_multiplier_scale": "1 / logits_scaling",
    "softmax_scale": "attention_multiplier / query_pre_attn_scalar^-1/2",
    "window_attn_skip_freq": "layer_types / sliding_window_pattern", "rope_local_base_freq": "rope_local_base_freq",
    "geglu": "hidden_activation", "add_rmsnorm_offset": "model_type", "apply_layernorm_1p": "model_type",
    "layernorm_bias": "model_type", "layernorm_affine": "model_type", "embedding_norm": "model_type",
    "rotary_negated": "model_type", "clip_qkv": "clip_qkv", "parallel_residual": "model_type / use_parallel_residual",
    "parallel_residual_mlp_norm": "model_type / use_parallel_residual", "add_output_layer_bias": "model_type",
    "post_norm": "model_type",
    "input_embeds_norm": "model_type", "attn_logit_softcapping": "attn_logit_softcapping",
    "output_logit_softcapping": "final_logit_softcapping", "pre_norm": "model_type",
    "qk_layernorm_across_heads": "model_type", "qk_layernorm_after_rope": "model_type", "rotary_interleaved": "model_type", "squared_relu": "hidden_act", "xielu": "hidden_act",
    "openai_gelu": "hidden_act", "moe_layer_freq": "first_k_dense_replace", "moe_router_score_function": "model_type",
    "moe_router_enable_expert_bias": "model_type", "moe_router_num_groups": "n_group",
    "moe_router_group_topk": "topk_group", "moe_router_topk_scaling_factor": "routed_scaling_factor",
    "quick_geglu": "model_type", "glu_linear_offset": "model_type", "softmax_type": "model_type",
    "activation_func_clamp_value": "swiglu_limit",
    "multi_latent_attention": "model_type", "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_nope_head_dim", "qk_pos_emb_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim",
    "per_layer_input_size": "hidden_size_per_layer_input", "per_layer_input_vocab_size": "vocab_size_per_layer_input",
    "num_kv_shared_layers": "num_kv_shared_layers", "kv_shared_double_mlp": "use_double_wide_mlp",
}
# the config.json keys of the models that name them otherwise (Llama's in _HF_KEY), for the message
_HF_KEY_OF = {
    "falcon": {"num_query_groups": "num_kv_heads / multi_query", "ffn_hidden_size": "ffn_hidden_size",
               "norm_epsilon": "layer_norm_epsilon", "parallel_residual": "parallel_attn / new_decoder_architecture",
               "parallel_residual_mlp_norm": "new_decoder_architecture / num_ln_in_parallel_attn",
               "untie_embeddings_and_output_weights": "tie_word_embeddings", "disable_bias_linear": "bias"},
    "gpt_neox": {"norm_epsilon": "layer_norm_eps", "rotary_percent": "rotary_pct / partial_rotary_factor",
                 "rotary_base": "rotary_emb_base / rope_theta"},
}
for _kind in ("stablelm", "cohere", "cohere2", "phi"):
    _HF_KEY_OF[_kind] = {"norm_epsilon": "layer_norm_eps"}
_HF_KEY_OF.update(starcoder2={"norm_epsilon": "norm_epsilon"}, nemotron={"norm_epsilon": "norm_eps"})

# what a config.json without the key means (not Granite: no multiplier)
_HF_DEFAULTS = {"embedding_multiplier_scale": 1.0, "residual_multiplier": 1.0, "output_multiplier_scale": 1.0,
                "geglu": False, "add_rmsnorm_offset": False, "apply_layernorm_1p": False, "layernorm_bias": True,
                "layernorm_affine": True, "embedding_norm": False, "rotary_negated": False,
                "parallel_residual": False, "parallel_residual_mlp_norm": False, "add_output_layer_bias": False, "post_norm": False, "input_embeds_norm": False,
                "pre_norm": True, "qk_layernorm_across_heads": False, "qk_layernorm_after_rope": False,
                "rotary_interleaved": False,
                "squared_relu": False, "xielu": False, "openai_gelu": False, "moe_layer_freq": 1, "moe_router_score_function": "softmax",
                "moe_router_enable_expert_bias": False, "multi_latent_attention": False,
                "moe_router_topk_scaling_factor": 1.0, "quick_geglu": False, "glu_linear_offset": 0.0,
                "softmax_type": "vanilla", "num_kv_shared_layers": 0, "kv_shared_double_mlp": False}  # routed_scaling_factor 1 is read as no scale
# keys a config.json without them leaves at their meaning-free default: a user value is not a contradiction
_ROPE_DETAILS = ("rope_scaling_factor", "low_freq", "high_freq", "original_max", "rope_scaling_beta", "rope_scaling_mscale",
                 "rope_scaling_truncate", "rope_attention_factor")


def hf_arch(hf_dir: str, config: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Megatron-named architecture of a HF checkpoint directory (unsupported features: one sentence);
    `config`: its config.json when already read."""
    from mindspeed_rl.models.hf_config import model_config_from_hf

    config = read_hf_config(hf_dir) if config is None else config
    try:
        return model_config_from_hf(config)
    except ValueError as err:
        raise UserInputError(f"{os.path.join(hf_dir, 'config.json')}: {err}") from None


def _effective(args: Mapping[str, Any], key: str, user_set=None) -> Any:
    """The value a key means, with the builder's defaults (num_query_groups without GQA = heads).
    A num_query_groups the user set without saying group_query_attention means the KV heads."""
    if key in ("no_rope_freq", "window_attn_skip_freq", "moe_layer_freq"):  # an int N and its list of 0 / 1 per layer mean the same
        from mindspeed_rl.models.hf_config import no_rope_pattern, window_pattern
        from mindspeed_rl.models.hf_moe_config import moe_layer_pattern
        layers = int(args.get("num_layers") or 0)
        try:
            pattern = {"no_rope_freq": no_rope_pattern, "window_attn_skip_freq": window_pattern,
                       "moe_layer_freq": moe_layer_pattern}[key]
            value = args.get(key, 1 if key == "moe_layer_freq" else None)
            return pattern(value, layers) if layers and value is not None else value
        except ValueError:
            return args.get(key)
    if key == "num_query_groups":
        if user_set is not None and key in user_set and "group_query_attention" not in user_set:
            return args.get(key)
        if not args.get("group_query_attention"):
            return args.get("num_attention_heads")
        return args.get("num_query_groups")
    return args.get(key)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, str) and isinstance(b, (int, float)):  # "1e-6": YAML 1.1 reads it as a string
        try:
            a = float(a)
        except ValueError:
            return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        # config.json written from a float32 (GGUF, some exporters: 9.999999747e-06) is the same 1e-5
        return math.isclose(float(a), float(b), rel_tol=1e-6)
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


def check_arch_against_hf(model_args: Mapping[str, Any], hf_dir: str, model_name: Optional[str] = None,
                          user_set: Optional[Mapping[str, str]] = None) -> None:
    """Raise UserInputError naming the first key the user set that config.json contradicts.

    Args:
        model_args: Megatron-named architecture (the user's keys, or the resolved architecture).
        hf_dir: the HF checkpoint directory `load:` points at.
        model_name: the yaml's model name, for the message (model.<name>.<key>) when user_set is None.
        user_set: key -> yaml path of the keys the user set (RoleConfig.arch_set); only these are
            compared. None: every non-null key of model_args counts as set.
    """
    config = read_hf_config(hf_dir)
    hf, named = hf_arch(hf_dir, config), {**_HF_KEY, **_HF_KEY_OF.get(config.get("model_type"), {})}
    if user_set is None:
        prefix = f"model.{model_name}" if model_name else "model"
        user_set = {k: f"{prefix}.{k}" for k, v in model_args.items() if v is not None}
    where = f"config.json in {hf_dir}"
    for key, hf_key in named.items():
        label = key
        if key == "num_query_groups" and key not in user_set and "group_query_attention" in user_set:
            label = "group_query_attention"  # false means num_query_groups = num_attention_heads
        elif key not in user_set:
            continue
        ours, theirs = _effective(model_args, key, user_set), _effective(hf, key)
        theirs = _HF_DEFAULTS.get(key) if theirs is None else theirs
        if ours is None:
            continue
        if theirs is None:  # e.g. rope_scaling_factor set while config.json has no rope scaling
            if key.startswith(_ROPE_DETAILS) and (not hf.get("rope_scaling_type") or key.startswith(
                    ("rope_scaling_mscale", "rope_attention_factor"))):
                continue
            theirs = "nothing"
        if not _same(ours, theirs):
            shown = model_args[label] if label != key else ours
            path = user_set[label]
            fix = ("fix the model yaml or drop the key" if path.startswith("model")
                   else f"fix `{path}` or drop it")
            raise UserInputError(f"{path} is {shown} but {where} says {theirs} ({hf_key}); "
                                 f"{fix} to take it from config.json.")
    padded = model_args.get("padded_vocab_size") if "padded_vocab_size" in user_set else None
    if padded is not None and int(padded) < hf["padded_vocab_size"]:
        raise UserInputError(f"{user_set['padded_vocab_size']} is {padded} but {where} says vocab_size "
                             f"{hf['padded_vocab_size']}; set it to at least that or drop the key.")


def resolve_arch(arch: Mapping[str, Any], user_set, hf_dir: str) -> dict[str, Any]:
    """config.json's architecture with the user-set keys of `arch` on top; keys config.json does
    not describe (dropout, init std, rotary_percent, ...) keep their value from `arch`."""
    out = dict(arch)
    for key, value in hf_arch(hf_dir).items():
        if key not in user_set:
            out[key] = value
    return out


def expected_hf_shapes(args: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """HF tensor name (canonical: hf_bridge/names.py) -> (shape, which keys imply it) for a Llama /
    Mistral / Phi-3 / Qwen2 / Qwen3(-MoE) / Qwen2-MoE / Mixtral architecture."""
    h, heads, ffn = int(args["hidden_size"]), int(args["num_attention_heads"]), int(args["ffn_hidden_size"])
    d = kv_channels(args)
    groups = int(_effective(args, "num_query_groups") or heads)
    q, kv = heads * d, groups * d
    why_q = f"num_attention_heads {heads} x kv_channels {d}"
    why_kv = f"num_query_groups {groups} x kv_channels {d}"
    shapes = {"model.norm.weight": ((h,), f"hidden_size {h}")} if args.get("layernorm_affine", True) is not False else {}
    if args.get("per_layer_input_size"):  # Gemma 4 E2B / E4B's per-layer inputs (models/gemma4.PerLayerInputs)
        size, layers = int(args["per_layer_input_size"]), int(args["num_layers"])
        vocab = int(args["per_layer_input_vocab_size"])
        why = f"per_layer_input_size {size} x num_layers {layers}"
        shapes.update({"model.embed_tokens_per_layer.weight": ((vocab, layers * size),
                                                               f"per_layer_input_vocab_size {vocab}, {why}"),
                       "model.per_layer_model_projection.weight": ((layers * size, h), f"{why}, hidden_size {h}"),
                       "model.per_layer_projection_norm.weight": ((size,), f"per_layer_input_size {size}")})
    moe = moe_layers(args)
    linear = list(args.get("linear_attention_layers") or ())
    mamba = list(args.get("mamba_layers") or ())  # Granite 4.0-H's Mamba-2 layers: no attention tensors either
    conv = list(args.get("short_conv_layers") or ())  # LFM2's conv layers: nor these
    n = max(len(linear), len(mamba), len(conv))
    linear = [int(any(i < len(m) and bool(m[i]) for m in (linear, mamba, conv))) for i in range(n)]
    own_gate = bool(args.get("attention_output_gate") and args.get("attention_gate_proj"))  # AFMoE: its gate_proj
    gate = 2 if args.get("attention_output_gate") and not own_gate else 1  # Qwen3.5: q_proj holds each head's query and gate
    pattern = hybrid_pattern.pattern_of(args)  # Nemotron-H: one block per layer, the other half absent
    shaped = has_layer_shapes(args)  # Gemma 4: the sliding and full layers' own sizes (hf_gemma4_config.layer_attention)
    for i in range(int(args["num_layers"])):
        p = f"model.layers.{i}."
        before = set(shapes)
        k_eq_v, shared, layer_ffn_size = False, False, ffn
        if shaped:
            d, groups, k_eq_v = layer_attention(args, i)
            q, kv = heads * d, groups * d
            why_q = f"num_attention_heads {heads} x this layer's head dimension {d}"
            why_kv = f"this layer's key / value heads {groups} x {d}"
            shared = kv_source(args, i) is not None  # Gemma 4 E2B: q_proj alone (k / v / k_norm, if stored: unread)
            layer_ffn_size = layer_ffn(args, i)
        if args.get("per_layer_input_size"):  # Gemma 4 E2B / E4B's per-layer gate, projection and norm
            size, why = int(args["per_layer_input_size"]), f"per_layer_input_size {args['per_layer_input_size']}"
            shapes.update({p + "per_layer_input_gate.weight": ((size, h), f"{why}, hidden_size {h}"),
                           p + "per_layer_projection.weight": ((h, size), f"hidden_size {h}, {why}"),
                           p + "post_per_layer_input_norm.weight": ((h,), f"hidden_size {h}")})
        if args.get("layer_scalar"):
            shapes[p + "layer_scalar"] = ((1,), "layer_scalar")
        if i < len(mamba) and mamba[i]:
            shapes.update(_mamba_shapes(args, p, h))
        elif i < len(conv) and conv[i]:
            shapes.update(_short_conv_shapes(args, p, h))
        elif i < len(linear) and linear[i]:
            shapes.update(_delta_net_shapes(args, p, h))
        elif args.get("multi_latent_attention"):
            shapes.update(_mla_shapes(args, p, h, heads))
        else:
            shapes.update({
                p + "self_attn.q_proj.weight": ((gate * q, h), ("attention_output_gate: 2 x " if gate == 2 else "")
                                                + f"{why_q}, hidden_size {h}"),
                **({} if shared else {p + "self_attn.k_proj.weight": ((kv, h), f"{why_kv}, hidden_size {h}")}),
                **({} if k_eq_v or shared else {p + "self_attn.v_proj.weight": ((kv, h), f"{why_kv}, hidden_size {h}")}),
                **({p + "self_attn.gate_proj.weight": ((q, h), f"attention_gate_proj, {why_q}, hidden_size {h}")}
                   if own_gate else {}),
            })
        if not (i < len(linear) and linear[i]):
            shapes[p + "self_attn.o_proj.weight"] = ((h, q), f"hidden_size {h}, {why_q}")
        if args.get("pre_norm", True) is not False and args.get("layernorm_affine", True) is not False:  # OLMo 2 / 1
            shapes[p + "input_layernorm.weight"] = ((h,), f"hidden_size {h}")
            # Cohere's one norm before attention and MLP together (GPT-NeoX: one each)
            if not args.get("parallel_residual") or args.get("parallel_residual_mlp_norm"):
                shapes[p + "post_attention_layernorm.weight"] = ((h,), f"hidden_size {h}")
        shapes.update(_mlp_shapes(args, p, h, layer_ffn_size, moe[i]))
        if args.get("add_qkv_bias"):
            for name, n, why in (("q", q, why_q), ("k", kv, why_kv), ("v", kv, why_kv)):
                shapes[p + f"self_attn.{name}_proj.bias"] = ((n,), f"add_qkv_bias, {why}")
        if i < len(linear) and linear[i]:  # no q / k norms, sinks or attention biases in a Gated DeltaNet / Mamba-2 layer
            pass
        elif args.get("qk_layernorm") and args.get("qk_layernorm_across_heads"):  # OLMo 2: all heads
            shapes[p + "self_attn.q_norm.weight"] = ((q,), f"qk_layernorm_across_heads, {why_q}")
            shapes[p + "self_attn.k_norm.weight"] = ((kv,), f"qk_layernorm_across_heads, {why_kv}")
        elif args.get("qk_layernorm") and not args.get("multi_latent_attention") and \
                args.get("layernorm_affine", True) is not False:  # (nanochat's q / k norms have no weights)
            for name in ("q_norm",) if shared else ("q_norm", "k_norm"):
                shapes[p + f"self_attn.{name}.weight"] = ((d,), f"qk_layernorm, kv_channels {d}")
        if args.get("post_norm"):  # Gemma's (canonical names: hf_bridge/names.py)
            for name in ("post_self_attn_layernorm", "post_feedforward_layernorm"):
                shapes[p + f"{name}.weight"] = ((h,), f"post_norm, hidden_size {h}")
        if args.get("softmax_type") == "learnable":  # gpt-oss's sinks
            shapes[p + "self_attn.sinks"] = ((heads,), f"softmax_type learnable, num_attention_heads {heads}")
        if args.get("disable_bias_linear", True) is False:  # gpt-oss: o_proj's bias, the router's, the experts'
            shapes.update(_bias_shapes(args, p, h, ffn, moe[i]))
        for name in set(shapes) - before if pattern else ():
            if not hybrid_pattern.param_kept(pattern, i, name[len(p):]):
                del shapes[name]
    return shapes


def _short_conv_shapes(args: Mapping[str, Any], p: str, h: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """One LFM2 conv layer's tensors (models/short_conv.py)."""
    kernel = int(args.get("short_conv_kernel") or 3)
    why = f"hidden_size {h}"
    out = {p + "conv.in_proj.weight": ((3 * h, h), f"3 x {why}, {why}"),
           p + "conv.conv.weight": ((h, 1, kernel), f"{why}, short_conv_kernel {kernel}"),
           p + "conv.out_proj.weight": ((h, h), f"{why}, {why}")}
    if args.get("short_conv_bias"):
        out.update({p + "conv.in_proj.bias": ((3 * h,), f"short_conv_bias, 3 x {why}"),
                    p + "conv.conv.bias": ((h,), f"short_conv_bias, {why}"),
                    p + "conv.out_proj.bias": ((h,), f"short_conv_bias, {why}")})
    return out


def _delta_net_shapes(args: Mapping[str, Any], p: str, h: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """One Gated DeltaNet layer's tensors (Qwen3.5's linear_attn; models/delta_layout.py)."""
    from mindspeed_rl.models.delta_layout import DeltaNetShape

    s = DeltaNetShape.from_args(args)
    qk, v = s.key_heads * s.key_head_dim, s.value_heads * s.value_head_dim
    why_qk = f"linear_num_key_heads {s.key_heads} x linear_key_head_dim {s.key_head_dim}"
    why_v = f"linear_num_value_heads {s.value_heads} x linear_value_head_dim {s.value_head_dim}"
    a = p + "linear_attn."
    return {a + "in_proj_qkv.weight": ((2 * qk + v, h), f"2 x {why_qk} + {why_v}, hidden_size {h}"),
            a + "in_proj_z.weight": ((v, h), f"{why_v}, hidden_size {h}"),
            a + "in_proj_b.weight": ((s.value_heads, h), f"linear_num_value_heads {s.value_heads}, hidden_size {h}"),
            a + "in_proj_a.weight": ((s.value_heads, h), f"linear_num_value_heads {s.value_heads}, hidden_size {h}"),
            a + "conv1d.weight": ((2 * qk + v, 1, s.conv_kernel), f"2 x {why_qk} + {why_v}, linear_conv_kernel_dim "
                                                                  f"{s.conv_kernel}"),
            a + "A_log": ((s.value_heads,), f"linear_num_value_heads {s.value_heads}"),
            a + "dt_bias": ((s.value_heads,), f"linear_num_value_heads {s.value_heads}"),
            a + "norm.weight": ((s.value_head_dim,), f"linear_value_head_dim {s.value_head_dim}"),
            a + "out_proj.weight": ((h, v), f"hidden_size {h}, {why_v}")}


def _mamba_shapes(args: Mapping[str, Any], p: str, h: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """One Mamba-2 layer's tensors (Granite 4.0-H's mamba; its in_proj / conv1d by the canonical parts:
    models/mamba_layout.py)."""
    from mindspeed_rl.models.mamba_layout import MambaShape

    s = MambaShape.from_args(args)
    why_x = f"mamba_num_heads {s.heads} x mamba_head_dim {s.head_dim}"
    why_bc = f"2 x mamba_num_groups {s.groups} x mamba_state_dim {s.state}"
    heads = ((s.heads,), f"mamba_num_heads {s.heads}")
    a = p + "mamba."
    out = {a + "in_proj_z.weight": ((s.inner, h), f"{why_x}, hidden_size {h}"),
           a + "in_proj_x.weight": ((s.inner, h), f"{why_x}, hidden_size {h}"),
           a + "in_proj_bc.weight": ((2 * s.groups * s.state, h), f"{why_bc}, hidden_size {h}"),
           a + "in_proj_dt.weight": ((s.heads, h), f"mamba_num_heads {s.heads}, hidden_size {h}"),
           a + "conv1d_x.weight": ((s.inner, 1, s.conv_kernel), f"{why_x}, mamba_conv_kernel {s.conv_kernel}"),
           a + "conv1d_bc.weight": ((2 * s.groups * s.state, 1, s.conv_kernel),
                                    f"{why_bc}, mamba_conv_kernel {s.conv_kernel}"),
           a + "A_log": heads, a + "D": heads, a + "dt_bias": heads,
           a + "norm.weight": ((s.inner,), why_x),
           a + "out_proj.weight": ((h, s.inner), f"hidden_size {h}, {why_x}")}
    if s.conv_bias:
        out.update({a + "conv1d_x.bias": ((s.inner,), why_x), a + "conv1d_bc.bias": ((2 * s.groups * s.state,), why_bc)})
    return out


def _bias_shapes(args: Mapping[str, Any], p: str, h: int, ffn: int, moe: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """One layer's biases of add_bias_linear (disable_bias_linear: false; gpt-oss): o_proj, and in an MoE
    layer the router's and every expert's (canonical names)."""
    out = {p + "self_attn.o_proj.bias": ((h,), f"disable_bias_linear false, hidden_size {h}")}
    if moe:
        experts, f = int(args["num_experts"]), int(args.get("moe_ffn_hidden_size") or ffn)
        out[p + "mlp.gate.bias"] = ((experts,), f"disable_bias_linear false, num_experts {experts}")
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            out.update({q + "gate_proj.bias": ((f,), f"moe_ffn_hidden_size {f}"),
                        q + "up_proj.bias": ((f,), f"moe_ffn_hidden_size {f}"),
                        q + "down_proj.bias": ((h,), f"hidden_size {h}")})
    return out


def _mla_shapes(args: Mapping[str, Any], p: str, h: int, heads: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """One layer's multi-latent attention projections and norms (DeepSeek-V3; canonical names)."""
    q_lora, kv_lora = int(args.get("q_lora_rank") or 0), int(args["kv_lora_rank"])
    nope, rope, v = int(args["qk_head_dim"]), int(args["qk_pos_emb_head_dim"]), int(args["v_head_dim"])
    why_q = f"num_attention_heads {heads} x (qk_head_dim {nope} + qk_pos_emb_head_dim {rope})"
    out = {p + "self_attn.kv_a_proj_with_mqa.weight": ((kv_lora + rope, h), f"kv_lora_rank {kv_lora} + "
                                                      f"qk_pos_emb_head_dim {rope}, hidden_size {h}"),
           p + "self_attn.kv_b_proj.weight": ((heads * (nope + v), kv_lora), f"num_attention_heads {heads} x "
                                              f"(qk_head_dim {nope} + v_head_dim {v}), kv_lora_rank {kv_lora}")}
    if q_lora:
        out.update({p + "self_attn.q_a_proj.weight": ((q_lora, h), f"q_lora_rank {q_lora}, hidden_size {h}"),
                    p + "self_attn.q_b_proj.weight": ((heads * (nope + rope), q_lora), f"{why_q}, q_lora_rank {q_lora}")})
    else:
        out[p + "self_attn.q_proj.weight"] = ((heads * (nope + rope), h), f"{why_q}, hidden_size {h}")
    if args.get("qk_layernorm"):  # MLA's norms
        out[p + "self_attn.kv_a_layernorm.weight"] = ((kv_lora,), f"qk_layernorm, kv_lora_rank {kv_lora}")
        if q_lora:
            out[p + "self_attn.q_norm.weight"] = ((q_lora,), f"qk_layernorm, q_lora_rank {q_lora}")
    return out


def _mlp_shapes(args: Mapping[str, Any], p: str, h: int, ffn: int, moe: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """One layer's MLP tensors: dense gate/up/down, or the router and every expert's (per-expert layout)."""
    experts = int(args.get("num_experts") or 0)
    if not moe:
        out = {p + "mlp.up_proj.weight": ((ffn, h), f"ffn_hidden_size {ffn}, hidden_size {h}"),
               p + "mlp.down_proj.weight": ((h, ffn), f"hidden_size {h}, ffn_hidden_size {ffn}")}
        if gated_mlp(args):  # a plain MLP (Arcee's squared ReLU) has no gate_proj
            out[p + "mlp.gate_proj.weight"] = ((ffn, h), f"ffn_hidden_size {ffn}, hidden_size {h}")
        if args.get("xielu"):  # Apertus's activation scalars (models/xielu.py)
            out.update({p + "mlp.act_fn.alpha_p": ((1,), "xielu"), p + "mlp.act_fn.alpha_n": ((1,), "xielu"),
                        p + "mlp.act_fn.beta": ((), "xielu"), p + "mlp.act_fn.eps": ((), "xielu")})
        return out
    f = int(args.get("moe_ffn_hidden_size") or ffn)
    out = {p + "mlp.gate.weight": ((experts, h), f"num_experts {experts}, hidden_size {h}")}
    if args.get("moe_router_enable_expert_bias"):
        out[p + "mlp.gate.e_score_correction_bias"] = ((experts,), f"moe_router_enable_expert_bias, num_experts {experts}")
    s = int(args.get("moe_shared_expert_intermediate_size") or 0)
    if s:
        why = f"moe_shared_expert_intermediate_size {s}, hidden_size {h}"
        out.update({p + "mlp.shared_expert.up_proj.weight": ((s, h), why),
                    p + "mlp.shared_expert.down_proj.weight": ((h, s), f"hidden_size {h}, moe_shared_expert_intermediate_size {s}")})
        if gated_mlp(args):  # Nemotron-H's shared expert has no gate
            out[p + "mlp.shared_expert.gate_proj.weight"] = ((s, h), why)
        if args.get("shared_expert_gate"):
            out[p + "mlp.shared_expert_gate.weight"] = ((1, h), f"shared_expert_gate, hidden_size {h}")
    for e in range(experts):
        q = f"{p}mlp.experts.{e}."
        out.update({q + "up_proj.weight": ((f, h), f"moe_ffn_hidden_size {f}, hidden_size {h}"),
                    q + "down_proj.weight": ((h, f), f"hidden_size {h}, moe_ffn_hidden_size {f}")})
        if gated_mlp(args):  # nor its experts
            out[q + "gate_proj.weight"] = ((f, h), f"moe_ffn_hidden_size {f}, hidden_size {h}")
    if args.get("moe_dense_beside"):  # Gemma 4 26B-A4B: the dense MLP beside the experts, its norms, the router's scales
        out.update(_mlp_shapes(args, p, h, ffn, 0))
        out.update({p + "router.scale": ((h,), f"moe_dense_beside, hidden_size {h}"),
                    p + "router.per_expert_scale": ((experts,), f"moe_dense_beside, num_experts {experts}"),
                    **{p + f"{n}.weight": ((h,), f"moe_dense_beside, hidden_size {h}") for n in (
                        "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2")}})
    return out


def check_shapes_against_safetensors(args: Mapping[str, Any], hf_dir: str) -> None:
    """Raise UserInputError naming the first tensor whose stored shape (safetensors header, no
    data read) does not fit the architecture, or that is missing, or a layer beyond num_layers."""
    import re

    from mindspeed_rl.models.hf_bridge.checkpoint_io import SafetensorsReader

    reader = SafetensorsReader(hf_dir)
    fix = "the checkpoint does not match the architecture: fix config.json, the keys you set, or the download"
    for name, (shape, why) in expected_hf_shapes(args).items():
        if name not in reader.weight_map:
            raise UserInputError(f"{hf_dir} has no tensor {reader.stored(name)}, which the architecture needs "
                                 f"({why}); {fix}.")
        got = reader.shape(name)
        if got != shape:
            raise UserInputError(f"tensor {reader.stored(name)} in {reader.where(name)} has shape {list(got)}, but "
                                 f"the architecture implies {list(shape)} ({why}); {fix}.")
    h, padded = int(args["hidden_size"]), int(args["padded_vocab_size"])
    heads = ["model.embed_tokens.weight"]
    if args.get("untie_embeddings_and_output_weights"):
        heads.append("lm_head.weight")
    for name in heads:
        if name not in reader.weight_map:
            raise UserInputError(f"{hf_dir} has no tensor {name}; {fix}.")
        got = reader.shape(name)
        if len(got) != 2 or got[1] != h or got[0] > padded:
            raise UserInputError(f"tensor {name} in {reader.where(name)} has shape {list(got)}, but the "
                                 f"architecture implies [<= padded_vocab_size {padded}, hidden_size {h}]; {fix}.")
    layers = {int(m.group(1)) for k in reader.weight_map if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    mtp = mtp_layer_count(read_hf_config(hf_dir))[1]  # GLM-4.5's, MiniMax-M2's, after the last layer: unread
    if layers and max(layers) + 1 not in (int(args["num_layers"]), int(args["num_layers"]) + mtp):
        raise UserInputError(f"{hf_dir} holds {max(layers) + 1} layers but the architecture has num_layers "
                             f"{args['num_layers']}; {fix}.")


def arch_from_hf_or_yaml(model_args: Mapping[str, Any], hf_dir: str, model_name: Optional[str] = None) -> dict[str, Any]:
    """The yaml's keys (checked against config.json) plus the architecture keys it leaves out,
    from config.json. padded_vocab_size defaults to config.json's vocab_size (the embedding rows)."""
    check_arch_against_hf(model_args, hf_dir, model_name)
    out = dict(model_args)
    for key, value in hf_arch(hf_dir).items():
        if out.get(key) is None:
            out[key] = value
    return out


def model_args(role_cfg, vocab_size: int) -> dict:
    """Megatron-named architecture of a role: the model yaml, completed from a HF config.json."""
    args = dataclasses.asdict(role_cfg.arch)
    if role_cfg.load and os.path.isfile(os.path.join(role_cfg.load, "config.json")):
        # the loader resolved this already; again here for a RoleConfig built by hand (idempotent)
        args = resolve_arch(args, role_cfg.arch_set, role_cfg.load)
    args = {k: v for k, v in args.items() if v is not None}
    if not args.get("padded_vocab_size"):
        multiple = args.get("make_vocab_size_divisible_by", 128) * role_cfg.parallel.tensor_model_parallel_size
        args["padded_vocab_size"] = -(-vocab_size // multiple) * multiple
    return args
