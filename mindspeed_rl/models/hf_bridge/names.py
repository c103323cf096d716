"""HF tensor names an architecture stores differently from the bridge's canonical ones.

The bridge (hf_bridge/mapping.py) names HF tensors one way for every architecture (Llama / Qwen
layer names, Qwen-MoE expert names). Two kinds of difference exist:

- other names for the same tensor: Mixtral's checkpoints (and vLLM's Mixtral) call the router
  `block_sparse_moe.gate` and an expert's gate / up / down projections w1 / w3 / w2; Gemma 3 calls
  the pre-MLP norm `pre_feedforward_layernorm` and the norm on the attention output
  `post_attention_layernorm`, Llama's name of the pre-MLP norm (`stored_name` / `canonical_name`);
- several canonical tensors stored as one, concatenated along the rows: Phi-3's `qkv_proj` is
  [q_proj; k_proj; v_proj] and its `gate_up_proj` is [gate_proj; up_proj] (`fused_parts`,
  `fuse`); the row counts come from config.json.
- several canonical tensors stored as one whose rows are grouped per head group: Qwen3-Next's Gated
  DeltaNet projections in_proj_qkvz / in_proj_ba, per key head (`grouped_parts`, `group`); Granite
  4.0-H's Mamba-2 in_proj [z | x | B | C | dt] and conv1d [x | B | C] are the one-group case;
- every expert of a layer stored as one stacked tensor per projection (gpt-oss: `_STACKED`,
  `stacked_parts` / `stacked_expert` to read one expert, `stack_experts` to write them), its release
  in MXFP4.

The places where names meet the outside apply them: reading a HF directory
(checkpoint_io.SafetensorsReader serves the canonical names, a fused tensor's parts as row ranges
of it) and writing one (hf_export.write_shard); vLLM's load_weights takes Mixtral's names
(rollout/vllm_engine.py) and, for Phi-3, the canonical q/k/v and gate/up (its Llama loader stacks
them). Everything between sees canonical names only.
"""
from __future__ import annotations

import re

import torch

from mindspeed_rl.models.hf_config import HF_DEFAULTS, IMAGE_TEXT_ARCHS
from mindspeed_rl.models.hf_layernorm_config import FALCON_ALIASES, falcon_kv_heads, falcon_norms

# config.json model_type -> (canonical layer-relative name, that architecture's), {e} = expert number
_STORED_AS = {
    "mixtral": (("mlp.experts.{e}.gate_proj.weight", "block_sparse_moe.experts.{e}.w1.weight"),
                ("mlp.experts.{e}.up_proj.weight", "block_sparse_moe.experts.{e}.w3.weight"),
                ("mlp.experts.{e}.down_proj.weight", "block_sparse_moe.experts.{e}.w2.weight"),
                ("mlp.gate.weight", "block_sparse_moe.gate.weight")),
    # Gemma's pre-MLP norm is pre_feedforward_layernorm, and its post_attention_layernorm normalises
    # the attention output (canonical post_self_attn_layernorm); the first match renames
    "gemma3_text": (("post_attention_layernorm.weight", "pre_feedforward_layernorm.weight"),
                    ("post_self_attn_layernorm.weight", "post_attention_layernorm.weight")),
}
_STORED_AS["gemma2"] = _STORED_AS["gemma3_text"]  # Gemma 2's names are Gemma 3's
_STORED_AS["vaultgemma"] = _STORED_AS["gemma3_text"][:1]  # VaultGemma: Gemma 2's pre-MLP norm name, no post norms
# and Gemma 4's (with its layer_scalar: hf_bridge/mapping.py); 26B-A4B's router as router.proj (experts: _STACKED)
_STORED_AS["gemma4_text"] = (*_STORED_AS["gemma3_text"], ("mlp.gate.weight", "router.proj.weight"))
_STORED_AS["olmo2"] = _STORED_AS["gemma3_text"][1:]  # OLMo 2: the post norms alone, Gemma's names
_STORED_AS["olmo3"] = _STORED_AS["olmo2"]  # OLMo 3's names are OLMo 2's
_STORED_AS["exaone4"] = _STORED_AS["olmo2"]  # EXAONE 4.0's post norms: OLMo 2's names
# HunYuan: Qwen3's per-head q / k norms (applied after RoPE) named for what they normalise
_STORED_AS["hunyuan_v1_dense"] = (("self_attn.q_norm.weight", "self_attn.query_layernorm.weight"),
                                  ("self_attn.k_norm.weight", "self_attn.key_layernorm.weight"))
# HunYuan-MoE: those norms, the router as gate.wg, the shared expert (without a gate) as shared_mlp
_STORED_AS["hunyuan_v1_moe"] = (*_STORED_AS["hunyuan_v1_dense"], ("mlp.gate.weight", "mlp.gate.wg.weight"),
                                *((f"mlp.shared_expert.{n}_proj.weight", f"mlp.shared_mlp.{n}_proj.weight")
                                  for n in ("gate", "up", "down")))
_STORED_AS["flex_olmo"] = _STORED_AS["olmo2"]  # FlexOlmo: OLMo 2's layers, Qwen-MoE's (canonical) expert names
# GLM-4.5 calls the shared expert shared_experts (Qwen2-MoE: shared_expert)
_STORED_AS["glm4_moe"] = tuple((f"mlp.shared_expert.{n}_proj.weight", f"mlp.shared_experts.{n}_proj.weight")
                               for n in ("gate", "up", "down"))
