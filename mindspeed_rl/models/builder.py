"""Build a megatron-core GPTModel (local layer spec; core attention fused with torch's SDPA, RoPE with
cos/sin once per forward and SwiGLU without a cat in backward where the platform allows,
models/core_attention.py, models/rotary.py and models/swiglu.py) from flat Megatron-named arguments.

    args = model_config_from_hf(json.load(open(f"{hf_dir}/config.json")))   # or a model yaml
    init_parallel_state(tp=2, pp=1, seed=1234)
    model = build_gpt_model(args, params_dtype=torch.bfloat16)

`args` is any mapping with Megatron argument names (the keys of configs/rlxf/model/*.yaml and of
mindspeed_rl.config.schema.ModelArch): num_layers, hidden_size, ffn_hidden_size,
num_attention_heads, group_query_attention / num_query_groups, kv_channels, padded_vocab_size,
max_position_embeddings, rotary_base, rotary_percent, rope_scaling_type ("linear", "llama3", "longrope"
with rope_short_factor, "yarn" with rope_scaling_beta_fast / _beta_slow / _mscale / _mscale_all_dim /
_truncate) with rope_scaling_factor / low_freq_factor / high_freq_factor /
original_max_position_embeddings and rope_attention_factor, no_rope_freq, sliding_window, softmax_scale,
embedding_multiplier_scale / residual_multiplier / output_multiplier_scale, add_qkv_bias,
disable_bias_linear, untie_embeddings_and_output_weights, normalization, norm_epsilon, swiglu,
qk_layernorm, attention_dropout, hidden_dropout, init_method_std; MoE (every layer): num_experts,
moe_router_topk, moe_ffn_hidden_size, norm_topk_prob / moe_router_pre_softmax,
moe_router_load_balancing_type, moe_aux_loss_coeff, moe_token_dispatcher_type, moe_grouped_gemm; gpt-oss's
softmax_type, quick_geglu, glu_linear_offset, activation_func_clamp_value (gpt_oss_fields). Keys this module does not use
(MindSpeed switches, tokenizer settings, ...) are ignored here: validating the vocabulary is the
config package's job. TP/PP/EP/ETP sizes come from megatron's parallel_state.

Departure from megatron-core: GPTModel's llama3 rope scaling only takes the factor (low/high
frequency factors and the original context length are fixed to Llama-3.1's 1/4/8192) and it has
no linear / longrope / yarn for GPT models, so we compute the scaled inverse frequencies
ourselves and set them on the rotary embedding (rotary_inv_freq). The cos / sin scaling of
longrope and yarn (their attention factor) is megatron's softmax_scale when every head dimension
is rotated, else the `rope_mscale` the rotations read (rope_attention_scaling).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Mapping, Optional

import torch
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F

from mindspeed_rl.models.hf_config import ROPE_SCALINGS, kv_channels, no_rope_pattern, window_pattern
from mindspeed_rl.models.hf_gemma4_config import has_layer_shapes
from mindspeed_rl.models.hf_moe_config import moe_layer_pattern
from mindspeed_rl.platform import get_platform, place_model
from mindspeed_rl.platform.base import own_rotary, own_swiglu, sdpa_core_attention

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig  # noqa: E402

from mindspeed_rl.models.core_attention import with_mla_attention, with_sdpa_attention  # noqa: E402
from mindspeed_rl.models.parallel import sequence_parallel_spec  # noqa: E402
from mindspeed_rl.models.rotary import install as install_rotary  # noqa: E402
from mindspeed_rl.models.swiglu import install as install_swiglu  # noqa: E402

_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "padded_vocab_size")

# the process groups our last initialize_model_parallel created (torch registers every new_group
# in its world map, so megatron's destroy_model_parallel, which only forgets them, leaks them)
_OWN_GROUPS: list = []


def destroy_parallel_state() -> int:
    """Forget megatron's parallel state and shut down the process groups init_parallel_state created
    (each gloo group holds 3 threads and its sockets until then: megatron-core 0.16 makes ~20 groups
    per initialisation, and a process re-initialising a hundred times ran 5,700 threads). Local to
    this rank, like torch's destroy_process_group of a subgroup. Returns how many groups the last
    initialisation made (all shut down now: megatron-core 0.16 shuts its DP gloo groups itself)."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    made = len(_OWN_GROUPS)
    live = c10d._world.pg_map if torch.distributed.is_initialized() else {}
    for group in [g for g in _OWN_GROUPS if g in live]:  # never the world: it predates them
        torch.distributed.destroy_process_group(group)
    _OWN_GROUPS.clear()
    return made


def init_parallel_state(tp: int = 1, pp: int = 1, seed: int = 1234, vpp: int = 1, ep: int = 1,
                        etp: Optional[int] = None) -> None:
    """(Re)initialise megatron's TP/PP (MoE: EP/ETP, ETP defaults to TP) groups over the existing
    torch.distributed world and seed its RNG tracker (needed before building a model). vpp > 1:
    chunks per pipeline rank (interleaved schedule; see models/chunks.py). A re-initialisation
    first shuts down the groups the previous one made (destroy_parallel_state)."""
    destroy_parallel_state()
    # megatron-core 0.12 destroys the embedding groups but keeps their rank lists, so after a
    # re-initialisation at another PP a rank outside the new groups believes it is in one
    # (finalize_model_grads then asks for a group that does not exist); 0.16 clears them
    for stale in ("_EMBEDDING_GLOBAL_RANKS", "_POSITION_EMBEDDING_GLOBAL_RANKS"):
        if hasattr(parallel_state, stale):
            setattr(parallel_state, stale, None)
    before = set(c10d._world.pg_map)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                             expert_model_parallel_size=ep,
                                             expert_tensor_parallel_size=tp if etp is None else etp)
    _OWN_GROUPS.extend(g for g in c10d._world.pg_map if g not in before)
    model_parallel_cuda_manual_seed(seed)


