"""config.json -> Megatron-named args for the models with LayerNorms (normalization: LayerNorm), for
models/hf_config.model_config_from_hf, which reads what they share with Llama (sizes, heads, RoPE) and hands them here
for the rest (models/hf_export_layernorm.py writes them back):

- StableLM 2 (stablelm: stablelm-2-1_6b, -chat, zephyr) is Llama's layout with LayerNorms (weight and bias: megatron's
  LayerNorm), q / k / v biases where use_qkv_bias says, RoPE on the first quarter of each head (Llama's pairs); its
  12B layout (parallel residual, per-head q / k LayerNorms) is refused.
- StarCoder2 (starcoder2: starcoder2-3b / 7b / 15b and -instruct) is StableLM's LayerNorms on Llama's attention with
  biases on every linear layer (use_bias), an MLP without a gate, c_proj(gelu_tanh(c_fc(x))) (openai_gelu), and
  Mistral's every-layer sliding_window; its dropouts are not taken (RL trains without dropout).
- Nemotron (nemotron: Nemotron-Mini-4B-Instruct, Minitron-4B / 8B, Nemotron-3-8B) is StableLM's layout with
  LayerNorm1P, which scales by (1 + weight) before its bias (apply_layernorm_1p), RoPE on the first half of each head
  (Llama's pairs), and an MLP without a gate, down_proj(relu(up_proj(x))^2) (squared_relu); biases on q / k / v / o
  and up / down together (attention_bias with mlp_bias) or none.
- Cohere (cohere: Command R 35B / 08-2024, Aya 23, Aya Expanse 8B / 32B) is a parallel-residual layer, x +
  attn(ln(x)) + mlp(ln(x)), with one weight-only LayerNorm (parallel_residual, layernorm_bias false), RoPE on
  interleaved pairs of the whole head, tied embeddings and the logits times logit_scale (output_multiplier_scale);
  per-head q / k norms (use_qk_norm: Command R+) are refused. Cohere 2 (cohere2: Command R7B, Command A) is that layer
  with EXAONE 4.0's hybrid layers: three of four sliding with RoPE, the fourth full without (hf_config's
  sliding_nope_args).
- Phi-2 (phi: phi-2, phi-1_5, phi-1) is Cohere's parallel-residual layer with LayerNorms that have biases, biases on
  every linear layer and on lm_head (add_output_layer_bias), an MLP without a gate, fc2(gelu_tanh(fc1(x)))
  (openai_gelu), and RoPE on the first partial_rotary_factor of each head (Llama's pairs); its per-head q / k
  LayerNorms (qk_layernorm: true, in no release) are refused, its dropouts not taken (RL trains without dropout).
- GPT-NeoX (gpt_neox: Pythia 14M-12B and its deduped / -v0 checkpoints, GPT-NeoX-20B, Dolly v2, RedPajama-INCITE,
  StableLM-Alpha, OpenAssistant's Pythia SFT models) is multi-head attention with LayerNorms that have biases and
  biases on every linear layer, q / k / v stored per head in one query_key_value (hf_bridge/names.py), RoPE on the
  first rotary_pct of each head (Llama's pairs), an MLP without a gate, dense_4h_to_h(gelu(dense_h_to_4h(x))) (exact
  GELU; gelu_fast / gelu_new / gelu_pytorch_tanh: the tanh one, openai_gelu), untied embed_out. With
  use_parallel_residual (every release but a few Japanese ones) the layer is x + attn(ln1(x)) + mlp(ln2(x)): Cohere's
  parallel residual with the MLP's own norm (parallel_residual_mlp_norm); without it, megatron's usual layer.
  attention_bias false (no q / k / v / o biases, yet the MLP's) is refused: Megatron has biases on every linear
  layer or none.
- Falcon (falcon: Falcon-7B / 40B / 180B and their -instruct models, Falcon2-11B) is LayerNorms with biases, RoPE on
  whole heads (Llama's pairs), an MLP without a gate, dense_4h_to_h(gelu(dense_h_to_4h(x))) (exact GELU, the only
  activation vLLM's Falcon computes), biases on every linear
  layer or none (bias), tied embeddings by default, q / k / v stored in one query_key_value per key / value head
  ([its queries | k | v]; hf_bridge/names.py): multi-query (multi_query: Falcon-7B, one key / value head), grouped
  (new_decoder_architecture: num_kv_heads) or per head. Its layer is Cohere's parallel residual with one norm
  (parallel_attn; new_decoder_architecture with num_ln_in_parallel_attn 1: Falcon2-11B), GPT-NeoX's with two (ln_attn,
  ln_mlp: new_decoder_architecture, Falcon-40B / 180B), or megatron's usual one (parallel_attn false). ALiBi
  (Falcon-RW) is refused.
- Jais 2 (jais2: Jais-2-8B-Chat) is StableLM's LayerNorms (weight and bias) on Llama's attention with RoPE on whole
  heads and Nemotron's MLP without a gate, down_proj(relu(up_proj(x))^2) (squared_relu), biases on every linear layer
  (attention_bias with mlp_bias, both true in its releases) or none.
- OLMo (olmo: OLMo-1B / 7B-hf, -0424, -0724, -Instruct) is Llama's layout (SwiGLU, no biases, RoPE on whole heads)
  with LayerNorms that have neither weight nor bias, in fp32 with eps 1e-5 (layernorm_affine false), and the
  queries, keys and values clamped to +-clip_qkv where config.json says (0424 / 0724: models/olmo.py).
"""
from __future__ import annotations