# DeepSeek-V3: GLM-4.5's shared_experts, and its multi-latent attention's query norm (canonical q_norm)
_STORED_AS["deepseek_v3"] = (*_STORED_AS["glm4_moe"], ("self_attn.q_norm.weight", "self_attn.q_a_layernorm.weight"))
_STORED_AS["deepseek_v2"] = _STORED_AS["deepseek_v3"]  # DeepSeek-V2's names are V3's
_STORED_AS["kimi_k2"] = _STORED_AS["deepseek_v3"]  # Kimi K2's checkpoints are DeepSeek-V3's (hf_config.SAME_AS)
_STORED_AS["sarvam_mla"] = _STORED_AS["deepseek_v3"]  # and Sarvam-105B's
_STORED_AS["dots1"] = _STORED_AS["glm4_moe"]  # dots.llm1's names are DeepSeek-V3's MoE names, GLM-4.5's
_STORED_AS["solar_open"] = _STORED_AS["glm4_moe"]  # and Solar Open's
_STORED_AS["glm4_moe_lite"] = _STORED_AS["deepseek_v3"]  # GLM-4.7-Flash's names are DeepSeek-V3's
_STORED_AS["youtu"] = _STORED_AS["deepseek_v3"]  # Youtu-LLM's attention names are DeepSeek-V3's (its MLP Llama's)
# nanochat: its MLP without a gate as CLIP's fc1 / fc2 (it has no norm weights at all)
_STORED_AS["nanochat"] = (("mlp.up_proj.weight", "mlp.fc1.weight"), ("mlp.down_proj.weight", "mlp.fc2.weight"))
# MiniMax-M2: Mixtral's names, its expert bias beside the router (GLM-4.5's is the router's own)
_STORED_AS["minimax_m2"] = (*_STORED_AS["mixtral"],
                            ("mlp.gate.e_score_correction_bias", "block_sparse_moe.e_score_correction_bias"))
# ERNIE 4.5 MoE: GLM-4.5's shared_experts, its expert bias in the experts' statistics beside the router (stored
# (1, E): _LEADING_ONE)
_STORED_AS["ernie4_5_moe"] = (*_STORED_AS["glm4_moe"],
                              ("mlp.gate.e_score_correction_bias", "mlp.moe_statics.e_score_correction_bias"))
# gpt-oss calls the router `router` (its experts are stacked: _STACKED)
_STORED_AS["gpt_oss"] = (("mlp.gate.weight", "mlp.router.weight"), ("mlp.gate.bias", "mlp.router.bias"))
# Apertus names its pre-attention and pre-MLP norms after what they precede
_STORED_AS["apertus"] = (("input_layernorm.weight", "attention_layernorm.weight"),
                         ("post_attention_layernorm.weight", "feedforward_layernorm.weight"))
# GLM-4 names its norm on the attention output as the canonical name does, the one on the MLP output its own way
_STORED_AS["glm4"] = (("post_feedforward_layernorm.weight", "post_mlp_layernorm.weight"),)
# Granite's MoE models: the router as block_sparse_moe.router.layer (the experts stacked: _STACKED), the shared MLP
# (without a gate) as shared_mlp, its gate / up fused as input_linear (_FUSED); Granite 4.0's dense models
# (granitemoehybrid without experts: names_type) call their only MLP shared_mlp
_STORED_AS["granitemoe"] = (("mlp.gate.weight", "block_sparse_moe.router.layer.weight"),)
_STORED_AS["granitemoeshared"] = (*_STORED_AS["granitemoe"],
                                  ("mlp.shared_expert.down_proj.weight", "shared_mlp.output_linear.weight"))
_STORED_AS["granitemoehybrid"] = _STORED_AS["granitemoeshared"]
_STORED_AS["granitemoehybrid_dense"] = (("mlp.down_proj.weight", "shared_mlp.output_linear.weight"),)
# Nemotron-H: each layer's one block is its `mixer` (attention's q / k / v / o, the MLP's up / down, Mamba-2's
# tensors; its in_proj and conv1d grouped: _GROUPED) behind its one `norm`, which is the canonical input_layernorm
# (Mamba-2 / attention layers) or post_attention_layernorm (MLP layers) by the layer's block (_ONE_NORM)
_STORED_AS["nemotron_h"] = (*((f"self_attn.{p}_proj.weight", f"mixer.{p}_proj.weight") for p in "qkvo"),
                            *((f"mlp.{p}_proj.weight", f"mixer.{p}_proj.weight") for p in ("up", "down")),
                            *((f"mamba.{k}", f"mixer.{k}") for k in ("A_log", "D", "dt_bias", "norm.weight",
                                                                       "out_proj.weight")),
                            # its MoE layers (Nemotron 3): the router with its expert bias, experts and the shared
                            # expert without a gate (one tensor per expert: transformers 5 stacks them as it loads)
                            *((f"mlp.gate.{k}", f"mixer.gate.{k}") for k in ("weight", "e_score_correction_bias")),
                            *((f"mlp.experts.{{e}}.{p}_proj.weight", f"mixer.experts.{{e}}.{p}_proj.weight")
                              for p in ("up", "down")),
                            *((f"mlp.shared_expert.{p}_proj.weight", f"mixer.shared_experts.{p}_proj.weight")
                              for p in ("up", "down")),
                            ("input_layernorm.weight", "norm.weight"), ("post_attention_layernorm.weight", "norm.weight"))
# Falcon-H1: its pre-MLP norm as pre_ff_layernorm, its MLP as feed_forward (Mamba-2's tensors under mamba.*, as
# Granite 4.0-H's: _GROUPED; its final norm: _PREFIX_AS)
_STORED_AS["falcon_h1"] = (("post_attention_layernorm.weight", "pre_ff_layernorm.weight"),
                           *((f"mlp.{p}_proj.weight", f"feed_forward.{p}_proj.weight") for p in ("gate", "up", "down")))
# LFM2: its norms named for what they precede (operator_norm before the attention or conv, ffn_norm before the MLP),
# o_proj as out_proj, Qwen3's q / k norms as q_layernorm / k_layernorm, the MLP's gate / up / down as w1 / w3 / w2
# (its conv layers' in_proj / conv / out_proj are stored as the bridge names them: hf_bridge/mapping.py; its final
# norm: _PREFIX_AS)
_STORED_AS["lfm2"] = (("input_layernorm.weight", "operator_norm.weight"),
                      ("post_attention_layernorm.weight", "ffn_norm.weight"),
                      ("self_attn.o_proj.weight", "self_attn.out_proj.weight"),
                      *((f"self_attn.{p}_norm.weight", f"self_attn.{p}_layernorm.weight") for p in "qk"),
                      *((f"mlp.{p}_proj.weight", f"feed_forward.{w}.weight")
                        for p, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))))