def _get(args: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = args.get(key, default)
    return default if value is None else value


def xielu_default(x: torch.Tensor) -> torch.Tensor:
    """The config's activation of an xIELU model before models/xielu.install gives each layer its own
    module (with the scalars' initial values); never called after the build."""
    from mindspeed_rl.models.xielu import XIELU

    return XIELU(dtype=x.dtype).to(x.device)(x)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2: Arcee's MLP activation (transformers' relu2, vLLM's ReLUSquaredActivation,
    megatron-core 0.16's squared_relu; 0.12 has none)."""
    return torch.square(F.relu(x))


def transformer_config(args: Mapping[str, Any], params_dtype: torch.dtype = torch.float32,
                       sequence_parallel: bool = False, overrides: Optional[Mapping[str, Any]] = None) -> TransformerConfig:
    """TransformerConfig from Megatron-named args; TP/PP sizes from parallel_state. `overrides`:
    more TransformerConfig fields (SP / VPP / recompute: models/parallel.parallel_config_kwargs)."""
    missing = [k for k in _REQUIRED if args.get(k) is None]
    if missing:
        raise ValueError(f"model config is missing {', '.join(missing)} (Megatron argument names).")
    hidden, heads = int(args["hidden_size"]), int(args["num_attention_heads"])
    groups = int(_get(args, "num_query_groups", heads)) if _get(args, "group_query_attention", False) else heads
    geglu = bool(_get(args, "geglu", False))  # Gemma: gelu(gate, tanh approximation) * up
    swiglu = bool(_get(args, "swiglu", True)) and not geglu
    squared_relu = bool(_get(args, "squared_relu", False)) and not (swiglu or geglu)  # Arcee: relu(up)^2, no gate
    xielu = bool(_get(args, "xielu", False)) and not (swiglu or geglu)  # Apertus: per-layer modules (models/xielu.py)
    openai_gelu = bool(_get(args, "openai_gelu", False)) and not (swiglu or geglu)  # StarCoder2: gelu(up, tanh), no gate
    own_glu = swiglu and own_swiglu(get_platform().name)
    if own_glu:  # megatron's MLP calls its fused-activation names, which now are models/swiglu.py's
        install_swiglu()
    mla = bool(_get(args, "multi_latent_attention", False))
    config = (MLATransformerConfig if mla else TransformerConfig)(
        num_layers=int(args["num_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(_get(args, "ffn_hidden_size", 4 * hidden)),
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=kv_channels(args),
        normalization=_get(args, "normalization", "RMSNorm"),
        layernorm_epsilon=float(_get(args, "norm_epsilon", 1e-5)),
        gated_linear_unit=swiglu or geglu,
        activation_func=(F.silu if swiglu else functools.partial(F.gelu, approximate="tanh") if geglu or openai_gelu
                         else relu_squared if squared_relu else xielu_default if xielu else F.gelu),
        # megatron-core 0.12 refuses biases with MoE at construction; gpt-oss's (models/gpt_oss.py) are set below
        add_bias_linear=not _get(args, "disable_bias_linear", True) and not _get(args, "num_experts"),
        add_qkv_bias=bool(_get(args, "add_qkv_bias", False)),
        # with MLA, megatron's qk_layernorm is its norms on the compressed query and key / value (_layer_spec),
        # kept off the config: finalize_model_grads would sum their complete gradients over TP without SP
        qk_layernorm=bool(_get(args, "qk_layernorm", False)) and not mla,
        rotary_interleaved=bool(_get(args, "rotary_interleaved", False)),  # GLM-4's pairs (2i, 2i + 1)
        softmax_scale=float(_get(args, "softmax_scale")) if _get(args, "softmax_scale") is not None else None,
        hidden_dropout=float(_get(args, "hidden_dropout", 0.0)),
        attention_dropout=float(_get(args, "attention_dropout", 0.0)),
        init_method_std=float(_get(args, "init_method_std", 0.02)),
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        pipeline_dtype=params_dtype,
        attention_softmax_in_fp32=True,
        masked_softmax_fusion=False,  # the explicit (B,1,S,S) padding masks need the generic path
        bias_activation_fusion=own_glu,  # with megatron's own functions: torch.compile and a cat in backward
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        sequence_parallel=sequence_parallel,
        **moe_config_fields(args),
        **(mla_config_fields(args) if mla else {}),
        **dict(overrides or {}),
    )
    config.add_bias_linear = not _get(args, "disable_bias_linear", True)
    # megatron-core 0.16 skips RoPE in the layers this pattern marks itself; 0.12 has no such field
    # (build_gpt_model hooks its layers), and our decode paths read it from here in both
    config.no_rope_freq = no_rope_pattern(_get(args, "no_rope_freq"), config.num_layers)
    config.mla_norms = mla and bool(_get(args, "qk_layernorm", False))  # MLA's q_layernorm / kv_layernorm
    if mla:  # megatron's MLA rotates with its own (YaRN) rotary embedding; its scores: mla_softmax_scale
        config.rope_mscale = 1.0
    else:
        rope_attention_scaling(config, args)
    # every layer attends to at most this many latest positions (models/sliding_window.py); megatron's
    # own window_size is left unset (0.12 refuses it, 0.16 drops the padding mask for it)
    config.attention_window = int(_get(args, "sliding_window")) if _get(args, "sliding_window") else None
    # which layers slide (1) and which attend fully (Gemma 3's layer_types); None = all alike
    config.window_layers = window_pattern(_get(args, "window_attn_skip_freq"), config.num_layers)
    # the sliding layers' own RoPE theta (Gemma 3's local layers; models/gemma.py)
    config.rope_local_base = float(_get(args, "rope_local_base_freq")) if _get(args, "rope_local_base_freq") else None
    config.add_rmsnorm_offset = bool(_get(args, "add_rmsnorm_offset", False))  # Gemma's (1 + w) norms
    config.apply_layernorm_1p = bool(_get(args, "apply_layernorm_1p", False))  # Nemotron's (1 + w) LayerNorms
    config.layernorm_bias = bool(_get(args, "layernorm_bias", True))  # false: Cohere's weight-only LayerNorms
    config.layernorm_affine = bool(_get(args, "layernorm_affine", True))  # false: OLMo 1's, nanochat's norms without weights
    clip = _get(args, "clip_qkv")
    config.clip_qkv = float(clip) if clip is not None else None  # OLMo's q / k / v clamp (models/olmo.py)
    config.parallel_residual = bool(_get(args, "parallel_residual", False))  # Cohere's x + attn(ln x) + mlp(ln x)
    config.parallel_residual_mlp_norm = bool(_get(args, "parallel_residual_mlp_norm", False))  # GPT-NeoX's ln2 for mlp
    if config.parallel_residual_mlp_norm and not config.parallel_residual:
        raise ValueError("parallel_residual_mlp_norm needs parallel_residual: true (GPT-NeoX's layer).")
    config.post_norm = bool(_get(args, "post_norm", False))  # Gemma's norms after attention / MLP
    config.value_norm = bool(_get(args, "value_norm", False))  # Gemma 4's v_norm (models/gemma4.py)
    config.attention_k_eq_v = bool(_get(args, "attention_k_eq_v", False))  # Gemma 4's full layers: values = keys
    config.pre_norm = bool(_get(args, "pre_norm", True))  # OLMo 2: false, its norms come after only
    config.qk_layernorm_across_heads = bool(_get(args, "qk_layernorm_across_heads", False))  # OLMo 2's q/k norms
    if not config.pre_norm and not config.post_norm:
        raise ValueError("pre_norm: false needs post_norm: true (OLMo 2's layout); a layer without any norm is not "
                         "a model config.json describes.")
    if config.qk_layernorm_across_heads and not config.qk_layernorm:
        raise ValueError("qk_layernorm_across_heads needs qk_layernorm: true.")
    config.qk_layernorm_after_rope = bool(_get(args, "qk_layernorm_after_rope", False))  # HunYuan's q/k norms
    if config.qk_layernorm_after_rope and (not config.qk_layernorm or config.qk_layernorm_across_heads or mla):
        raise ValueError("qk_layernorm_after_rope needs qk_layernorm: true, per-head norms (not "
                         "qk_layernorm_across_heads) and no multi_latent_attention.")
    # Gemma 2's soft caps, cap x tanh(x / cap): of the attention scores (models/core_attention.py), the logits (models/gemma.py)
    config.attn_logit_softcapping = float(_get(args, "attn_logit_softcapping")) if _get(args, "attn_logit_softcapping") else None
    config.output_logit_softcapping = (float(_get(args, "output_logit_softcapping"))
                                       if _get(args, "output_logit_softcapping") else None)
    # Granite's scalars (models/multipliers.py); megatron has none of them
    config.embedding_multiplier = float(_get(args, "embedding_multiplier_scale", 1.0))
    # Gemma: sqrt(hidden_size), rounded to the activations' dtype as transformers and vLLM round it
    config.embedding_multiplier_in_dtype = bool(_get(args, "input_embeds_norm", False))
    if config.embedding_multiplier_in_dtype:
        config.embedding_multiplier *= math.sqrt(config.hidden_size)
    config.residual_multiplier = float(_get(args, "residual_multiplier", 1.0))
    config.logits_multiplier = float(_get(args, "output_multiplier_scale", 1.0))
    # Falcon-H1's (models/parallel_hybrid.py): its key_multiplier scales every score, as the keys times it would
    for name in ("attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier"):
        setattr(config, name, float(_get(args, name, 1.0)))
    key_multiplier = float(_get(args, "key_multiplier", 1.0))
    if key_multiplier != 1.0:
        base = config.softmax_scale if config.softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        config.softmax_scale = base * key_multiplier
    gpt_oss_fields(config, args)
    return config


def gpt_oss_fields(config: TransformerConfig, args: Mapping[str, Any]) -> None:
    """gpt-oss's switches in megatron-core 0.16's names (models/gpt_oss.py), set on `config` in 0.12
    and 0.16 alike (0.12 has no such fields; our modules read them, not megatron's): softmax_type
    learnable (attention sinks), quick_geglu with activation_func_clamp_value and glu_linear_offset
    (the experts' clamped SwiGLU)."""
    softmax = _get(args, "softmax_type", "vanilla")
    if softmax not in ("vanilla", "learnable"):
        raise ValueError(f"softmax_type {softmax!r} is not supported; use vanilla or learnable (gpt-oss's attention "
                         f"sinks).")
    config.attention_sinks = softmax == "learnable"
    config.quick_geglu = bool(_get(args, "quick_geglu", False))
    clamp = _get(args, "activation_func_clamp_value")
    config.activation_func_clamp_value = float(clamp) if clamp is not None else None
    config.glu_linear_offset = float(_get(args, "glu_linear_offset", 0.0))
    if not config.quick_geglu and (clamp is not None or config.glu_linear_offset):
        raise ValueError("activation_func_clamp_value / glu_linear_offset apply to quick_geglu (gpt-oss's experts) "
                         "only; set quick_geglu: true or drop them.")
    if config.quick_geglu and not config.num_moe_experts:
        raise ValueError("quick_geglu (gpt-oss's clamped SwiGLU) is supported in MoE experts only (gpt-oss has no "
                         "dense MLP); set num_experts or drop quick_geglu.")
    if config.quick_geglu and config.num_moe_experts and not all(config.moe_layer_freq or [1]):
        raise ValueError("quick_geglu (gpt-oss's clamped SwiGLU) needs every layer to be an MoE layer (moe_layer_freq "
                         "1), as gpt-oss has; dense layers would not apply it.")
    if config.num_moe_experts and config.add_bias_linear and not config.quick_geglu:
        raise ValueError("disable_bias_linear: false in an MoE model is supported with gpt-oss's experts only "
                         "(quick_geglu: true); megatron's experts and dispatchers take no bias.")
    if config.quick_geglu and config.add_bias_linear and (config.expert_tensor_parallel_size or 1) > 1:
        raise ValueError(f"expert_tensor_parallel_size {config.expert_tensor_parallel_size} with gpt-oss's expert "
                         f"biases is not supported: an expert's output bias would be summed once per expert-TP "
                         f"rank; set expert_tensor_parallel_size: 1 (split gpt-oss's experts by expert parallelism).")


def rope_attention_factor(args: Mapping[str, Any]) -> float:
    """The factor longrope / yarn scale cos and sin by: rope_attention_factor when set, else yarn's
    0.1 ln(factor) + 1 (with rope_scaling_mscale / _mscale_all_dim: the ratio of two such terms,
    each with its mscale on ln), as transformers' `_compute_yarn_parameters` and vLLM compute it; 1
    for every other rotary embedding."""
    explicit = _get(args, "rope_attention_factor")
    if explicit is not None:
        return float(explicit)
    if _get(args, "rope_scaling_type") != "yarn":
        return 1.0
    factor = float(_get(args, "rope_scaling_factor", 1.0))

    def mscale(scale: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

    top, bottom = _get(args, "rope_scaling_mscale"), _get(args, "rope_scaling_mscale_all_dim")
    if top and bottom:
        return mscale(float(top)) / mscale(float(bottom))
    return mscale(1.0)


def rope_attention_scaling(config: TransformerConfig, args: Mapping[str, Any]) -> None:
    """Apply the attention factor m (rope_attention_factor) to `config` (its no_rope_freq already set). q and k rotated with cos / sin
    times m: where every head dimension is rotated that scales every score by m^2, which is
    softmax_scale x m^2, exact on every path (fused attention and NPU kernels included). With partial
    rotary only the rotated dimensions scale, with NoPE layers (SmolLM3 with YaRN) only the
    rotating layers, and with a local rotary table (OLMo 3 with YaRN) only the full layers, so there
    it stays on the rotation: `config.rope_mscale`, read
    by models/rotary.py and the rollout's KV-cache paths (rotary.rope_mscale); NPU rotates with
    MindSpeed's fused kernel, which takes no factor, so it is refused there."""
    factor = rope_attention_factor(args)
    config.rope_mscale = 1.0
    if factor == 1.0:
        return
    if _get(args, "rope_local_base_freq"):  # OLMo 3: the sliding layers' default rope stays unscaled
        if not own_rotary(get_platform().name):
            raise ValueError(f"rope_attention_factor {factor} with rope_local_base_freq (the full layers' rope scaled, "
                             f"the sliding layers' not, e.g. OLMo 3 with YaRN) is not supported on "
                             f"{get_platform().name}: its fused rotary kernel does not scale cos and sin.")
        config.rope_mscale = factor  # the local layers' attention gets a copy at 1 (gemma.install_local_rope)
        return
    if float(_get(args, "rotary_percent", 1.0)) >= 1.0 and not config.no_rope_freq:  # NoPE scores stay unscaled
        base = config.softmax_scale if config.softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        config.softmax_scale = base * factor * factor
    elif own_rotary(get_platform().name):
        config.rope_mscale = factor
    else:
        raise ValueError(f"rope_attention_factor {factor} with partial rotary (rotary_percent "
                         f"{_get(args, 'rotary_percent', 1.0)}, e.g. Phi-4-mini) or layers without RoPE (no_rope_freq) is "
                         f"not supported on {get_platform().name}: its fused rotary kernel does not scale cos and sin.")


def mla_config_fields(args: Mapping[str, Any]) -> dict[str, Any]:
    """MLATransformerConfig fields of multi-latent attention (DeepSeek-V3) from Megatron-named args:
    the low-rank and head dimensions, and its RoPE: plain ("rope") or YaRN, which megatron's MLA
    computes itself (YarnRotaryEmbedding: DeepSeek's ramp with rounded ends, cos / sin times
    m(factor, mscale) / m(factor, mscale_all_dim), m(f, s) = 0.1 s ln f + 1). The scores' scale is set
    after the build (mla_softmax_scale): megatron squares m(factor, mscale) there, transformers and
    vLLM m(factor, mscale_all_dim)."""
    need = [k for k in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim") if not _get(args, k)]
    if need:
        raise ValueError(f"multi_latent_attention needs {', '.join(need)} (DeepSeek-V3: kv_lora_rank 512, qk_head_dim "
                         f"128, qk_pos_emb_head_dim 64, v_head_dim 128).")
    if kv_channels(args) != int(_get(args, "v_head_dim")):
        raise ValueError(f"multi_latent_attention: kv_channels {_get(args, 'kv_channels')} must equal v_head_dim "
                         f"{_get(args, 'v_head_dim')} (megatron sizes the attention output by kv_channels); drop it.")
    scaling = _get(args, "rope_scaling_type")
    if scaling not in (None, "yarn") or float(_get(args, "rotary_percent", 1.0)) != 1.0:
        raise ValueError(f"multi_latent_attention with rope_scaling_type {scaling!r} / rotary_percent "
                         f"{_get(args, 'rotary_percent', 1.0)} is not supported: its RoPE part is rotated whole, "
                         f"plain or with yarn.")
    if scaling == "yarn" and (_get(args, "rope_attention_factor") is not None
                              or not _get(args, "rope_scaling_truncate", True)):
        raise ValueError("multi_latent_attention with yarn takes its attention factor from rope_scaling_mscale / "
                         "rope_scaling_mscale_all_dim and rounds the ramp's ends (DeepSeek's YaRN); drop "
                         "rope_attention_factor / rope_scaling_truncate: false.")
    q_lora = _get(args, "q_lora_rank")
    fields: dict[str, Any] = {
        "multi_latent_attention": True, "q_lora_rank": int(q_lora) if q_lora else None,
        "kv_lora_rank": int(_get(args, "kv_lora_rank")), "qk_head_dim": int(_get(args, "qk_head_dim")),
        "qk_pos_emb_head_dim": int(_get(args, "qk_pos_emb_head_dim")), "v_head_dim": int(_get(args, "v_head_dim")),
        "rotary_base": float(_get(args, "rotary_base", 10000.0)), "rotary_percent": 1.0,
    }
    if scaling == "yarn":
        # megatron-core 0.16 names the original length original_max_position_embeddings, 0.12 max_position_embeddings
        original = ("original_max_position_embeddings"
                    if "original_max_position_embeddings" in MLATransformerConfig.__dataclass_fields__
                    else "max_position_embeddings")
        fields.update(rope_type="yarn", rotary_scaling_factor=float(_get(args, "rope_scaling_factor", 8.0)),
                      **{original: int(_get(args, "original_max_position_embeddings", 8192))},
                      beta_fast=float(_get(args, "rope_scaling_beta_fast", 32.0)),
                      beta_slow=float(_get(args, "rope_scaling_beta_slow", 1.0)),
                      mscale=float(_get(args, "rope_scaling_mscale") or 1.0),
                      mscale_all_dim=float(_get(args, "rope_scaling_mscale_all_dim") or 0.0))
    else:  # factor 1: megatron's MLA then leaves the scores' scale at 1 / sqrt(q head dim)
        fields.update(rope_type="rope", rotary_scaling_factor=1.0)
    return fields


def mla_softmax_scale(args: Mapping[str, Any]) -> float:
    """The attention scores' scale of multi-latent attention as transformers' DeepSeek-V3 (and vLLM)
    compute it: 1 / sqrt(qk_head_dim + qk_pos_emb_head_dim), times m(factor, mscale_all_dim)^2 with
    yarn when mscale_all_dim is set; softmax_scale when given."""
    if _get(args, "softmax_scale") is not None:
        return float(_get(args, "softmax_scale"))
    scale = (int(_get(args, "qk_head_dim")) + int(_get(args, "qk_pos_emb_head_dim"))) ** -0.5
    all_dim, factor = _get(args, "rope_scaling_mscale_all_dim"), float(_get(args, "rope_scaling_factor", 8.0))
    if _get(args, "rope_scaling_type") == "yarn" and all_dim and factor > 1:
        m = 0.1 * float(all_dim) * math.log(factor) + 1.0
        scale *= m * m
    return scale


def moe_config_fields(args: Mapping[str, Any]) -> dict[str, Any]:
    """TransformerConfig MoE fields from Megatron-named args ({} for a dense model); EP/ETP sizes come
    from parallel_state. Experts are megatron's SequentialMLP (moe_grouped_gemm needs a grouped-GEMM
    kernel package; validate.py refuses it where the platform has none). HF's norm_topk_prob, when
    given, decides moe_router_pre_softmax (softmax over all experts, then top-k, unrenormalised)."""
    experts = _get(args, "num_experts")
    if not experts or int(experts) <= 1:
        return {}
    norm = args.get("norm_topk_prob")
    pre_softmax = (not norm) if norm is not None else bool(_get(args, "moe_router_pre_softmax", False))
    return dict(
        num_moe_experts=int(experts),
        moe_router_topk=int(_get(args, "moe_router_topk", 2)),
        moe_ffn_hidden_size=int(_get(args, "moe_ffn_hidden_size", _get(args, "ffn_hidden_size", 4 * int(args["hidden_size"])))),
        moe_router_pre_softmax=pre_softmax,
        moe_router_load_balancing_type=_get(args, "moe_router_load_balancing_type", "aux_loss"),
        moe_aux_loss_coeff=float(_get(args, "moe_aux_loss_coeff", 0.0)),
        moe_token_dispatcher_type=_get(args, "moe_token_dispatcher_type", "allgather"),
        # megatron's GroupedMLP (grouped_gemm package, stacked weights) is never built: moe_grouped_gemm
        # turns the SequentialMLP experts into models/grouped_experts.py's, same parameters
        moe_grouped_gemm=False,
        moe_shared_expert_intermediate_size=int(_get(args, "moe_shared_expert_intermediate_size", 0)) or None,
        # GLM-4.5's dense first layers, sigmoid routing with a fixed expert bias, groups, a weight scale
        moe_layer_freq=moe_layer_pattern(_get(args, "moe_layer_freq", 1), int(args["num_layers"])),
        moe_router_score_function=_get(args, "moe_router_score_function", "softmax"),
        # megatron routes softmax without an expert bias (0.12 and 0.16 refuse the pair): ERNIE 4.5 MoE's is
        # added after the build (moe_replay.install_softmax_bias)
        moe_router_enable_expert_bias=(bool(_get(args, "moe_router_enable_expert_bias", False))
                                       and _get(args, "moe_router_score_function", "softmax") == "sigmoid"),
        moe_router_bias_update_rate=float(_get(args, "moe_router_bias_update_rate", 0.0)),
        moe_router_num_groups=int(_get(args, "moe_router_num_groups")) if _get(args, "moe_router_num_groups") else None,
        moe_router_group_topk=int(_get(args, "moe_router_group_topk")) if _get(args, "moe_router_group_topk") else None,
        moe_router_topk_scaling_factor=(float(_get(args, "moe_router_topk_scaling_factor"))
                                        if _get(args, "moe_router_topk_scaling_factor") else None),
        # megatron-core 0.16 reads the shared expert's gate from the config; 0.12 from the layer spec (below)
        **({"moe_shared_expert_gate": bool(_get(args, "shared_expert_gate", False))}
           if "moe_shared_expert_gate" in TransformerConfig.__dataclass_fields__ else {}),
        expert_model_parallel_size=parallel_state.get_expert_model_parallel_world_size(),
        expert_tensor_parallel_size=parallel_state.get_expert_tensor_parallel_world_size(),
    )


def softmax_expert_bias(args: Mapping[str, Any]) -> bool:
    """Whether `args` route by softmax with an expert bias for the top-k choice (ERNIE 4.5 MoE), which
    megatron-core does not compute: models/moe_replay.install_softmax_bias does."""
    return (bool(_get(args, "moe_router_enable_expert_bias", False))
            and _get(args, "moe_router_score_function", "softmax") == "softmax")


def llama3_inv_freq(dim: int, base: float, factor: float, low_freq_factor: float,
                    high_freq_factor: float, original_max_position_embeddings: int) -> torch.Tensor:
    """Llama-3.1 rope frequency scaling (as transformers' `_compute_llama3_parameters`). (dim/2,)"""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_inv_freq(dim: int, base: float, factor: float, original_max_position_embeddings: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True) -> torch.Tensor:
    """YaRN's inverse frequencies (transformers' `_compute_yarn_parameters`, vLLM's
    YaRNScalingRotaryEmbedding): dimensions that turn fewer than beta_slow times over the original
    length are interpolated (divided by the factor), those turning more than beta_fast times kept,
    linearly blended between. (dim/2,)"""
    def correction_dim(rotations: float) -> float:
        return dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as both references: no division by zero
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: extrapolate (the original frequency), 0: interpolate
    return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


def rotary_inv_freq(args: Mapping[str, Any], inv_freq: torch.Tensor) -> torch.Tensor:
    """The rotary embedding's inverse frequencies under args' rope_scaling_type; `inv_freq` is
    megatron's unscaled ones (rotary_base, rotary dimension = 2 x its size). fp32 on the CPU."""
    scaling = _get(args, "rope_scaling_type")
    dim, base = inv_freq.numel() * 2, float(_get(args, "rotary_base", 10000.0))
    factor = float(_get(args, "rope_scaling_factor", 8.0))
    original = int(_get(args, "original_max_position_embeddings", 8192))
    if scaling == "llama3":
        return llama3_inv_freq(dim, base, factor, float(_get(args, "low_freq_factor", 1.0)),
                               float(_get(args, "high_freq_factor", 4.0)), original)
    if scaling == "yarn":
        return yarn_inv_freq(dim, base, factor, original, float(_get(args, "rope_scaling_beta_fast", 32.0)),
                             float(_get(args, "rope_scaling_beta_slow", 1.0)), bool(_get(args, "rope_scaling_truncate", True)))
    inv_freq = inv_freq.detach().float().cpu()
    if scaling == "linear":  # position / factor == frequency / factor
        return inv_freq / factor
    if scaling == "proportional":  # Gemma 4's full layers: the first pairs at their frequencies, the others still
        kept = int(float(_get(args, "rope_proportion", 1.0)) * dim // 2)
        return torch.cat([inv_freq[:kept], torch.zeros(inv_freq.numel() - kept)])
    if scaling == "longrope":  # up to the original length: the short factors (hf_config.longrope_args)
        short = torch.tensor([float(f) for f in _get(args, "rope_short_factor")], dtype=torch.float32)
        if short.numel() != inv_freq.numel():
            raise ValueError(f"rope_short_factor has {short.numel()} entries; the rotary embedding has "
                             f"{inv_freq.numel()} frequencies.")
        return inv_freq / short
    return inv_freq


def build_gpt_model(args: Mapping[str, Any], params_dtype: torch.dtype = torch.float32,
                    sequence_parallel: bool = False, pre_process: Optional[bool] = None,
                    post_process: Optional[bool] = None, device: Optional[torch.device] = None,
                    config_overrides: Optional[Mapping[str, Any]] = None, vp_stage: Optional[int] = None) -> GPTModel:
    """The GPTModel chunk of this rank (its PP stage, its TP shard), randomly initialised.

    Args:
        args: Megatron-named architecture arguments (see module docstring).
        params_dtype: torch.float32 / torch.bfloat16 / torch.float16.
        pre_process / post_process: default to "this rank is the first / last PP stage" (of the
            whole virtual pipeline when vp_stage is given).
        device: where every weight goes; default the platform's current device (set_device's).
        config_overrides: TransformerConfig fields for SP / VPP / recompute (models/parallel.py).
        vp_stage: which of this rank's virtual-pipeline chunks to build (build_model_chunks).

    Returns:
        A GPTModel wholly on `device`, every parameter in params_dtype (norms included, as megatron's
        Float16Module does; fp32 main params live in the optimizer); its forward returns
        vocab-parallel logits (B, S, V/TP).
    """
    device = torch.device(device) if device is not None else get_platform().current_device()
    overrides = dict(config_overrides or {})
    sequence_parallel = bool(overrides.pop("sequence_parallel", sequence_parallel))
    config = transformer_config(args, params_dtype, sequence_parallel, overrides)
    scaling = _get(args, "rope_scaling_type")
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling_type {scaling!r} is not supported; use one of: "
                         f"{', '.join(s for s in ROPE_SCALINGS if s)}, or null.")
    spec = _layer_spec(config, config.num_moe_experts)
    shared = getattr(getattr(spec.submodules.mlp, "submodules", None), "shared_experts", None)
    if _get(args, "shared_expert_gate", False) and "gate" in (getattr(shared, "params", None) or {}):
        shared.params = {**shared.params, "gate": True}  # Qwen2-MoE: sigmoid(x . gate_weight) scales its output
    if config.num_moe_experts and not all(config.moe_layer_freq):  # GLM-4.5: dense layers among the MoE ones
        spec = _mixed_block_spec(config, spec, vp_stage)
    if config.multi_latent_attention:  # megatron's MLA as the local spec builds it (models/mla.py)
        from mindspeed_rl.models import mla  # noqa: F401
    if sdpa_core_attention(get_platform().name):  # fused attention (models/core_attention.py)
        spec = with_sdpa_attention(spec)
    elif config.multi_latent_attention:  # megatron's local attention as MLA builds it
        spec = with_mla_attention(spec)
    elif config.attn_logit_softcapping:
        raise ValueError(f"attn_logit_softcapping (Gemma 2) is not supported on {get_platform().name}: its fused "
                         f"attention kernel does not soft-cap the scores.")
    elif config.attention_sinks:
        raise ValueError(f"softmax_type learnable (gpt-oss's attention sinks) is not supported on "
                         f"{get_platform().name}: its fused attention kernel has no sink logits.")
    if own_rotary(get_platform().name):  # RoPE: cos/sin once per forward, one rotation op (models/rotary.py)
        install_rotary()
    if config.sequence_parallel:  # megatron's torch-norm fallback refuses SP: models/parallel.py
        spec = sequence_parallel_spec(spec, _layers_per_chunk(config))
    # norms of their own everywhere, the final norm included: Gemma's (1 + w) RMSNorm, Nemotron's LayerNorm1P (1 + w,
    # with its bias), Cohere's weight-only LayerNorm (validation allows one of them at a time)
    if config.add_rmsnorm_offset or config.apply_layernorm_1p or not config.layernorm_bias or not config.layernorm_affine:
        from mindspeed_rl.models import cohere, gemma, olmo

        cls = (gemma.OffsetRMSNorm if config.add_rmsnorm_offset else gemma.OffsetLayerNorm if config.apply_layernorm_1p
               else olmo.NonParametricLayerNorm if not config.layernorm_affine else cohere.WeightOnlyLayerNorm)
        spec = gemma.norms_replaced(gemma.as_block_spec(spec, _layers_per_chunk(config)), cls)
    if not config.pre_norm or config.qk_layernorm_across_heads:  # OLMo 2 (models/olmo.py)
        from mindspeed_rl.models import olmo

        spec = olmo.without_pre_norms(spec, config.qk_layernorm_across_heads, config.pre_norm)
    if _get(args, "linear_attention_layers") or _get(args, "attention_output_gate"):  # Qwen3.5 (models/qwen3_5.py)
        from mindspeed_rl.models import qwen3_5

        spec = qwen3_5.hybrid_block_spec(spec, dict(args), _chunk_layers(config, vp_stage))
    if any(_get(args, "mamba_layers") or ()):  # Granite 4.0-H (models/mamba2.py)
        from mindspeed_rl.models import mamba2

        spec = mamba2.hybrid_block_spec(spec, dict(args), _chunk_layers(config, vp_stage))
    if any(_get(args, "short_conv_layers") or ()):  # LFM2 (models/short_conv.py)
        from mindspeed_rl.models import short_conv

        spec = short_conv.hybrid_block_spec(spec, dict(args), _chunk_layers(config, vp_stage))
    if _get(args, "parallel_hybrid"):  # Falcon-H1: attention and Mamba-2 side by side (models/parallel_hybrid.py)
        from mindspeed_rl.models import parallel_hybrid

        spec = parallel_hybrid.block_spec(spec, dict(args), _chunk_layers(config, vp_stage))
    if _get(args, "value_norm") or has_layer_shapes(args):  # Gemma 4 (models/gemma4.py)
        from mindspeed_rl.models import gemma4

        spec = gemma4.block_spec(spec, dict(args), _chunk_layers(config, vp_stage), _layer_spec(config, None).submodules.mlp)
    if _get(args, "hybrid_override_pattern"):  # Nemotron-H: one block per layer (models/hybrid_pattern.py)
        from mindspeed_rl.models import hybrid_pattern

        spec = hybrid_pattern.block_spec(spec, dict(args), _chunk_layers(config, vp_stage))
    if vp_stage is not None:
        pre_process, post_process = _virtual_stage_ends(vp_stage, pre_process, post_process)
    # megatron's layers pass device=current_device() themselves; modules that do not (the torch-norm
    # fallback) follow the default device, so make that the target too, then place what is left over
    with torch.device(device):
        model = _gpt_model(config, spec, args, pre_process, post_process, vp_stage)
        if config.post_norm:
            from mindspeed_rl.models import gemma

            gemma.install_post_norms(model)
        if config.parallel_residual:  # Cohere, Phi-2, GPT-NeoX: the MLP reads the normed layer input (models/cohere.py)
            from mindspeed_rl.models import cohere

            cohere.install_parallel_residual(model, config.parallel_residual_mlp_norm)
        if _get(args, "add_output_layer_bias", False) and getattr(model, "post_process", False):  # Phi-2's lm_head.bias
            _add_output_bias(model)
        if config.clip_qkv is not None:  # OLMo: q / k / v clamped after their projection (models/olmo.py)
            from mindspeed_rl.models import olmo

            olmo.install_clip_qkv(model, config.clip_qkv)
        if config.qk_layernorm_after_rope:  # HunYuan (models/qk_norm_after_rope.py)
            from mindspeed_rl.models import qk_norm_after_rope

            qk_norm_after_rope.install(model)
        if _get(args, "layer_scalar", False) or _get(args, "per_layer_input_size") or _get(args, "num_kv_shared_layers"):
            from mindspeed_rl.models import gemma4  # Gemma 4: per-layer inputs, KV sharing, layer scalars

            gemma4.install(model, _get(args, "per_layer_input_size"), _get(args, "per_layer_input_vocab_size"),
                           bool(_get(args, "num_kv_shared_layers")), bool(_get(args, "layer_scalar", False)))
        if _get(args, "xielu", False):  # Apertus: an xIELU with its own scalars on every MLP (models/xielu.py)
            from mindspeed_rl.models import xielu

            xielu.install(model)
    if config.output_logit_softcapping and getattr(model, "post_process", False):
        from mindspeed_rl.models import gemma

        gemma.install_output_softcap(model, config.output_logit_softcapping)
    place_model(model, device, params_dtype)
    if config.num_moe_experts:
        from mindspeed_rl.models import moe_dispatch

        moe_dispatch.install(model)  # no host sync in the permutation where every expert is local
    if config.num_moe_experts and softmax_expert_bias(args):  # ERNIE 4.5 MoE's routing (models/moe_replay.py)
        from mindspeed_rl.models import moe_replay

        moe_replay.install_softmax_bias(model)
    if config.quick_geglu or config.attention_sinks:  # gpt-oss's experts, router bias, sinks (models/gpt_oss.py)
        from mindspeed_rl.models import gpt_oss

        gpt_oss.install(model, grouped_gemm=bool(_get(args, "moe_grouped_gemm", False)))
    elif config.num_moe_experts and _get(args, "moe_grouped_gemm", False):
        from mindspeed_rl.models import grouped_experts

        grouped_experts.install(model)
    if config.no_rope_freq and "no_rope_freq" not in TransformerConfig.__dataclass_fields__:
        _skip_rope_in_marked_layers(model)
    if config.attention_window:
        from mindspeed_rl.models import sliding_window

        sliding_window.install(model, config.attention_window, config.window_layers)
    if (config.embedding_multiplier, config.residual_multiplier, config.logits_multiplier) != (1.0, 1.0, 1.0):
        from mindspeed_rl.models import multipliers

        multipliers.install(model)
    if (float(_get(args, "mlp_gate_multiplier", 1.0)), float(_get(args, "mlp_down_multiplier", 1.0))) != (1.0, 1.0):
        from mindspeed_rl.models import parallel_hybrid  # Falcon-H1's mlp_multipliers

        parallel_hybrid.install_mlp_multipliers(model, float(_get(args, "mlp_gate_multiplier", 1.0)),
                                                float(_get(args, "mlp_down_multiplier", 1.0)))
    if config.multi_latent_attention:  # transformers' and vLLM's scale of the scores (mla_softmax_scale)
        from mindspeed_rl.models import mla

        mla.install(model)  # the key's RoPE part's gradient over TP (models/mla.py)
        scale = mla_softmax_scale(args)
        for layer in model.decoder.layers:
            layer.self_attention.softmax_scale = scale
            layer.self_attention.core_attention.softmax_scale = scale
    if hasattr(model, "rotary_pos_emb"):  # inv_freq is a plain attribute (module.to skips it); it stays fp32
        rotary = model.rotary_pos_emb
        rotary.inv_freq = rotary_inv_freq(args, rotary.inv_freq).to(device=device, dtype=torch.float32)
        if config.rope_local_base is not None:
            from mindspeed_rl.models import gemma
            from mindspeed_rl.models.rotary import layer_uses_local_rope

            gemma.install_local_rope(model, config.rope_local_base,
                                     functools.partial(layer_uses_local_rope, config),
                                     int(_get(args, "sliding_kv_channels") or 0) or None)
    if _get(args, "embedding_norm") or _get(args, "rotary_negated"):  # nanochat (models/nanochat.py)
        from mindspeed_rl.models import nanochat
        nanochat.install(model, bool(_get(args, "embedding_norm")), bool(_get(args, "rotary_negated")), config.layernorm_epsilon)
    return model


def _layer_spec(config: TransformerConfig, num_experts: Optional[int]) -> Any:
    """megatron's local layer spec for `config`; multi-latent attention's RMSNorms on the compressed
    query and key / value are its spec's qk_layernorm (config.mla_norms)."""
    mla = bool(getattr(config, "multi_latent_attention", False))
    return get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False,
                                    qk_layernorm=config.qk_layernorm or getattr(config, "mla_norms", False),
                                    multi_latent_attention=mla,
                                    normalization=config.normalization)


def _mixed_block_spec(config: TransformerConfig, moe_spec: Any, vp_stage: Optional[int]) -> Any:
    """A block spec of this chunk's layers, each the MoE layer spec or the dense one as
    config.moe_layer_freq (one 0 / 1 per layer) says (megatron's get_gpt_decoder_block_spec does the
    same for its own specs; ours are the local spec with our changes)."""
    from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

    dense = _layer_spec(config, None)
    return TransformerBlockSubmodules(layer_specs=[moe_spec if config.moe_layer_freq[i] else dense
                                                   for i in _chunk_layers(config, vp_stage)],
                                      layer_norm=LayerNormImpl)


def _chunk_layers(config: TransformerConfig, vp_stage: Optional[int]) -> range:
    """Global indices of the layers of this rank's model chunk `vp_stage` (models/chunks.py's layout)."""
    from mindspeed_rl.models.chunks import virtual_layer_ranges

    return virtual_layer_ranges(config.num_layers, config.pipeline_model_parallel_size,
                                parallel_state.get_pipeline_model_parallel_rank(),
                                config.virtual_pipeline_model_parallel_size or 1)[vp_stage or 0]


def _skip_rope_in_marked_layers(model: GPTModel) -> None:
    """megatron-core 0.12: the layers config.no_rope_freq marks get no rotary embedding (megatron
    0.16's Attention does this itself): their attention's rotary_pos_emb argument becomes None."""
    from mindspeed_rl.models.rotary import layer_uses_rope

    def no_rope(module, args, kwargs):
        return args, {**kwargs, "rotary_pos_emb": None}

    for layer in model.decoder.layers:
        if not layer_uses_rope(model.config, layer.layer_number):
            layer.self_attention.register_forward_pre_hook(no_rope, with_kwargs=True)


def build_model_chunks(args: Mapping[str, Any], params_dtype: torch.dtype = torch.float32,
                       device: Optional[torch.device] = None,
                       config_overrides: Optional[Mapping[str, Any]] = None) -> list[GPTModel]:
    """This rank's GPTModel chunks: one, or one per virtual pipeline stage when parallel_state was
    initialised with vpp > 1 (init_parallel_state); see models/chunks.py for the layer layout."""
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    overrides = dict(config_overrides or {})
    if vpp == 1:
        overrides.pop("virtual_pipeline_model_parallel_size", None)
        return [build_gpt_model(args, params_dtype, device=device, config_overrides=overrides)]
    overrides["virtual_pipeline_model_parallel_size"] = vpp
    chunks = [build_gpt_model(args, params_dtype, device=device, config_overrides=overrides, vp_stage=v)
              for v in range(vpp)]
    if not _takes_vp_stage():  # megatron 0.12 reads the global virtual rank: leave it at the start
        parallel_state.set_virtual_pipeline_model_parallel_rank(0)
    return chunks


def _takes_vp_stage() -> bool:
    """megatron-core 0.16 passes the virtual stage as an argument; 0.12 reads a global."""
    return "vp_stage" in inspect.signature(GPTModel.__init__).parameters


def _layers_per_chunk(config: TransformerConfig) -> int:
    vpp = config.virtual_pipeline_model_parallel_size or 1
    return config.num_layers // (config.pipeline_model_parallel_size * vpp)


def _add_output_bias(model: torch.nn.Module) -> None:
    """A (V / TP,) bias on the output layer (add_output_layer_bias), zeros until loaded: megatron builds the layer
    without one, and its ColumnParallelLinear adds `bias` when it has one (skip_bias_add is false there), so the logits
    of every forward through the module carry it; the decode steps add it themselves (rollout/kv_cache.py)."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    layer = model.output_layer
    rows = layer.output_size_per_partition
    layer.bias = torch.nn.Parameter(torch.zeros(rows, dtype=model.config.params_dtype))
    set_tensor_model_parallel_attributes(layer.bias, True, 0, 1)


def _virtual_stage_ends(vp_stage: int, pre_process: Optional[bool], post_process: Optional[bool]):
    """pre/post_process of chunk vp_stage: the embedding on the first virtual stage, the output
    layer on the last; parallel_state's global virtual rank is set for megatron 0.12, whose
    layers read it (0.16 takes vp_stage as an argument instead)."""
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    if not _takes_vp_stage():
        parallel_state.set_virtual_pipeline_model_parallel_rank(vp_stage)
    first = parallel_state.get_pipeline_model_parallel_rank() == 0 and vp_stage == 0
    last = (parallel_state.get_pipeline_model_parallel_rank() == parallel_state.get_pipeline_model_parallel_world_size() - 1
            and vp_stage == vpp - 1)
    return (first if pre_process is None else pre_process), (last if post_process is None else post_process)


def _gpt_model(config: TransformerConfig, spec, args: Mapping[str, Any], pre_process: Optional[bool],
               post_process: Optional[bool], vp_stage: Optional[int] = None) -> GPTModel:
    extra = {"vp_stage": vp_stage} if vp_stage is not None and _takes_vp_stage() else {}
    return GPTModel(
        config, spec,
        vocab_size=int(args["padded_vocab_size"]),
        max_sequence_length=int(_get(args, "max_position_embeddings", 4096)),
        pre_process=parallel_state.is_pipeline_first_stage() if pre_process is None else pre_process,
        post_process=parallel_state.is_pipeline_last_stage() if post_process is None else post_process,
        share_embeddings_and_output_weights=not _get(args, "untie_embeddings_and_output_weights", False),
        position_embedding_type="rope",
        rotary_percent=float(_get(args, "rotary_percent", 1.0)),
        rotary_base=float(_get(args, "rotary_base", 10000.0)),
        **extra,
    )


# Hugging Face config.json -> Megatron args lives in hf_config.py (no megatron import: the driver
# reads config.json while validating, before any worker starts); re-exported here.
from mindspeed_rl.models.hf_config import HF_ARCHS, model_config_from_hf  # noqa: E402,F401