from typing import Any, Mapping

LAYERNORM_ARCHS = ("stablelm", "starcoder2", "nemotron", "cohere", "cohere2", "phi", "gpt_neox", "falcon", "olmo", "jais2")
NEOX_GELU = {"gelu": False, "gelu_fast": True, "gelu_new": True, "gelu_pytorch_tanh": True}  # -> openai_gelu
# config.json's activation key and the values taken (-> openai_gelu), checked here: GPT-NeoX's exact or tanh GELU;
# Falcon's exact GELU only (vLLM's Falcon computes it whatever config.json says; every release says gelu)
OWN_ACTIVATION = {"gpt_neox": ("hidden_act", NEOX_GELU), "falcon": ("activation", {"gelu": False})}
# the names Falcon's first config.json used (transformers' FalconConfig reads n_embed; older ones the others too)
FALCON_ALIASES = {"n_embed": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
                  "n_head_kv": "num_kv_heads"}


def falcon_keys(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A Falcon config.json in the keys the reader takes: its old names (FALCON_ALIASES), its key / value heads as
    num_key_value_heads (falcon_kv_heads), its MLP width as intermediate_size (ffn_hidden_size, 4 x hidden_size
    unset); transformers reads no head_dim for it."""
    hf = {FALCON_ALIASES.get(k, k): v for k, v in hf.items() if k != "head_dim"}
    return dict(hf, num_key_value_heads=falcon_kv_heads(hf),
                intermediate_size=int(hf.get("ffn_hidden_size") or 4 * int(hf["hidden_size"])))


def falcon_kv_heads(hf: Mapping[str, Any]) -> int:
    """Falcon's key / value heads: num_kv_heads with new_decoder_architecture, one with multi_query, else one per
    head (transformers' FalconAttention, vLLM's load_weights)."""
    hf = {FALCON_ALIASES.get(k, k): v for k, v in hf.items()}
    if hf.get("new_decoder_architecture"):
        return int(hf.get("num_kv_heads") or hf["num_attention_heads"])
    return 1 if hf.get("multi_query", True) else int(hf["num_attention_heads"])


def falcon_norms(hf: Mapping[str, Any]) -> int:
    """Falcon's norms per layer before attention and MLP: 2 (ln_attn, ln_mlp) with new_decoder_architecture unless
    num_ln_in_parallel_attn says 1; a parallel layer's one; 2 for the sequential layer (input_layernorm,
    post_attention_layernorm)."""
    if hf.get("new_decoder_architecture"):
        return int(hf.get("num_ln_in_parallel_attn") or 2)
    return 1 if hf.get("parallel_attn", True) else 2


def neox_keys(hf: Mapping[str, Any]) -> dict[str, Any]:
    """A GPT-NeoX config.json with its releases' RoPE keys (rotary_pct, rotary_emb_base: transformers 4.x's spelling)
    read as the ones the reader takes (partial_rotary_factor, rope_theta), where rope_parameters (5.x) lacks them; its
    attention is multi-head with heads of hidden_size / num_attention_heads whatever else it says (transformers reads
    no num_key_value_heads or head_dim for it)."""
    hf = {k: v for k, v in hf.items() if k not in ("num_key_value_heads", "head_dim")}
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("partial_rotary_factor") is None and hf.get("partial_rotary_factor") is None:
        hf["partial_rotary_factor"] = float(hf["rotary_pct"])
    if rope.get("rope_theta") is None and hf.get("rope_theta") is None:
        hf["rope_theta"] = float(hf["rotary_emb_base"])
    return hf


def layernorm_checks(hf: Mapping[str, Any], model_type: str) -> None:
    """Refuse, in one sentence, what these models' config.json can say and Megatron's layers cannot."""
    if model_type == "stablelm" and (hf.get("use_parallel_residual") or hf.get("qk_layernorm")):
        raise ValueError(f"config.json {'use_parallel_residual' if hf.get('use_parallel_residual') else 'qk_layernorm'}"
                         f"=true (StableLM 2 12B's layout) is not supported; StableLM 2 1.6B's (both false) is.")
    if model_type == "phi" and hf.get("qk_layernorm"):
        raise ValueError("config.json qk_layernorm=true (per-head LayerNorms on q and k) is not supported for phi; "
                         "Phi-2's and Phi-1.5's releases (false) are.")
    if model_type in ("cohere", "cohere2") and hf.get("use_qk_norm"):
        raise ValueError("config.json use_qk_norm=true (Command R+'s per-head LayerNorms on q and k) is not supported; "
                         "Command R's, Aya's and Command R7B's (false) are.")
    if model_type in ("nemotron", "jais2") and bool(hf.get("mlp_bias")) != bool(hf.get("attention_bias")):
        raise ValueError(f"config.json attention_bias={bool(hf.get('attention_bias'))} with "
                         f"mlp_bias={bool(hf.get('mlp_bias'))} is not supported for {model_type}: Megatron has biases on "
                         f"every linear layer or none ({'Nemotron' if model_type == 'nemotron' else 'Jais 2'}'s releases "
                         f"have {'none' if model_type == 'nemotron' else 'both'}).")
    if model_type == "falcon":
        if hf.get("alibi"):
            raise ValueError("config.json alibi=true (ALiBi positions: Falcon-RW) is not supported; Falcon's releases "
                             "with RoPE (alibi false) are.")
        if hf.get("new_decoder_architecture") and falcon_norms(hf) == 1 and not hf.get("parallel_attn", True):
            raise ValueError("config.json new_decoder_architecture with num_ln_in_parallel_attn 1 and "
                             "parallel_attn=false is not a layer transformers can run; set parallel_attn: true.")
    if model_type not in OWN_ACTIVATION:
        return
    act, taken = OWN_ACTIVATION[model_type]
    if hf.get(act) not in taken:
        raise ValueError(f"config.json {act} {hf.get(act)!r} is not supported for {model_type}; only "
                         f"{', '.join(taken)} (GELU{', exact or with the tanh approximation' if len(taken) > 1 else ''}).")
    if model_type == "gpt_neox" and not hf.get("attention_bias"):
        raise ValueError("config.json attention_bias=false is not supported for gpt_neox: its MLP keeps its biases, "
                         "and Megatron has biases on every linear layer or none (the releases: true).")


def layernorm_args(hf: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """What a LayerNorm model's layers add to Llama's args (module docstring); `hf` with transformers' defaults."""
    if model_type == "stablelm":  # StableLM 2: LayerNorms with biases (megatron's LayerNorm) on Llama's layout
        return {"normalization": "LayerNorm"}
    if model_type == "starcoder2":  # StarCoder2: LayerNorms, gelu(c_fc(x)) without a gate, biases on every linear
        bias = bool(hf.get("use_bias"))
        return dict(normalization="LayerNorm", swiglu=False, openai_gelu=True, add_qkv_bias=bias,
                    disable_bias_linear=not bias)
    if model_type == "nemotron":  # Nemotron: LayerNorm1P (1 + w, its bias), relu(up_proj(x))^2, biases on all or none
        bias = bool(hf.get("attention_bias"))
        return dict(normalization="LayerNorm", apply_layernorm_1p=True, swiglu=False, squared_relu=True,
                    add_qkv_bias=bias, disable_bias_linear=not bias)
    if model_type in ("cohere", "cohere2"):  # Cohere: x + attn(ln x) + mlp(ln x), weight-only LayerNorms, GLM's pairs
        args = dict(normalization="LayerNorm", layernorm_bias=False, parallel_residual=True, rotary_interleaved=True)
        if float(hf["logit_scale"]) != 1.0:
            args["output_multiplier_scale"] = float(hf["logit_scale"])
        return args
    if model_type == "phi":  # Phi-2: Cohere's layer with LayerNorm biases, biases everywhere, fc2(gelu_tanh(fc1(x)))
        return dict(normalization="LayerNorm", parallel_residual=True, swiglu=False, openai_gelu=True,
                    add_qkv_bias=True, disable_bias_linear=False, add_output_layer_bias=True)
    if model_type == "gpt_neox":  # GPT-NeoX: x + attn(ln1 x) + mlp(ln2 x), biases everywhere, gelu without a gate
        parallel = bool(hf.get("use_parallel_residual"))
        return dict(normalization="LayerNorm", parallel_residual=parallel, parallel_residual_mlp_norm=parallel,
                    swiglu=False, openai_gelu=NEOX_GELU[hf["hidden_act"]], add_qkv_bias=True,
                    disable_bias_linear=False)
    if model_type == "jais2":  # Jais 2: StableLM's LayerNorms, Nemotron's relu(up_proj(x))^2, biases on all or none
        bias = bool(hf.get("attention_bias"))
        return dict(normalization="LayerNorm", swiglu=False, squared_relu=True, add_qkv_bias=bias,
                    disable_bias_linear=not bias)
    if model_type == "olmo":  # OLMo 1: LayerNorms without weight or bias, eps 1e-5 whatever config.json says
        return dict(normalization="LayerNorm", layernorm_affine=False, norm_epsilon=1e-5)
    if model_type == "falcon":  # Falcon: one or two norms beside each other, or in sequence; biases on all or none
        parallel = bool(hf.get("new_decoder_architecture") or hf.get("parallel_attn", True))
        bias = bool(hf.get("bias"))
        return dict(normalization="LayerNorm", parallel_residual=parallel,
                    parallel_residual_mlp_norm=parallel and falcon_norms(hf) == 2, swiglu=False,
                    openai_gelu=False, add_qkv_bias=bias, disable_bias_linear=not bias)
    raise ValueError(f"model_type {model_type!r} has no LayerNorm layout here.")