# LFM2-MoE: LFM2's names, its experts under feed_forward.experts (Mixtral's w1 / w3 / w2, one tensor per expert), its
# router feed_forward.gate and expert bias feed_forward.expert_bias
_STORED_AS["lfm2_moe"] = (*_STORED_AS["lfm2"],
                          *((f"mlp.experts.{{e}}.{p}_proj.weight", f"feed_forward.experts.{{e}}.{w}.weight")
                            for p, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))),
                          ("mlp.gate.weight", "feed_forward.gate.weight"),
                          ("mlp.gate.e_score_correction_bias", "feed_forward.expert_bias"))
# EXAONE 3.0 / 3.5: Llama's tensors under GPT-2-style names (its model transformer.*: _PREFIX_AS)
_STORED_AS["exaone"] = (*((f"self_attn.{p}_proj.weight", f"attn.attention.{p}_proj.weight") for p in "qkv"),
                        ("self_attn.o_proj.weight", "attn.attention.out_proj.weight"),
                        ("input_layernorm.weight", "ln_1.weight"), ("post_attention_layernorm.weight", "ln_2.weight"),
                        *((f"mlp.{p}_proj.weight", f"mlp.{s}.weight")
                          for p, s in (("gate", "c_fc_0"), ("up", "c_fc_1"), ("down", "c_proj"))))
# EXAONE MoE: GLM-4.5's shared_experts, its expert bias under the MoE block rather than its router
_STORED_AS["exaone_moe"] = (*_STORED_AS["glm4_moe"], ("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"))
# Hy3: the router as mlp.router.gate, its expert bias as mlp.expert_bias, the shared experts as shared_mlp
_STORED_AS["hy_v3"] = (("mlp.gate.weight", "mlp.router.gate.weight"), ("mlp.gate.e_score_correction_bias", "mlp.expert_bias"),
                       *((f"mlp.shared_expert.{n}_proj.weight", f"mlp.shared_mlp.{n}_proj.weight")
                         for n in ("gate", "up", "down")))
# AFMoE: Hy3's router and expert bias names, GLM-4.5's shared_experts, its norms named for what they follow or precede
# (post_attention_layernorm on the attention output, pre_mlp_layernorm before the MLP, post_mlp_layernorm after it)
_STORED_AS["afmoe"] = (*_STORED_AS["hy_v3"][:2], *_STORED_AS["glm4_moe"],
                       ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
                       ("post_self_attn_layernorm.weight", "post_attention_layernorm.weight"),
                       ("post_feedforward_layernorm.weight", "post_mlp_layernorm.weight"))
# Sarvam MoE: Ling's (Bailing's) names for GLM-4.5's tensors: the attention as attention.* (q / k / v fused as
# query_key_value: _FUSED; o_proj as dense; q / k norms as query_layernorm / key_layernorm), the expert bias beside the
# router as gate.expert_bias, the shared experts as shared_experts (its embedding: _PREFIX_AS)
_STORED_AS["sarvam_moe"] = (("self_attn.o_proj.weight", "attention.dense.weight"),
                            ("self_attn.q_norm.weight", "attention.query_layernorm.weight"),
                            ("self_attn.k_norm.weight", "attention.key_layernorm.weight"),
                            ("mlp.gate.e_score_correction_bias", "mlp.gate.expert_bias"), *_STORED_AS["glm4_moe"])
# HyperCLOVA X (Peri-LN): the norms on the attention and MLP outputs as post_norm1 / post_norm2
_STORED_AS["hyperclovax"] = (("post_self_attn_layernorm.weight", "post_norm1.weight"),
                             ("post_feedforward_layernorm.weight", "post_norm2.weight"))
_ONE_NORM = {"nemotron_h": "norm.weight"}  # model_type -> its layers' one norm (hybrid_pattern.py)


# StarCoder2 calls its MLP without a gate c_fc (up) and c_proj (down), with biases
# Phi-2: o_proj as dense, up / down as fc1 / fc2 (with biases), the final norm as final_layernorm
_STORED_AS["phi"] = (*((f"self_attn.o_proj.{k}", f"self_attn.dense.{k}") for k in ("weight", "bias")),
                     *((f"mlp.{c}_proj.{k}", f"mlp.{s}.{k}") for c, s in (("up", "fc1"), ("down", "fc2"))
                       for k in ("weight", "bias")),
                     *((f"norm.{k}", f"final_layernorm.{k}") for k in ("weight", "bias")))
# GPT-NeoX / Pythia: o_proj as attention.dense, up / down as dense_h_to_4h / dense_4h_to_h (with biases); its model's
# own names (gpt_neox.*, embed_out) are _PREFIX_AS's, its q / k / v one per-head query_key_value (_GROUPED)
_NEOX_MLP = tuple((f"mlp.{c}_proj.{k}", f"mlp.{s}.{k}") for c, s in (("up", "dense_h_to_4h"), ("down", "dense_4h_to_h"))
                  for k in ("weight", "bias"))  # GPT-NeoX's and Falcon's up / down
_STORED_AS["gpt_neox"] = (*((f"self_attn.o_proj.{k}", f"attention.dense.{k}") for k in ("weight", "bias")), *_NEOX_MLP)
# Falcon: o_proj as self_attention.dense, up / down as GPT-NeoX's; with two norms beside each other
# (new_decoder_architecture: names_type's falcon_2ln) the pre-attention one ln_attn, the MLP's ln_mlp
_STORED_AS["falcon"] = (*((f"self_attn.o_proj.{k}", f"self_attention.dense.{k}") for k in ("weight", "bias")),
                        *_NEOX_MLP)
_STORED_AS["falcon_2ln"] = (*_STORED_AS["falcon"],
                            *((f"{c}.{k}", f"{s}.{k}") for c, s in (("input_layernorm", "ln_attn"),
                                                                     ("post_attention_layernorm", "ln_mlp"))
                              for k in ("weight", "bias")))
_STORED_AS["starcoder2"] = tuple((f"mlp.{c}_proj.{k}", f"mlp.{s}.{k}") for c, s in (("up", "c_fc"), ("down", "c_proj"))
                                 for k in ("weight", "bias"))


def names_type(config) -> str | None:
    """The key of a config.json's tensor names in the tables here: its model_type, except Granite 4.0's dense models
    (granitemoehybrid without experts: `granitemoehybrid_dense`), whose shared_mlp is their only MLP, Falcon's
    with two norms beside each other (`falcon_2ln`: ln_attn, ln_mlp), and EXAONE 3.x and Sarvam MoE by their
    architecture (the vLLM engine gives them to vLLM as llama / glm4_moe model_types: rollout/vllm_hf_config.vllm_config)."""
    model_type = (config or {}).get("model_type")
    if list((config or {}).get("architectures") or ()) == ["ExaoneForCausalLM"]:  # (the vLLM engine's llama-typed EXAONE)
        return "exaone"
    if list((config or {}).get("architectures") or ()) == ["SarvamMoEForCausalLM"]:  # (and its GLM-4.5-typed Sarvam MoE)
        return "sarvam_moe"
    if model_type == "granitemoehybrid" and not int(config.get("num_local_experts", 8) or 0):
        return "granitemoehybrid_dense"
    if model_type == "falcon" and config.get("new_decoder_architecture") and falcon_norms(config) == 2:
        return "falcon_2ln"
    return model_type


def _renames(pairs, reverse: bool):
    """(regex of one side's suffix, the other side's replacement) for each pair."""
    out = []
    for canonical, stored in pairs:
        src, dst = (stored, canonical) if reverse else (canonical, stored)
        pattern = re.compile(r"\." + re.escape(src).replace(re.escape("{e}"), r"(\d+)") + "$")
        out.append((pattern, "." + dst.replace("{e}", r"\1")))
    return tuple(out)


_TO_STORED = {t: _renames(pairs, reverse=False) for t, pairs in _STORED_AS.items()}
# config.json model_type -> (canonical name prefix, that architecture's) for the tensors outside the layers and the
# layers' own prefix: GPT-NeoX's model is gpt_neox (its embedding embed_in, its final norm final_layer_norm), its
# lm_head embed_out. stored_name renames the layer-relative part first (_STORED_AS), then the prefix.
_PREFIX_AS = {"gpt_neox": (("model.layers.", "gpt_neox.layers."), ("model.embed_tokens.", "gpt_neox.embed_in."),
                           ("model.norm.", "gpt_neox.final_layer_norm."), ("lm_head.", "embed_out.")),
              # Falcon's model is transformer (its layers h, its embedding word_embeddings, its final norm ln_f)
              "falcon": (("model.layers.", "transformer.h."), ("model.embed_tokens.", "transformer.word_embeddings."),
                         ("model.norm.", "transformer.ln_f."))}
_PREFIX_AS["falcon_2ln"] = _PREFIX_AS["falcon"]
# Nemotron-H's model is backbone (its embedding embeddings, its final norm norm_f), as its releases and transformers 5
# save it; read from model.* too (transformers' own module names), written as backbone.*
_PREFIX_AS["nemotron_h"] = (("model.layers.", "backbone.layers."), ("model.embed_tokens.", "backbone.embeddings."),
                            ("model.norm.", "backbone.norm_f."), ("model.embed_tokens.", "model.embeddings."),
                            ("model.norm.", "model.norm_f."))
_PREFIX_AS["falcon_h1"] = (("model.norm.", "model.final_layernorm."),)  # Falcon-H1's final norm
_PREFIX_AS["exaone"] = (("model.layers.", "transformer.h."), ("model.embed_tokens.", "transformer.wte."),
                        ("model.norm.", "transformer.ln_f."))  # EXAONE 3.0 / 3.5's model, embedding and final norm
_PREFIX_AS["lfm2"] = _PREFIX_AS["lfm2_moe"] = (("model.norm.", "model.embedding_norm."),)  # LFM2's final norm
_PREFIX_AS["sarvam_moe"] = (("model.embed_tokens.", "model.word_embeddings."),)  # Sarvam MoE's (Ling's) embedding


def _prefix(name: str, model_type: str | None, reverse: bool) -> str:
    """`name` with `model_type`'s prefix (_PREFIX_AS) renamed: canonical -> stored, or back with `reverse`."""
    for canonical, stored in _PREFIX_AS.get(model_type or "", ()):
        src, dst = (stored, canonical) if reverse else (canonical, stored)
        if name.startswith(src):
            return dst + name[len(src):]
    return name
_TO_CANONICAL = {t: _renames(pairs, reverse=True) for t, pairs in _STORED_AS.items()}
_TO_CANONICAL["nemotron_h"] = _renames(_STORED_AS["nemotron_h"][:-2], reverse=True)  # its norm: _ONE_NORM

# image-text model_type -> (its text model's model_type, the prefixes its checkpoints put before the
# text model's names -> the text model's own): transformers 4.x saves Gemma 3 4B+ and Mistral Small 3.1
# as language_model.model.layers... (language_model.lm_head), 5.x as model.language_model.layers...
# (lm_head); the vision tower's names match none and are never read (models/hf_config.text_model_config)
_LANGUAGE_MODEL = (("language_model.", ""), ("model.language_model.", "model."))
_PREFIXED = {kind: (text_type, _LANGUAGE_MODEL) for kind, (text_type, _) in IMAGE_TEXT_ARCHS.items()}


# config.json model_type -> {stored layer-relative name: the canonical ones it concatenates (rows)}
_FUSED = {
    "phi3": {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                           "self_attn.v_proj.weight"),
             "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")},
    "glm4": {"mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")},  # q / k / v apart
    # Granite's shared MLP (shared_intermediate_size wide: part_rows); Granite 4.0's dense models' only MLP
    "granitemoeshared": {"shared_mlp.input_linear.weight": ("mlp.shared_expert.gate_proj.weight",
                                                            "mlp.shared_expert.up_proj.weight")},
    "granitemoehybrid_dense": {"shared_mlp.input_linear.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")},
}
_FUSED["granitemoehybrid"] = _FUSED["granitemoeshared"]
# Sarvam MoE (Ling's names): q / k / v as attention.query_key_value, biases too (use_qkv_bias)
_FUSED["sarvam_moe"] = {f"attention.query_key_value.{k}": tuple(f"self_attn.{p}_proj.{k}" for p in "qkv")
                        for k in ("weight", "bias")}
_FUSED["glm"] = _FUSED["glm4"]  # GLM-4 (glm-4-9b-hf): gate / up fused as GLM-4-0414's
_LAYER = re.compile(r"^(model\.layers\.\d+\.)(.+)$")


# config.json model_type -> {stored layer-relative name: (what its rows are made of, the canonical parts)}:
# several canonical tensors stored as one whose rows are grouped per head group rather than one part after
# another. Qwen3-Next keeps Gated DeltaNet's projections per key head: in_proj_qkvz holds, per key head,
# [q (dk) | k (dk) | v (r dv) | z (r dv)] (r value heads per key head), in_proj_ba [b (r) | a (r)]; the
# canonical (Qwen3.5's) in_proj_qkv is [every head's q | every head's k | every head's v], in_proj_z / _b /
# _a their own. A part names the slots of each group it holds, in order: in_proj_qkv = slots (0, 1, 2), so
# its rows are slot 0 of every group, then slot 1 of every group, then slot 2 (vLLM's qwen3_5 mapping says
# the same). `_group_widths` gives (groups, slot widths) from config.json.
_GROUPED = {
    "qwen3_next": {
        "linear_attn.in_proj_qkvz.weight": ("delta_qkvz", (("linear_attn.in_proj_qkv.weight", (0, 1, 2)),
                                                           ("linear_attn.in_proj_z.weight", (3,)))),
        "linear_attn.in_proj_ba.weight": ("delta_ba", (("linear_attn.in_proj_b.weight", (0,)),
                                                       ("linear_attn.in_proj_a.weight", (1,)))),
    },
    # GPT-NeoX: per attention head [q (d) | k (d) | v (d)] (its weight and its bias; megatron's linear_qkv for MHA)
    "gpt_neox": {f"attention.query_key_value.{k}": ("neox_qkv", tuple((f"self_attn.{p}_proj.{k}", (i,))
                                                                      for i, p in enumerate("qkv")))
                 for k in ("weight", "bias")},
    # Falcon: per key / value head [its queries (r d) | k (d) | v (d)], r = heads per key / value head
    # (hf_layernorm_config.falcon_kv_heads; megatron's linear_qkv layout), its weight and its bias
    "falcon": {f"self_attention.query_key_value.{k}": ("falcon_qkv", tuple((f"self_attn.{p}_proj.{k}", (i,))
                                                                           for i, p in enumerate("qkv")))
               for k in ("weight", "bias")},
}
_GROUPED["falcon_2ln"] = _GROUPED["falcon"]
# Granite 4.0-H's Mamba-2 mixer: in_proj is [z | x | B | C | dt] and conv1d's channels [x | B | C] (one "group" of
# those slots); the canonical parts are what megatron's mixer splits apart (models/mamba_layout.py)
_MAMBA = {"mamba.in_proj.weight": ("mamba_in", (("mamba.in_proj_z.weight", (0,)), ("mamba.in_proj_x.weight", (1,)),
                                                ("mamba.in_proj_bc.weight", (2, 3)), ("mamba.in_proj_dt.weight", (4,)))),
          **{f"mamba.conv1d.{k}": ("mamba_conv", ((f"mamba.conv1d_x.{k}", (0,)), (f"mamba.conv1d_bc.{k}", (1, 2))))
             for k in ("weight", "bias")}}
_GROUPED["granitemoehybrid"] = _GROUPED["granitemoehybrid_dense"] = _MAMBA
_GROUPED["nemotron_h"] = {k.replace("mamba.", "mixer.", 1): v for k, v in _MAMBA.items()}  # its mixer's names
_GROUPED["falcon_h1"] = _MAMBA


def _group_widths(what: str, hf_config: dict) -> tuple[int, list[int]]:
    """(groups, width of each slot of a group) of a grouped tensor (_GROUPED), from config.json."""
    if what in ("mamba_in", "mamba_conv") and hf_config.get("model_type") == "falcon_h1":  # (its null mamba_d_ssm counts)
        from mindspeed_rl.models.hf_falcon_h1_config import falcon_h1_args, falcon_h1_config
        from mindspeed_rl.models.mamba_layout import MambaShape

        shape = MambaShape.from_args(falcon_h1_args(falcon_h1_config(hf_config)))
        return 1, shape.stored_in_proj_widths() if what == "mamba_in" else shape.stored_conv_widths()
    hf_config = {**HF_DEFAULTS.get(hf_config.get("model_type") or "", {}),
                 **{k: v for k, v in hf_config.items() if v is not None}}
    if what == "neox_qkv":  # every attention head's q, k and v
        heads = int(hf_config["num_attention_heads"])
        return heads, [int(hf_config["hidden_size"]) // heads] * 3
    if what == "falcon_qkv":  # every key / value head's queries, k and v
        hf_config = {FALCON_ALIASES.get(k, k): v for k, v in hf_config.items()}
        heads, groups = int(hf_config["num_attention_heads"]), falcon_kv_heads(hf_config)
        d = int(hf_config["hidden_size"]) // heads
        return groups, [heads // groups * d, d, d]
    if what in ("mamba_in", "mamba_conv"):  # one group: the parts one after another
        from mindspeed_rl.models.hf_granite_config import granite_hybrid_args
        from mindspeed_rl.models.hf_nemotron_h_config import nemotron_h_args, nemotron_h_config
        from mindspeed_rl.models.mamba_layout import MambaShape

        if hf_config.get("model_type") == "nemotron_h":
            shape = MambaShape.from_args(nemotron_h_args(nemotron_h_config(hf_config)))
        else:
            layers = int(hf_config["num_hidden_layers"])
            shape = MambaShape.from_args(granite_hybrid_args({**hf_config, "layer_types": ["mamba"] * layers}, layers))
        return 1, shape.stored_in_proj_widths() if what == "mamba_in" else shape.stored_conv_widths()
    groups = int(hf_config["linear_num_key_heads"])
    r = int(hf_config["linear_num_value_heads"]) // groups
    dk, dv = int(hf_config["linear_key_head_dim"]), r * int(hf_config["linear_value_head_dim"])
    return (groups, [dk, dk, dv, dv]) if what == "delta_qkvz" else (groups, [r, r])


def _grouped_rows(groups: int, widths: list[int], slots: tuple[int, ...]) -> torch.Tensor:
    """The stored rows of a part (its `slots` of every group, slot by slot), as a LongTensor."""
    width, offsets = sum(widths), [sum(widths[:i]) for i in range(len(widths))]
    return torch.cat([torch.arange(widths[s]) + offsets[s] + g * width for s in slots for g in range(groups)])


def grouped_parts(name: str, hf_config: dict) -> list[tuple[str, torch.Tensor]] | None:
    """(canonical name, its stored rows) of each part of the stored tensor `name`, or None when it is not a
    grouped tensor of config.json's model_type (_GROUPED)."""
    m = _LAYER.match(_prefix(name, hf_config.get("model_type"), reverse=True))
    entry = _GROUPED.get(hf_config.get("model_type") or "", {}).get(m.group(2)) if m else None
    if entry is None:
        return None
    what, parts = entry
    groups, widths = _group_widths(what, hf_config)
    return [(m.group(1) + canonical, _grouped_rows(groups, widths, slots)) for canonical, slots in parts]


def group_members(canonical: str, model_type: str | None) -> tuple[str, list[str]] | None:
    """(the grouped tensor holding the canonical tensor, all the canonical tensors it holds), or None."""
    m = _LAYER.match(canonical)
    for stored, (_, parts) in _GROUPED.get(model_type or "", {}).items() if m else ():
        names = [m.group(1) + p for p, _ in parts]
        if canonical in names:
            return m.group(1) + stored, names
    return None


_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|bias)$")


def stored_members(canonical: str, model_type: str | None, hf_config: dict) -> tuple[str, list[str]] | None:
    """(the stored tensor a `model_type` checkpoint keeps the canonical tensor in together with others, all the
    canonical tensors it holds): a grouped (_GROUPED), fused (_FUSED) or stacked (_STACKED: every expert of the
    layer, `hf_config`'s count) one; None for a tensor stored alone. `fuse` turns a complete set into it."""
    members = group_members(canonical, model_type)
    m = _LAYER.match(canonical)
    if members is not None or m is None:
        return members
    for stored, parts in _FUSED.get(model_type or "", {}).items():
        if m.group(2) in parts:
            return m.group(1) + stored, [m.group(1) + p for p in parts]
    e = _EXPERT.match(m.group(2)) if model_type in _STACKED else None
    if e is None:
        return None
    _, gate_up, down, _ = _STACKED[model_type]
    projs, stored = (("down",), down) if e.group(2) == "down" else (("gate", "up"), gate_up)
    experts = int(hf_config.get("num_local_experts") or hf_config.get("num_experts") or 0)
    return (m.group(1) + stored + ("_bias" if e.group(3) == "bias" else ""),
            [f"{m.group(1)}mlp.experts.{x}.{p}_proj.{e.group(3)}" for x in range(experts) for p in projs])


def grouped_name(canonical: str, model_type: str | None) -> str | None:
    """The grouped tensor a `model_type` checkpoint keeps the canonical tensor in, or None."""
    members = group_members(canonical, model_type)
    return members[0] if members else None


def group(tensors: dict, model_type: str | None, hf_config: dict | None) -> dict:
    """Canonical tensors -> `model_type`'s grouped ones (_GROUPED; all parts of one must be in `tensors`);
    other tensors pass through."""
    grouped = _GROUPED.get(model_type or "", {})
    if not grouped:
        return tensors
    out, taken = {}, set()
    for name in tensors:
        members = group_members(name, model_type)
        if members is None or members[0] in out:
            continue
        stored, names = members
        missing = [n for n in names if n not in tensors]
        if missing:
            raise ValueError(f"{stored} needs {', '.join(missing)} in the same shard")
        if hf_config is None:
            raise ValueError(f"{stored}: writing a {model_type} checkpoint needs its config.json")
        what, parts = grouped[_LAYER.match(stored).group(2)]
        groups, widths = _group_widths(what, hf_config)
        whole = tensors[names[0]].new_empty(groups * sum(widths), *tensors[names[0]].shape[1:])
        for n, (_, slots) in zip(names, parts):
            whole[_grouped_rows(groups, widths, slots)] = tensors[n]
        out[stored] = whole
        taken.update(names)
    out.update((n, t) for n, t in tensors.items() if n not in taken)
    return out


# config.json model_type -> its experts stored stacked, one tensor per layer and projection:
# gpt-oss's mlp.experts.gate_up_proj (E, h, 2f) with gate and up interleaved along the last dim
# (gate = [..., 0::2], up = [..., 1::2]) and used as x @ W; down_proj (E, f, h); their biases
# gate_up_proj_bias (E, 2f), down_proj_bias (E, h). gpt-oss's own release stores the two weights in
# MXFP4 (`<name>_blocks` uint8 (E, rows, cols / 32, 16) + `<name>_scales` (E, rows, cols / 32)),
# dequantized on reading with transformers' convert_moe_packed_tensors (dequantize_mxfp4).
# Qwen3-VL-MoE's text model stores them the same way with gate and up as the two halves of the last dim
# (gate = [..., :f], up = [..., f:]) and no biases. Granite's MoE models store them as their modules hold
# them (module layout: block_sparse_moe.input_linear (E, 2f, h), gate then up; output_linear (E, h, f)).
# model_type -> (how gate and up share gate_up, gate_up's and down's layer-relative names, whether the
# releases keep the module layout (else x @ W; transformers 5 saves Qwen3-VL-MoE's in the module layout too:
# the reader tells by the shapes)).
_STACKED = {"gpt_oss": ("interleaved", "mlp.experts.gate_up_proj", "mlp.experts.down_proj", False),
            "qwen3_vl_moe": ("halves", "mlp.experts.gate_up_proj", "mlp.experts.down_proj", False)}
_STACKED["gemma4_text"] = ("halves", "experts.gate_up_proj", "experts.down_proj", True)  # Gemma 4 26B-A4B
_STACKED.update(dict.fromkeys(("granitemoe", "granitemoeshared", "granitemoehybrid"), (
    "halves", "block_sparse_moe.input_linear.weight", "block_sparse_moe.output_linear.weight", True)))


def _stacked_pattern(model_type: str) -> re.Pattern:
    """`model_type`'s stacked expert tensors: (layer prefix, gate_up or down, suffix: _bias / _blocks or none)."""
    _, gate_up, down, _ = _STACKED[model_type]
    return re.compile(rf"^(model\.layers\.\d+\.)({re.escape(gate_up)}|{re.escape(down)})(_bias|_blocks)?$")


# config.json model_type -> canonical layer-relative names it stores with a leading dimension of 1 (ERNIE 4.5
# MoE's expert bias, (1, E): one group of experts); read as the canonical (E,), written back as stored
_LEADING_ONE = {"ernie4_5_moe": ("mlp.gate.e_score_correction_bias",)}


def leading_one(name: str, model_type: str | None) -> bool:
    """Whether a `model_type` checkpoint stores the canonical tensor `name` with a leading dimension of 1."""
    m = _LAYER.match(name)
    return bool(m) and m.group(2) in _LEADING_ONE.get(model_type or "", ())


def own_names(model_type: str | None) -> bool:
    """Whether `model_type` checkpoints store some tensors under names or layouts of their own."""
    return (model_type in _STORED_AS or model_type in _FUSED or model_type in _PREFIXED or model_type in _STACKED
            or model_type in _GROUPED or model_type in _PREFIX_AS)


def stacked_layout(model_type: str | None) -> str | None:
    """How a `model_type` checkpoint keeps gate and up in its stacked gate_up_proj ("interleaved",
    "halves"), or None where its experts are stored one by one."""
    return _STACKED[model_type][0] if model_type in _STACKED else None


def stacked_module_layout(model_type: str | None) -> bool:
    """Whether `model_type`'s releases keep their stacked experts as the modules hold them ((E, 2f, h), (E, h, f))."""
    return model_type in _STACKED and _STACKED[model_type][3]


def stacked_parts(name: str, model_type: str | None, experts: int) -> list[tuple[str, int, str]] | None:
    """(canonical name, expert, part) of each expert tensor the stacked tensor `name` (canonical: an
    image-text model's prefix already stripped) holds (part: gate / up / down, + "_bias"), or None when
    `name` is not one (_STACKED). An MXFP4 checkpoint's `_blocks` tensor stands for the weight (its
    `_scales` are read with it)."""
    m = _stacked_pattern(model_type).match(name) if model_type in _STACKED else None
    if m is None:
        return None
    prefix, proj, suffix = m.group(1), m.group(2), m.group(3) or ""
    kind = ".bias" if suffix == "_bias" else ".weight"
    parts = ("gate", "up") if proj == _STACKED[model_type][1] else ("down",)
    return [(f"{prefix}mlp.experts.{e}.{p}_proj{kind}", e, p + ("_bias" if kind == ".bias" else ""))
            for e in range(experts) for p in parts]


def _half(t: torch.Tensor, up: bool, layout: str) -> torch.Tensor:
    """gate's or up's rows of a (2f, ...) stacked gate_up slice (_STACKED's layouts)."""
    if layout == "interleaved":
        return t[(1 if up else 0)::2]
    f = t.shape[0] // 2
    return t[f:] if up else t[:f]


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One expert's MXFP4 weight in fp32: its blocks (rows, cols / 32, 16) and scales (rows, cols / 32),
    dequantized with transformers' convert_moe_packed_tensors (as transformers loads gpt-oss's release)
    into the release's unquantized layout (cols, rows)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(blocks[None], scales[None], dtype=torch.float32)[0]


def stacked_expert(stored: torch.Tensor, part: str, layout: str = "interleaved",
                   module_layout: bool = False) -> torch.Tensor:
    """One expert's canonical tensor (HF Linear layout: (out, in), or a bias) from its slice of a
    stacked tensor (stacked_parts): `stored` (h, 2f) / (f, h) / (2f,) / (h,) as the releases store them
    (used as x @ W; an MXFP4 one after dequantize_mxfp4), or (2f, h) / (h, f) with `module_layout`
    (transformers 5 saves Qwen3-VL-MoE's so); `layout`: how gate and up share gate_up (_STACKED)."""
    if part in ("gate", "up"):  # -> (f, h)
        return _half(stored if module_layout else stored.t(), part == "up", layout).contiguous()
    if part in ("gate_bias", "up_bias"):
        return _half(stored, part == "up_bias", layout).contiguous()
    if part == "down":  # -> (h, f)
        return (stored if module_layout else stored.t()).contiguous()
    return stored  # down_bias (h,)


def stack_experts(tensors: dict, model_type: str | None) -> dict:
    """Canonical per-expert tensors -> the `model_type` checkpoint's stacked ones (_STACKED), the inverse
    of stacked_expert in bf16 / fp32 (never MXFP4); every expert of a layer must be in `tensors`.
    Other tensors pass through."""
    if model_type not in _STACKED:
        return tensors
    expert = re.compile(r"^(model\.layers\.\d+\.)mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|bias)$")
    groups: dict = {}
    out = {}
    for name, tensor in tensors.items():
        m = expert.match(name)
        if m is None:
            out[name] = tensor
            continue
        groups.setdefault((m.group(1), m.group(3), m.group(4)), {})[int(m.group(2))] = tensor
    layers = {(prefix, kind) for prefix, _, kind in groups}
    for prefix, kind in sorted(layers):
        parts = {p: groups.get((prefix, p, kind), {}) for p in ("gate", "up", "down")}
        count = max(len(t) for t in parts.values())
        # gate and up go together (one stacked tensor), down alone (vLLM's feed hands over each when complete)
        if any(sorted(parts[p]) != list(range(count)) for p in ("gate", "up") if parts["gate"] or parts["up"]) or \
                (parts["down"] and sorted(parts["down"]) != list(range(count))):
            raise ValueError(f"{prefix}mlp.experts needs every expert's gate / up / down {kind} in the same shard")
        layout, gate_up_name, down_name, module = _STACKED[model_type]
        suffix = "" if kind == "weight" else "_bias"
        if parts["gate"]:  # (E, f, h) x 2 -> (E, 2f, h), interleaved or halves; the biases (E, 2f)
            gate = torch.stack([parts["gate"][e] for e in range(count)])
            up = torch.stack([parts["up"][e] for e in range(count)])
            gate_up = (torch.stack([gate, up], dim=2).flatten(1, 2) if layout == "interleaved"
                       else torch.cat([gate, up], dim=1))
            out[prefix + gate_up_name + suffix] = (gate_up if module or kind == "bias" else gate_up.transpose(1, 2)).contiguous()
        if parts["down"]:  # (E, h, f), transposed unless the module layout; the biases (E, h)
            down = torch.stack([parts["down"][e] for e in range(count)])
            out[prefix + down_name + suffix] = (down if module or kind == "bias" else down.transpose(1, 2)).contiguous()
    return out


def part_rows(hf_config: dict, canonical: str) -> int:
    """Rows of a canonical tensor inside a fused one, from config.json (q: heads x head_dim; k, v:
    kv heads x head_dim; gate, up: intermediate_size)."""
    if hf_config.get("model_type") in ("granitemoeshared", "granitemoehybrid") and canonical.endswith(
            ("gate_proj.weight", "up_proj.weight")):  # Granite's shared MLP (Granite 4.0's dense models' only one)
        return int(hf_config["shared_intermediate_size"])
    heads = int(hf_config["num_attention_heads"])
    head_dim = int(hf_config.get("head_dim") or int(hf_config["hidden_size"]) // heads)
    if canonical.endswith(("q_proj.weight", "q_proj.bias")):
        return heads * head_dim
    if canonical.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
        return int(hf_config.get("num_key_value_heads") or heads) * head_dim
    return int(hf_config["intermediate_size"])


def fused_parts(name: str, hf_config: dict) -> list[tuple[str, int, int]] | None:
    """(canonical name, first row, rows) of each part of the stored tensor `name`, or None when it is
    not a fused tensor of config.json's model_type."""
    m = _LAYER.match(name)
    parts = _FUSED.get(names_type(hf_config) or "", {}).get(m.group(2)) if m else None
    if parts is None:
        return None
    out, start = [], 0
    for part in parts:
        rows = part_rows(hf_config, part)
        out.append((m.group(1) + part, start, rows))
        start += rows
    return out


def fused_name(canonical: str, model_type: str | None) -> str | None:
    """The fused tensor a `model_type` checkpoint keeps the canonical tensor in, or None."""
    m = _LAYER.match(canonical)
    for stored, parts in _FUSED.get(model_type or "", {}).items() if m else ():
        if m.group(2) in parts:
            return m.group(1) + stored
    return None


def fuse(tensors: dict, model_type: str | None, hf_config: dict | None = None) -> dict:
    """Canonical tensors -> the `model_type` checkpoint's: parts concatenated into their fused
    tensor (all parts of one must be in `tensors`), or grouped (`group`, which needs config.json:
    `hf_config`), other names as stored_name gives them."""
    tensors = group(tensors, model_type, hf_config)
    fused = _FUSED.get(model_type or "", {})
    out, taken = {}, set()
    for name in tensors:
        m = _LAYER.match(name)
        for stored, parts in fused.items() if m else ():
            if m.group(2) in parts:
                names = [m.group(1) + p for p in parts]
                missing = [n for n in names if n not in tensors]
                if missing:
                    raise ValueError(f"{m.group(1) + stored} needs {', '.join(missing)} in the same shard")
                if m.group(1) + stored not in out:
                    out[m.group(1) + stored] = torch.cat([tensors[n] for n in names], dim=0)
                taken.update(names)
    for name, tensor in tensors.items():
        if name not in taken:
            out[stored_name(name, model_type)] = tensor.unsqueeze(0) if leading_one(name, model_type) else tensor
    return stack_experts(out, model_type)


def stored_name(name: str, model_type: str | None) -> str:
    """The name a `model_type` checkpoint (and vLLM) uses for the canonical HF name `name`."""
    for pattern, repl in _TO_STORED.get(model_type or "", ()):
        if pattern.search(name):
            return _prefix(pattern.sub(repl, name), model_type, reverse=False)
    return _prefix(name, model_type, reverse=False)


def canonical_name(name: str, model_type: str | None, hf_config: dict | None = None) -> str:
    """The canonical HF name of a tensor a `model_type` checkpoint stores as `name` (a layer's one norm, _ONE_NORM:
    by its block, which `hf_config`, config.json, gives)."""
    if model_type in _PREFIXED:  # an image-text checkpoint: its text model's name, in the text model's terms
        model_type, prefixes = _PREFIXED[model_type]
        for prefix, repl in prefixes:
            if name.startswith(prefix):
                name = repl + name[len(prefix):]
                break
    name = _prefix(name, model_type, reverse=True)
    m = _LAYER.match(name) if model_type in _ONE_NORM else None
    if m and m.group(2) == _ONE_NORM[model_type]:
        from mindspeed_rl.models import hybrid_pattern
        from mindspeed_rl.models.hf_nemotron_h_config import pattern

        if hf_config is None:
            raise ValueError(f"{name}: which norm it is depends on the layer's block; reading it needs config.json")
        layer = int(m.group(1).split(".")[2])
        kept = hybrid_pattern.has_attention_slot(pattern(hf_config), layer)
        return m.group(1) + ("input_layernorm.weight" if kept else "post_attention_layernorm.weight")
    for pattern_, repl in _TO_CANONICAL.get(model_type or "", ()):
        if pattern_.search(name):
            return pattern_.sub(repl, name)
    return name
