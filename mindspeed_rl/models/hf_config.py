"""Hugging Face config.json -> Megatron-named architecture arguments (dict logic; transformers' config
classes only to complete an image-text model's sparse text_config: text_model_config).

    args = model_config_from_hf(json.load(open(f"{hf_dir}/config.json")))

Kept apart from builder.py because it needs no megatron: the driver resolves and checks a model's
architecture from config.json while validating the config, before any worker starts. The MoE models'
routing, shared experts and dense layers are read in models/hf_moe_config.py (moe_args_from_hf and the
*_moe_args named below).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from mindspeed_rl.models.hf_layernorm_config import (LAYERNORM_ARCHS, OWN_ACTIVATION, falcon_keys, layernorm_args,
                                                     layernorm_checks, neox_keys)
from mindspeed_rl.models.hf_afmoe_config import afmoe_config
from mindspeed_rl.models.hf_moe_config import (dots1_config, expert_count, gpt_oss_args, hy_v3_config, mla_args,
                                                moe_args_from_hf, sarvam_mla_config, sarvam_moe_config, solar_open_config)
from mindspeed_rl.models.hf_falcon_h1_config import falcon_h1_args, falcon_h1_config
from mindspeed_rl.models.hf_gemma4_config import gemma4_args, gemma4_config
from mindspeed_rl.models.hf_granite_config import granite_args, granite_hybrid_args, granite_hybrid_config
from mindspeed_rl.models.hf_nemotron_h_config import nemotron_h_args, nemotron_h_config
from mindspeed_rl.models.hf_lfm2_config import lfm2_args, lfm2_config
from mindspeed_rl.models.hf_nanochat_config import DEFAULTS as NANOCHAT_DEFAULTS, nanochat_args
from mindspeed_rl.models.hf_quantization import check_quantization
from mindspeed_rl.models.hf_rope_config import dynamic_ntk_as_default, llama4_scaling_limit, longrope_args, yarn_args

HF_ARCHS = ("llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "smollm3", "granite",
            "gemma3_text", "gemma2", "gemma", "olmo2", "olmo3", "ministral3", "exaone4", "seed_oss", "glm4",
            "ernie4_5", "arcee", "glm4_moe", "deepseek_v3", "deepseek_v2", "glm4_moe_lite", "gpt_oss", "minimax_m2", "ernie4_5_moe", "apertus",
            "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmoe", "flex_olmo", "hunyuan_v1_dense", "hunyuan_v1_moe",
            "granitemoe", "granitemoeshared", "granitemoehybrid", "glm", "helium", "stablelm",
            "starcoder2", "nemotron", "cohere", "cohere2", "phi", "gpt_neox", "falcon", "olmo", "nemotron_h", "falcon_h1",
            "lfm2", "lfm2_moe", "exaone", "exaone_moe", "hyperclovax", "iquestcoder", "hy_v3", "afmoe", "sarvam_moe", "jais2", "mellum",
            "gemma4_text", "internlm3", "youtu", "nanochat", "vaultgemma")
GEMMA_ARCHS = ("gemma3_text", "gemma2", "gemma", "vaultgemma")
MOE_ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral", "glm4_moe", "deepseek_v3", "deepseek_v2", "glm4_moe_lite", "gpt_oss",
             "minimax_m2", "ernie4_5_moe", "qwen3_5_moe_text", "qwen3_next", "olmoe", "flex_olmo", "hunyuan_v1_moe",
             "granitemoe", "granitemoeshared", "granitemoehybrid", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe", "mellum")
# Granite's four scalars (granite_args); the MoE ones route as Mixtral, with a shared MLP beside the experts
# (granitemoeshared, granitemoehybrid) or none (granitemoe); Granite 4.0's granitemoehybrid without experts is dense
GRANITE_ARCHS = ("granite", "granitemoe", "granitemoeshared", "granitemoehybrid")
# Gated DeltaNet and gated attention (qwen3_5_args): Qwen3.5, Qwen3.5-MoE, Qwen3-Next
QWEN3_5_ARCHS = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
HUNYUAN_ARCHS = ("hunyuan_v1_dense", "hunyuan_v1_moe")  # q / k norms after RoPE, NTK alpha RoPE
MLA_ARCHS = ("deepseek_v3", "deepseek_v2", "glm4_moe_lite", "youtu")  # multi-latent attention (mla_args)
WINDOW_ARCHS = ("mistral", "mixtral", "phi3", "ministral3", "starcoder2")  # a config.json sliding_window applies to every layer
ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")  # config.json rope types computed exactly
ROPE_SCALINGS = (None, "linear", "llama3", "longrope", "yarn", "proportional")  # their rope_scaling_type (models/builder.py)
# transformers' config-class defaults where they differ from what the reading below assumes for a key
# config.json leaves out or null (rope_theta 10000, untied, head_dim = hidden / heads, full rotary, no biases)
HF_DEFAULTS = {
    "smollm3": {"rope_theta": 2000000.0, "tie_word_embeddings": True},
    "gemma3_text": {"rope_theta": 1000000.0, "tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
    "vaultgemma": {"tie_word_embeddings": True},  # transformers' VaultGemmaConfig (Gemma2Config's defaults)
    "gemma": {"tie_word_embeddings": True},
    "olmo3": {"rope_theta": 500000.0},
    "ernie4_5": {"tie_word_embeddings": True, "head_dim": 128},
    # ERNIE-4.5-21B-A3B's (transformers' Ernie4_5_MoeConfig); head_dim: hidden_size / heads
    "ernie4_5_moe": {"tie_word_embeddings": True, "rope_theta": 500000.0, "moe_k": 6, "moe_num_experts": 64,
                     "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
                     "moe_layer_interval": 1, "moe_intermediate_size": 1536},
    "exaone": {"rope_theta": 500000.0},  # transformers' ExaoneConfig (EXAONE 3.0 / 3.5)
    "iquestcoder": {"head_dim": 128},  # transformers' IQuestCoderConfig (IQuest-Coder-V1: Llama, head_dim 128)
    "internlm3": {"head_dim": 128},  # transformers' InternLM3Config (internlm3-8b-instruct: Llama, head_dim 128)
    "nanochat": NANOCHAT_DEFAULTS,  # transformers' NanoChatConfig (models/hf_nanochat_config.py)
    "youtu": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,  # YoutuConfig's
              "tie_word_embeddings": True, "max_position_embeddings": 131072},  # (q_lora_rank 1536: mla_args')
    # transformers' ExaoneMoeConfig (K-EXAONE): EXAONE 4.0's attention with DeepSeek-V3's routing
    "exaone_moe": {"rms_norm_eps": 1e-5, "first_k_dense_replace": 1, "moe_intermediate_size": 1024, "num_experts": 64,
                   "num_experts_per_tok": 8, "num_shared_experts": 1, "norm_topk_prob": True,
                   "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "sliding_window_pattern": 4},
    "glm4": {"head_dim": 128, "partial_rotary_factor": 0.5, "attention_bias": True},
    "glm": {"head_dim": 128, "partial_rotary_factor": 0.5, "attention_bias": True},  # transformers' GlmConfig
    "helium": {"head_dim": 128, "rms_norm_eps": 1e-8},  # transformers' HeliumConfig
    "stablelm": {"partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5},  # transformers' StableLmConfig
    "starcoder2": {"norm_epsilon": 1e-5, "use_bias": True, "hidden_act": "gelu_pytorch_tanh"},  # its Starcoder2Config
    "nemotron": {"partial_rotary_factor": 0.5, "norm_eps": 1e-5, "hidden_act": "relu2"},  # its NemotronConfig
    "jais2": {"layer_norm_eps": 1e-5, "hidden_act": "relu2", "attention_bias": True, "mlp_bias": True},  # Jais2Config
    # transformers' MellumConfig (Mellum2-12B-A2.5B): full layers at theta 5e5, sliding ones at 1e4
    "mellum": {"head_dim": 128, "norm_topk_prob": True, "sliding_window": 1024,
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "phi": {"partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5, "hidden_act": "gelu_new"},  # its PhiConfig
    # transformers' GPTNeoXConfig; rotary_pct / rotary_emb_base: the releases' (4.x) spelling (neox_keys)
    "gpt_neox": {"layer_norm_eps": 1e-5, "hidden_act": "gelu", "use_parallel_residual": True, "attention_bias": True,
                 "rotary_pct": 0.25, "rotary_emb_base": 10000.0},
    # transformers' FalconConfig (Falcon-7B's layout); its sizes' old names and heads: hf_layernorm_config.falcon_keys
    "falcon": {"layer_norm_epsilon": 1e-5, "activation": "gelu", "tie_word_embeddings": True, "multi_query": True,
               "parallel_attn": True, "new_decoder_architecture": False, "bias": False, "alibi": False},
    "cohere": {"logit_scale": 0.0625, "layer_norm_eps": 1e-5, "tie_word_embeddings": True},  # its CohereConfig
    "cohere2": {"logit_scale": 0.0625, "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "sliding_window": 4096},
    "seed_oss": {"attention_bias": True},
    "arcee": {"hidden_act": "relu2"},
    "apertus": {"hidden_act": "xielu", "rope_theta": 12000000.0},
    # transformers' Qwen3_5TextConfig (Qwen3.5-9B's sizes); every fourth layer attends (layer_types)
    "qwen3_5_text": {"head_dim": 256, "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
                     "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                     "linear_num_value_heads": 32, "full_attention_interval": 4},
    # transformers' Qwen3_5MoeTextConfig (Qwen3.5-35B-A3B's sizes); every layer MoE, so no dense MLP width:
    # intermediate_size is the experts' (megatron's ffn_hidden_size, unused)
    "qwen3_5_moe_text": {"head_dim": 256, "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
                         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                         "linear_num_value_heads": 32, "full_attention_interval": 4, "num_experts": 256,
                         "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
    # transformers' Qwen3NextConfig (Qwen3-Next-80B-A3B's sizes but its rope_theta, 1e7); dense layers where
    # mlp_only_layers / decoder_sparse_step say (intermediate_size wide)
    "qwen3_next": {"head_dim": 256, "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
                   "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                   "linear_num_value_heads": 32, "full_attention_interval": 4, "num_experts": 512,
                   "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                   "norm_topk_prob": True, "decoder_sparse_step": 1, "intermediate_size": 5632},
    "glm4_moe": {"partial_rotary_factor": 0.5, "n_shared_experts": 1, "n_routed_experts": 128,
                 "first_k_dense_replace": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "n_group": 1,
                 "topk_group": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 1408},
    # q_lora_rank is not here: null in a config.json means one full-rank query projection (mla_args)
    # OLMoE-1B-7B's (transformers' OlmoeConfig): experts intermediate_size wide, top-k not renormalised
    "olmoe": {"rms_norm_eps": 1e-5, "num_experts": 64, "num_experts_per_tok": 8, "intermediate_size": 2048,
              "norm_topk_prob": False},
    # transformers' FlexOlmoConfig (FlexOlmo-7x7B-1T's layout)
    "flex_olmo": {"rope_theta": 500000.0, "num_experts": 7, "num_experts_per_tok": 5, "intermediate_size": 11008,
                  "norm_topk_prob": False},
    "hunyuan_v1_dense": {"rms_norm_eps": 1e-5},  # transformers' HunYuanDenseV1Config
    "hunyuan_v1_moe": {"rms_norm_eps": 1e-5, "num_experts": 1, "moe_topk": 1},  # its HunYuanMoEV1Config
    # transformers' GraniteMoeConfig / GraniteMoeSharedConfig / GraniteMoeHybridConfig
    "granitemoe": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "granitemoeshared": {"num_local_experts": 8, "num_experts_per_tok": 2, "shared_intermediate_size": 0},
    "granitemoehybrid": {"num_local_experts": 8, "num_experts_per_tok": 2, "shared_intermediate_size": 1024,
                         "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4,
                         "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True},
    "minimax_m2": {"head_dim": 128, "rope_theta": 5000000.0, "num_local_experts": 256, "num_experts_per_tok": 8,
                   "intermediate_size": 1536},
    "gpt_oss": {"head_dim": 64, "attention_bias": True, "rope_theta": 150000.0, "sliding_window": 128,
                "swiglu_limit": 7.0},
    "deepseek_v3": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                    "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5, "n_group": 8,
                    "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
                    "moe_intermediate_size": 2048},
    # GLM-4.7-Flash's (transformers' Glm4MoeLiteConfig); its q_lora_rank default (768) is mla_args'
    "glm4_moe_lite": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "v_head_dim": 256,
                      "n_shared_experts": 1, "n_routed_experts": 64, "routed_scaling_factor": 1.8, "n_group": 1,
                      "topk_group": 1, "num_experts_per_tok": 4, "norm_topk_prob": True, "moe_intermediate_size": 1536,
                      "rms_norm_eps": 1e-5},
    "deepseek_v2": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                    "n_shared_experts": 2, "n_routed_experts": 64, "routed_scaling_factor": 1.0, "topk_method": "greedy",
                    "first_k_dense_replace": 0, "norm_topk_prob": False, "moe_intermediate_size": 1407},
}


def model_config_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron-named args for a Llama / Mistral / Phi-3 / Qwen2 / Qwen3 / Qwen3-MoE / Qwen2-MoE / Mixtral /
    SmolLM3 / Granite / Gemma 1-3 / OLMo 2 / OLMo 3 / Ministral 3 / EXAONE 4.0 / Seed-OSS / GLM-4 / ERNIE 4.5 /
    GLM-4.5 / DeepSeek-V3 / DeepSeek-V2 config.json
    (transformers 4.x `rope_theta` + `rope_scaling` or 5.x `rope_parameters`). Unsupported features
    raise ValueError.

    GLM-4 (glm: glm-4-9b-hf / glm-4-9b-chat-hf / -1m-hf) is GLM-4-0414's layers below without their norms after
    attention and MLP.
    The models with LayerNorms (StableLM 2, StarCoder2, Nemotron, Cohere / Cohere 2, Phi-2, GPT-NeoX / Pythia) are
    read in models/hf_layernorm_config.py.
    Helium (helium: Kyutai's Helium-1 2B) is ERNIE 4.5's layout below (RoPE on interleaved pairs of the whole head),
    q / k / v biases where attention_bias says.
    GLM-4 (glm4: GLM-4-9B / 32B-0414, GLM-Z1) is Qwen2's q / k / v biases with norms after attention
    and MLP as well as before (post_self_attn_layernorm / post_mlp_layernorm, plain RMSNorms: post_norm),
    gate / up stored fused (gate_up_proj), and RoPE on the first half of each head (partial_rotary_factor
    0.5 by default) over interleaved pairs (2i, 2i + 1): megatron-core's rotary_interleaved.
    ERNIE 4.5 (ernie4_5: ERNIE-4.5-0.3B base / PT) is Llama's layout with RoPE over interleaved pairs
    (rotary_interleaved), tied by default, no biases (use_bias true is refused); ERNIE 4.5 MoE
    (ernie4_5_moe: ERNIE-4.5-21B-A3B, -300B-A47B) is that attention with softmax routing, an expert
    bias for the choice, shared experts and dense layers where moe_layer_* place none (ernie4_5_moe_args).
    GLM-4.5 / 4.6 (glm4_moe: GLM-4.5, GLM-4.5-Air, GLM-4.6 and their base models) is an MoE model whose
    first first_k_dense_replace layers are dense (moe_args_from_hf), with q / k / v biases (attention_bias),
    optional per-head q / k norms (use_qk_norm) and RoPE on the first half of each head, pairs (i, i + d/2)
    as Llama's; its multi-token-prediction layers (num_nextn_predict_layers, stored after the last layer)
    are not read.
    DeepSeek-V3 (deepseek_v3; Kimi K2 as it) is GLM-4.5's MoE layout and routing with multi-latent attention
    (mla_args); DeepSeek-V2 / V2-Lite (deepseek_v2) the same attention with softmax routing (deepseek_v2_moe_args);
    GLM-4.7-Flash (glm4_moe_lite) is DeepSeek-V3's layout under its own model type, its dense layers listed
    in mlp_layer_types.
    gpt-oss (gpt_oss) is Mixtral's routing with attention sinks, biases, a clamped SwiGLU and alternating
    sliding layers (gpt_oss_args).
    MiniMax-M2 (minimax_m2: MiniMax-M2, M2.1, M2.5) is Mixtral's names and expert width with GLM-4.5's sigmoid
    routing (an expert bias, every layer MoE, no shared expert; minimax_m2_moe_args), OLMo 2's q / k norms
    across all heads before RoPE on the first rotary_dim of each head (Llama's pairs); its multi-token-prediction
    modules (num_mtp_modules, stored after the last layer) are not read.
    OLMoE (olmoe: OLMoE-1B-7B-0924 / -0125, base, -SFT, -DPO, -Instruct) is Llama's attention with OLMo 2's q / k
    norms across all heads under the usual pre-norms, and Qwen2-MoE's experts (their names, softmax routing, the
    top-k not renormalised by default) intermediate_size wide, no shared expert; clip_qkv is refused. FlexOlmo
    (flex_olmo: FlexOlmo-7x7B-1T, -RT) is OLMo 2's layers (norms after attention and MLP only) with OLMoE's experts.
    HunYuan (hunyuan_v1_dense: Hunyuan-0.5B / 1.8B / 4B / 7B, -Pretrain / -Instruct) is Llama's layout with per-head q /
    k norms (query_layernorm / key_layernorm) applied after RoPE (qk_layernorm_after_rope) and its NTK alpha RoPE
    (rope type dynamic with an alpha: theta x alpha^(d / (d - 2)), fixed) read as the default RoPE at that theta;
    HunYuan-MoE (hunyuan_v1_moe: Hunyuan-A13B, -Pretrain / -Instruct) is that attention with every layer MoE
    (hunyuan_moe_args).
    Granite MoE (granitemoe: granite-3.x-1b-a400m / 3b-a800m; granitemoeshared with a shared MLP without a gate) is
    Granite's four scalars (granite_args) around Mixtral's routing (granite_moe_args); Granite 4.0 (granitemoehybrid)
    whose every layer attends is Granite with its shared_mlp as the MLP, or with experts granitemoeshared's layers
    (granite_hybrid_config), its -H models' Mamba-2 layers as models/mamba2.py (granite_hybrid_args).
    EXAONE 3.0 / 3.5 (exaone) is Llama under its own names (transformer.h.*, attn.attention.*, c_fc_0 / c_fc_1);
    EXAONE MoE (exaone_moe: K-EXAONE) EXAONE 4.0's attention under pre-norms with DeepSeek-V3's routing.
    Hy3 (hy_v3: Hy3-preview) is Qwen3's attention with DeepSeek-V3's routing without groups (hy_v3_config). AFMoE
    (afmoe: Trinity) is that routing under sandwich norms, its attention output gated by its own projection
    (attention_gate_proj), sliding layers with RoPE and full ones without, embeddings x sqrt(hidden) with mup_enabled.
    Sarvam MoE (sarvam_moe: Sarvam-30B) is GLM-4.5 under Ling's names (sarvam_moe_config). Gemma 4 (gemma4_text: 31B)
    is Gemma 3's layer with its full layers' own head dim and key / value heads, their values the keys, value norms,
    unscaled scores, a scalar per layer and proportional RoPE (models/hf_gemma4_config.py).
    LFM2 (lfm2) is Qwen3's attention with most layers a short convolution instead, LFM2-MoE (lfm2_moe) that with
    sigmoid-routed experts (models/hf_lfm2_config.py).
    A quantized checkpoint is read dequantized where its format is one the reader knows (check_quantization).
    Apertus (apertus: Apertus-8B / 70B base / instruct) is Llama's attention with Qwen3's per-head q / k
    norms, llama3 rope scaling and an MLP without a gate, down(xIELU(up(x))) with two learnable scalars per
    layer (models/xielu.py); its norms are named for what they precede (hf_bridge/names.py).
    Arcee (arcee: AFM-4.5B base / instruct) is Llama's attention with an MLP without a gate,
    down(relu(up(x))^2) (hidden_act relu2: squared_relu), YaRN beyond its 4096 original positions.
    Seed-OSS (seed_oss: Seed-OSS-36B base / instruct) is Qwen2's layout (q / k / v biases, on by default,
    no o_proj bias) with its own head_dim; its config.json dropout (0.1) is not taken: RL trains
    without dropout (attention_dropout / hidden_dropout 0).
    Mistral is Llama's layout and math plus an optional `sliding_window` (every layer attends to
    at most that many latest positions, itself included; models/sliding_window.py). Mistral 7B v0.1
    has a 4096 window; v0.2 / v0.3, Nemo and Small have none. Mixtral is Mistral with every MLP a mixture of experts (moe_args_from_hf).
    Phi-3 (Phi-3-mini/medium, Phi-3.5-mini, Phi-4) is Llama's math with q/k/v and gate/up stored fused
    (hf_bridge/names.py), a sliding_window like Mistral's (2047 in Phi-3-mini-4k) and
    partial_rotary_factor as megatron's rotary_percent; longrope (its 128k variants, Phi-3.5-mini,
    Phi-4-mini) up to the original length (longrope_args). Rope types: linear (positions divided by
    the factor), llama3, longrope and yarn (yarn_args: Qwen2.5 / Qwen3 beyond 32k, as their model
    cards tell users to set it); dynamic NTK (InternLM3) is the default RoPE up to max_position_embeddings, which
    is then the length limit (dynamic_ntk_as_default).
    InternLM3 (internlm3: internlm3-8b-instruct) is Llama with head_dim 128 under its own model_type, its biases
    spelled qkv_bias / bias (none in the release; with them, refused).
    Youtu-LLM (youtu: Youtu-LLM-2B and -Base) is DeepSeek-V3's multi-latent attention (mla_args) with Llama's dense
    SwiGLU MLP in every layer, tied by default. nanochat (nanochat: karpathy/nanochat-d32) is Llama's layer with
    weightless RMSNorms (the embeddings' too), negated RoPE angles and relu(x)^2 (models/hf_nanochat_config.py)."""
    hf = text_model_config(hf)
    model_type = hf.get("model_type")
    if model_type in QWEN3_5_ARCHS:  # its own config.json keeps M-RoPE's sections: the 1-D RoPE on text
        hf = without_mrope(hf)
    if model_type not in HF_ARCHS:
        raise ValueError(f"config.json model_type {model_type!r} is not supported; supported: {supported_types()}.")
    if model_type == "exaone":  # EXAONE 3.0 / 3.5: Llama under the releases' spellings (ExaoneConfig's attribute_map)
        hf = {EXAONE_ALIASES.get(k, k): v for k, v in hf.items()}
    if model_type == "internlm3" and (hf.get("qkv_bias") or hf.get("bias") or hf.get("attention_bias")
                                      or hf.get("mlp_bias")):
        raise ValueError("config.json qkv_bias / bias true (biases on q, k, v, o_proj and the MLP) is not supported for "
                         "internlm3; InternLM3's releases have none.")
    hf = {**hf, **{k: v for k, v in HF_DEFAULTS.get(model_type, {}).items() if hf.get(k) is None}}
    check_quantization(hf)
    if model_type == "gpt_neox":
        hf = neox_keys(hf)
    if model_type == "falcon":
        hf = falcon_keys(hf)
    if model_type == "falcon_h1":  # attention and Mamba-2 side by side (models/hf_falcon_h1_config.py)
        hf = falcon_h1_config(hf)
    if model_type in ("lfm2", "lfm2_moe"):  # short-convolution layers (models/hf_lfm2_config.py)
        hf = lfm2_config(hf)
    if model_type == "gemma4_text":  # the full layers' sizes and RoPE here, the sliding ones' apart (hf_gemma4_config.py)
        hf = gemma4_config(hf)
    if model_type in ("hy_v3", "afmoe", "sarvam_moe"):  # their keys as the GLM-4.5 reader names them
        hf = {"hy_v3": hy_v3_config, "afmoe": afmoe_config, "sarvam_moe": sarvam_moe_config}[model_type](hf)
    heads = int(hf["num_attention_heads"])
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    head_dim = int(hf.get("head_dim") or hf["hidden_size"] // heads)
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if model_type == "apertus" and not rope:  # transformers' ApertusConfig without any: Apertus's llama3 scaling
        rope = dict(APERTUS_ROPE)
    if isinstance(rope.get("full_attention"), Mapping):  # Gemma 3, OLMo 3 in transformers 5: one per layer type
        rope = dict(rope["full_attention"])
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if model_type == "minimax_m2" and hf.get("rotary_dim") and not (rope.get("partial_rotary_factor")
                                                                    or hf.get("partial_rotary_factor")):
        # the releases' legacy spelling, which transformers reads as this factor
        rope["partial_rotary_factor"] = int(hf["rotary_dim"]) / head_dim
    if model_type in ("ernie4_5", "ernie4_5_moe") and hf.get("use_bias"):
        raise ValueError("config.json use_bias=true (biases on every linear layer) is not supported; ERNIE 4.5's "
                         "releases have none.")
    if model_type == "seed_oss" and hf.get("attention_out_bias"):
        raise ValueError("config.json attention_out_bias=true (a bias on o_proj) is not supported; Seed-OSS's "
                         "releases have none.")
    layernorm_checks(hf, model_type)
    if hf.get("mlp_bias") and model_type not in ("nemotron", "jais2"):
        raise ValueError("config.json mlp_bias=true is not supported (Megatron has no MLP-only bias).")
    if model_type == "granitemoehybrid":
        hf = granite_hybrid_config(hf)
    if model_type == "nemotron_h":  # one block per layer (models/hf_nemotron_h_config.py)
        hf = nemotron_h_config(hf)
        head_dim = int(hf["head_dim"])
        kv_heads = int(hf["num_key_value_heads"])
    if model_type in (*GRANITE_ARCHS, "llama", "nanochat", "exaone", "hyperclovax", "hy_v3", "afmoe", "iquestcoder", "olmo", "olmo2", "olmo3", "exaone4", "arcee", "apertus", "olmoe", "flex_olmo", "cohere",
                      "cohere2",
                      *HUNYUAN_ARCHS, *GEMMA_ARCHS) and hf.get("attention_bias"):
        raise ValueError(f"config.json attention_bias=true for {model_type} (bias on o_proj) is not supported.")
    # transformers 5 keeps it in rope_parameters, 4.x at the top level
    partial = float(rope.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0)
    rotary_percent = partial if partial != 1.0 else None
    if rotary_percent is not None and model_type not in ("phi3", "glm", "glm4", "glm4_moe", "sarvam_moe", "minimax_m2",
                                                         "stablelm", "nemotron", "phi", "gpt_neox", "mellum",
                                                         *QWEN3_5_ARCHS):
        raise ValueError(f"config.json partial_rotary_factor {partial} is supported for phi3, glm, glm4, glm4_moe, "
                         f"sarvam_moe, stablelm, nemotron, phi, gpt_neox, mellum, "
                         f"minimax_m2, qwen3_5_text and qwen3_next models only, not {model_type}.")
    if hf.get("clip_qkv") is not None and model_type != "olmo":  # OLMoE clamps after its q / k norms; vLLM does not
        raise ValueError(f"config.json clip_qkv {hf['clip_qkv']} (queries, keys and values clamped to +-clip_qkv) is "
                         f"supported for olmo models only, not {model_type}"
                         + ("; OLMoE's releases set it null." if model_type == "olmoe" else "."))
    if hf.get("use_sliding_window"):
        raise ValueError("config.json use_sliding_window=true is not supported; set it to false.")
    activation = gemma_activation(hf) if model_type in (*GEMMA_ARCHS, "gemma4_text") else hf.get("hidden_act", "silu")
    wanted, mlp = (("gelu_pytorch_tanh", "GeGLU") if model_type in (*GEMMA_ARCHS, "gemma4_text") else
                   ("gelu_pytorch_tanh", "GELU with the tanh approximation") if model_type == "starcoder2" else
                   ("gelu_new", "GELU with the tanh approximation") if model_type == "phi" else ("relu2", "squared ReLU")
                   if model_type in ("arcee", "nemotron", "nemotron_h", "jais2", "nanochat") else ("xielu", "xIELU") if model_type == "apertus" else ("silu", "SwiGLU"))
    if activation != wanted and model_type not in OWN_ACTIVATION:  # GPT-NeoX, Falcon: GELU (layernorm_checks)
        raise ValueError(f"config.json hidden_act {activation!r} is not supported for {model_type}; only {wanted} "
                         f"({mlp}).")
    if model_type in HUNYUAN_ARCHS and rope_type == "dynamic" and rope.get("alpha"):
        # HunYuan's NTK alpha: a fixed stretch of the base, theta x alpha^(d / (d - 2)) (transformers' ntk_alpha; its
        # releases label it dynamic), so the default RoPE at that theta
        theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
        rope = {"rope_type": "default", "rope_theta": theta * float(rope["alpha"]) ** (head_dim / (head_dim - 2))}
        rope_type = "default"
    if rope_type == "dynamic":  # dynamic NTK (InternLM3): no scaling up to max_position_embeddings, the trainer's limit
        rope, rope_type = dynamic_ntk_as_default(hf, rope)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"config.json rope type {rope_type!r} is not supported; use one of: {', '.join(ROPE_TYPES)}.")
    args: dict[str, Any] = {
        "num_layers": int(hf["num_hidden_layers"]),
        "hidden_size": int(hf["hidden_size"]),
        "ffn_hidden_size": int(hf.get("intermediate_size") or hf["moe_intermediate_size"]),  # Qwen3.5-MoE: none
        "num_attention_heads": heads,
        "group_query_attention": kv_heads != heads,
        "num_query_groups": kv_heads,
        "kv_channels": head_dim,
        "padded_vocab_size": int(hf["vocab_size"]),
        "max_position_embeddings": int(hf.get("max_position_embeddings", 4096)),
        "rotary_base": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        "normalization": "RMSNorm",
        "norm_epsilon": float(hf["layer_norm_eps"] if model_type in ("stablelm", "cohere", "cohere2", "phi", "gpt_neox",
                                                                     "jais2") else hf["layer_norm_epsilon"] if model_type == "falcon" else hf["norm_epsilon"]
                              if model_type == "starcoder2" else hf["norm_eps"] if model_type == "nemotron"
                              else hf.get("rms_norm_eps", 1e-6)),
        "swiglu": True,
        "add_qkv_bias": (model_type == "qwen2" or bool(hf.get("attention_bias", False)) or bool(hf.get("use_qkv_bias"))
                         or (model_type == "qwen2_moe" and bool(hf.get("qkv_bias", True)))),
        "disable_bias_linear": True,
        "untie_embeddings_and_output_weights": not hf.get("tie_word_embeddings", False),
        "qk_layernorm": model_type in ("qwen3", "qwen3_moe", "hy_v3", "afmoe", "mellum")
        or (model_type in ("glm4_moe", "sarvam_moe") and bool(hf.get("use_qk_norm"))),
        "position_embedding_type": "rope",
    }
    if hf.get("clip_qkv") is not None:  # OLMo-7B-0424 / 0724's 8 (models/olmo.py)
        args["clip_qkv"] = float(hf["clip_qkv"])
    window = sliding_window(hf)
    if window:
        args["sliding_window"] = window
    if rotary_percent is not None:  # the first rotary_percent of each head is rotated (HF and megatron alike)
        args["rotary_percent"] = rotary_percent
    rotary_dim = int(head_dim * partial)
    if rope_type == "longrope":
        args.update(longrope_args(hf, rope, rotary_dim))
    if rope_type == "yarn":
        args.update(yarn_args(hf, rope))
    if rope_type == "linear":
        args.update(rope_scaling_type="linear", rope_scaling_factor=float(rope["factor"]))
    if rope_type == "llama3":
        args.update(rope_scaling_type="llama3", rope_scaling_factor=float(rope["factor"]),
                    low_freq_factor=float(rope["low_freq_factor"]),
                    high_freq_factor=float(rope["high_freq_factor"]),
                    original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
    if model_type in MOE_ARCHS and (model_type not in ("qwen3_next", "granitemoehybrid") or expert_count(hf)):
        args.update(moe_args_from_hf(hf))  # (a Qwen3-Next / Granite 4.0 config.json with no experts is dense)
    if model_type in MLA_ARCHS:
        args.update(mla_args(hf))
    if model_type == "smollm3":
        args.update(smollm3_args(hf, args["num_layers"]))
    if model_type in GRANITE_ARCHS:
        args.update(granite_args(hf))
    if model_type == "hyperclovax":  # HyperCLOVA X SEED Think: Granite's scalars, its logits_scaling a multiplier,
        # and Peri-LN (a norm on each attention / MLP output before the residual multiplier: Gemma 3's post norms)
        args.update(granite_args(hf), output_multiplier_scale=float(hf.get("logits_scaling") or 1.0),
                    softmax_scale=float(hf.get("attention_multiplier") or head_dim ** -0.5),
                    post_norm=hf.get("use_post_norm", True) is not False)
    if model_type == "granitemoehybrid":
        args.update(granite_hybrid_args(hf, args["num_layers"]))
    if model_type == "nemotron_h":
        args.update(nemotron_h_args(hf))
    if model_type == "falcon_h1":
        args.update(falcon_h1_args(hf))
    if model_type in ("lfm2", "lfm2_moe"):
        args.update(lfm2_args(hf, args["num_layers"]))
    if model_type in GEMMA_ARCHS:
        args.update(gemma_args(hf, args["num_layers"], head_dim))
    if model_type == "gemma4_text":
        args.update(gemma4_args(hf))
    if model_type in ("olmo2", "olmo3"):
        args.update(pre_norm=False, post_norm=True, qk_layernorm=True, qk_layernorm_across_heads=True)
    if model_type in ("minimax_m2", "olmoe"):  # OLMo 2's q / k norms over all heads, before the usual pre-norms' layers
        args.update(qk_layernorm=True, qk_layernorm_across_heads=True)
    if model_type in HUNYUAN_ARCHS:  # HunYuan: Qwen3's per-head q / k norms, applied to the rotated heads
        args.update(qk_layernorm=True, qk_layernorm_after_rope=True)
    if model_type == "flex_olmo":  # FlexOlmo: OLMo 2's layers (post norms only) with OLMoE's experts
        args.update(pre_norm=False, post_norm=True, qk_layernorm=True, qk_layernorm_across_heads=True)
    if model_type == "olmo3":
        args.update(olmo3_args(hf, args["num_layers"], rope_type, args["rotary_base"]))
    if model_type == "exaone4":
        args.update(exaone4_args(hf, args["num_layers"]))
    if model_type == "mellum":
        args.update(mellum_args(hf, args["num_layers"], args["rotary_base"], partial))
    if model_type == "afmoe":  # sandwich norms, the gate's own projection (models/qwen3_5.py), sliding / NoPE layers
        args.update(post_norm=True, attention_output_gate=True, attention_gate_proj=True,
                    input_embeds_norm=bool(hf.get("mup_enabled")), **sliding_nope_args(hf, args["num_layers"]))
    if model_type == "exaone_moe":  # EXAONE 4.0's attention under pre-norms (OLMoE's layer)
        args.update(qk_layernorm=True, **sliding_nope_args(hf, args["num_layers"]))
    if model_type == "glm4":  # GLM-4-0414 / GLM-Z1: norms after attention and MLP too, RoPE on interleaved pairs
        args.update(post_norm=True, rotary_interleaved=True)
    if model_type == "glm":  # GLM-4 (glm-4-9b-hf / -chat-hf): GLM-4-0414's layers without the norms after
        args["rotary_interleaved"] = True
    if model_type in LAYERNORM_ARCHS:
        args.update(layernorm_args(hf, model_type))
    if model_type == "cohere2":
        args.update(sliding_nope_args(hf, args["num_layers"]))
    if model_type in ("ernie4_5", "ernie4_5_moe", "helium"):  # ERNIE 4.5, Helium: Llama with RoPE on interleaved pairs
        args["rotary_interleaved"] = True
    if model_type == "nanochat":  # weightless RMSNorms, negated RoPE, fc1 / fc2 with relu(x)^2 (models/nanochat.py)
        args.update(nanochat_args(hf))
    if model_type == "arcee":  # Arcee: up_proj alone, relu(x)^2
        args.update(swiglu=False, squared_relu=True)
    if model_type == "apertus":  # Apertus: up_proj alone, xIELU (models/xielu.py), Qwen3's per-head q / k norms
        args.update(swiglu=False, xielu=True, qk_layernorm=True)
    if model_type == "gpt_oss":
        args.update(gpt_oss_args(hf, args["num_layers"]))
    if model_type in QWEN3_5_ARCHS:
        args.update(qwen3_5_args(hf, args["num_layers"]))
    if model_type == "ministral3" and float(rope.get("llama_4_scaling_beta") or 0.0):
        args["max_position_embeddings"] = min(args["max_position_embeddings"], llama4_scaling_limit(hf, rope))
    return args


EXAONE_ALIASES = {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps", "activation_function": "hidden_act"}
# transformers' ApertusConfig's rope when config.json has none (its releases write the same)
APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}


# model types that are another's layout and math under their own name -> that one (text_model_config):
# Kimi K2 (moonshotai/Kimi-K2-*: DeepseekV3ForCausalLM with remote code for its config class)
# (Sarvam-105B: hf_moe_config.sarvam_mla_config); MiMo-7B (mimo): Qwen2 with multi-token-prediction layers, not read
# dots.llm1 (dots1): GLM-4.5's layer and routing (hf_moe_config.dots1_config)
SAME_AS = {"kimi_k2": "deepseek_v3", "sarvam_mla": "deepseek_v3", "mimo": "qwen2", "dots1": "glm4_moe",
           "solar_open": "glm4_moe"}  # (Solar Open: hf_moe_config.solar_open_config)
# image-text model_type -> its text model's model_type and class (text_model_config)
IMAGE_TEXT_ARCHS = {"gemma3": ("gemma3_text", "Gemma3ForCausalLM"), "mistral3": ("mistral", "MistralForCausalLM"),
                    "qwen2_vl": ("qwen2", "Qwen2ForCausalLM"), "qwen2_5_vl": ("qwen2", "Qwen2ForCausalLM"),
                    "qwen3_vl": ("qwen3", "Qwen3ForCausalLM"), "qwen3_vl_moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
                    "qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM"), "lfm2_vl": ("lfm2", "Lfm2ForCausalLM"),
                    "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"),
                    "gemma4": ("gemma4_text", "Gemma4ForCausalLM")}
MROPE_ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")  # multimodal RoPE, the 1-D RoPE on text (text_model_config)
# a text_config model_type that names its own text model (else IMAGE_TEXT_ARCHS' default): Ministral 3's
TEXT_MODELS = {"ministral3": "Ministral3ForCausalLM"}


def supported_types() -> str:
    """The config.json model types `load:` takes, for messages."""
    return ", ".join((*HF_ARCHS, *(f"{k} (as {v})" for k, v in SAME_AS.items()),
                      *(f"{k} (its text model)" for k in IMAGE_TEXT_ARCHS)))


def text_model_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config.json of the text model inside an image-text one, else `config` itself: Gemma 3 4B /
    12B / 27B and their -it versions (`gemma3`, Gemma3ForConditionalGeneration), Mistral Small 3.1 /
    3.2 and Magistral Small 1.1+ (`mistral3`, Mistral3ForConditionalGeneration). Their text_config
    lists only what differs from transformers' defaults (gemma-3-4b-it: hidden and MLP sizes, layers,
    rope_scaling, window), so transformers' config class of the text model completes it; the result
    is the text model's config.json (gemma3_text / Gemma3ForCausalLM, mistral / MistralForCausalLM),
    which is what GRPO trains, vLLM serves and the export writes. Likewise Qwen2-VL / Qwen2.5-VL
    (qwen2_vl, qwen2_5_vl: a Qwen2, their 4.x files with the text keys at the top level) and Qwen3-VL
    (qwen3_vl: a Qwen3) and Qwen3-VL-MoE (qwen3_vl_moe: a Qwen3-MoE whose router always renormalises, its
    experts stored stacked: hf_bridge/names.py), whose multimodal RoPE is the 1-D one on text (without_mrope). Gemma 4
    (gemma4: Gemma4ForConditionalGeneration) holds a gemma4_text. Ministral 3
    (mistral3 whose text_config is a ministral3) keeps its own text model type (TEXT_MODELS), whose
    defaults differ from Mistral's (no window). The vision tower's weights stay in
    the checkpoint unread (hf_bridge/names.py maps the language model's prefixed names). Tied
    embeddings: config.json's top-level tie_word_embeddings where it has one (transformers 5 ties by
    it), else the text model's (4.x: Gemma 3 tied, Mistral untied). A model type in SAME_AS (Kimi K2, Sarvam MLA with
    its keys renamed) becomes the one it is (deepseek_v3), without its remote-code `auto_map`; MiMo-7B (mimo) the
    Qwen2 it is, its multi-token-prediction layers (model.mtp_layers.*) left unread as GLM-4.5's are."""
    if config.get("model_type") in SAME_AS:  # read, served and exported as that model type, no remote code
        config = sarvam_mla_config(config) if config["model_type"] == "sarvam_mla" else config
        config = dots1_config(config) if config["model_type"] == "dots1" else config
        config = solar_open_config(config) if config["model_type"] == "solar_open" else config
        if config["model_type"] == "mimo" and config.get("attention_bias") is False:  # (Qwen2's are always there)
            raise ValueError("config.json attention_bias false is not supported for mimo (Qwen2's q / k / v biases).")
        config = dict(config, architectures=["Qwen2ForCausalLM"]) if config["model_type"] == "mimo" else config
        return {**{k: v for k, v in config.items() if k != "auto_map"}, "model_type": SAME_AS[config["model_type"]]}
    text_type, cls = IMAGE_TEXT_ARCHS.get(config.get("model_type"), (None, None))
    if text_type is None:
        return dict(config)
    from transformers import AutoConfig

    text = dict(config.get("text_config") or {})
    if not text and config.get("model_type") in MROPE_ARCHS:  # Qwen2(.5)-VL's 4.x files: the text keys on top
        text = {k: v for k, v in config.items() if k not in ("vision_config", "architectures")}
    if text.get("model_type") in TEXT_MODELS:  # Ministral 3 inside mistral3: completed with its own defaults
        text_type, cls = text["model_type"], TEXT_MODELS[text["model_type"]]
    text = {k: v for k, v in text.items() if k != "model_type"}
    if config.get("model_type") in MROPE_ARCHS:
        text = without_mrope(text)
    if config.get("model_type") == "qwen3_vl_moe":  # its router always renormalises the top-k (no key for it)
        text["norm_topk_prob"] = True
    out = AutoConfig.for_model(text_type, **text).to_dict()
    out.update(model_type=text_type, architectures=[cls],
               tie_word_embeddings=bool(config.get("tie_word_embeddings", out.get("tie_word_embeddings", False))))
    for key in ("torch_dtype", "dtype"):
        if config.get(key) and not text.get(key):
            out[key] = config[key]
    return out


def without_mrope(text: Mapping[str, Any]) -> dict[str, Any]:
    """A Qwen-VL text config with its multimodal RoPE as the plain one: M-RoPE rotates sections of
    each head by a temporal, a height and a width position, which are one and the same position on
    text (transformers' get_rope_index: the cumulative mask, as here; vLLM's alike), so every
    frequency turns by the token's position, exactly the 1-D RoPE. GRPO here trains on text only.
    rope_scaling / rope_parameters lose mrope_section / mrope_interleaved, and type "mrope" is the
    default rope."""
    out = dict(text)
    for key in ("rope_scaling", "rope_parameters"):
        rope = out.get(key)
        if isinstance(rope, Mapping) and ("mrope_section" in rope or "mrope" in (rope.get("type"), rope.get("rope_type"))):
            rope = {k: v for k, v in rope.items() if k not in ("mrope_section", "mrope_interleaved", "type")}
            rope["rope_type"] = "default" if rope.get("rope_type", "mrope") == "mrope" else rope["rope_type"]
            out[key] = rope
    return out


def gemma_activation(hf: Mapping[str, Any]) -> str:
    """The MLP activation transformers uses for a Gemma config.json: Gemma 2 / 3 read
    hidden_activation (default gelu_pytorch_tanh); Gemma 1 reads hidden_act, whose legacy "gelu" in
    the official releases means the tanh approximation (transformers' GemmaConfig switches it)."""
    if hf.get("model_type") == "gemma":
        act = hf.get("hidden_act") or "gelu_pytorch_tanh"
        return "gelu_pytorch_tanh" if act == "gelu" else act
    return hf.get("hidden_activation") or "gelu_pytorch_tanh"


def gemma_args(hf: Mapping[str, Any], num_layers: int, head_dim: int) -> dict[str, Any]:
    """Gemma 3 (text: gemma-3-270m, gemma-3-1b; Gemma3ForCausalLM) and Gemma 2 in MindSpeed-LLM's Gemma names:
    RMSNorms that scale by (1 + weight), computed in fp32 (add_rmsnorm_offset); a norm after attention
    and after the MLP as well as before them (post_norm); the embeddings times sqrt(hidden_size) in
    the model's dtype (input_embeds_norm); GeGLU with tanh GELU (geglu); q/k norms; the scores
    scaled by query_pre_attn_scalar^-1/2 (softmax_scale). Its layer types alternate: "sliding_attention"
    layers attend to the latest sliding_window positions and rotate with their own theta
    (rope_local_base_freq, 10000), "full_attention" layers attend to everything with rope_theta and
    rope_scaling: megatron-core's window_attn_skip_freq list (1 = sliding). Bidirectional attention
    (EmbeddingGemma) is refused.

    Gemma 2 (gemma2: gemma-2-2b / 9b / 27b and -it) is the same without q/k norms and with one rotary
    table, its even layers (0, 2, ...) sliding, and soft-capped scores and logits: cap x tanh(x / cap)
    (attn_logit_softcapping 50, final_logit_softcapping 30: MindSpeed-LLM's attn_logit_softcapping /
    output_logit_softcapping).

    VaultGemma (vaultgemma: vaultgemma-1b) is Gemma 2 without the norms after attention and MLP.

    Gemma 1 (gemma: gemma-2b / 7b, CodeGemma) has the (1 + w) norms, the embedding scale and GeGLU
    only: pre-norms, no q/k norms, full attention everywhere, scores scaled by head_dim^-1/2."""
    if hf.get("model_type") == "gemma":
        return {"swiglu": False, "geglu": True, "add_rmsnorm_offset": True, "input_embeds_norm": True,
                "norm_epsilon": float(hf.get("rms_norm_eps", 1e-6))}
    gemma2 = hf.get("model_type") in ("gemma2", "vaultgemma")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("config.json use_bidirectional_attention=true (an embedding model) is not supported; "
                         "GRPO needs causal attention.")
    # transformers 4.x: Gemma 2's every second layer attends fully, Gemma 3's every sliding_window_pattern-th
    pattern = 2 if gemma2 else int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6)
    types = layer_types(hf, num_layers, pattern)
    local = local_rope_parameters(hf)
    window = hf.get("sliding_window")
    longest = int(hf.get("max_position_embeddings", 4096))
    args = {"swiglu": False, "geglu": True, "add_rmsnorm_offset": True, "input_embeds_norm": True,
            "post_norm": hf.get("model_type") != "vaultgemma",
            "qk_layernorm": not gemma2, "norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
            "softmax_scale": float(hf.get("query_pre_attn_scalar") or 256) ** -0.5,  # transformers' default 256
            "window_attn_skip_freq": types}
    if not gemma2:
        args["rope_local_base_freq"] = float(local.get("rope_theta") or hf.get("rope_local_base_freq") or 10000.0)
    # transformers' defaults where config.json omits the key: Gemma 2 caps (50, 30), Gemma 3 does not
    for key, ours, default in (("attn_logit_softcapping", "attn_logit_softcapping", 50.0),
                               ("final_logit_softcapping", "output_logit_softcapping", 30.0)):
        cap = hf[key] if key in hf else (default if gemma2 else None)
        if cap is not None:
            args[ours] = float(cap)
    if window and int(window) < longest:
        args["sliding_window"] = int(window)
    return args


def layer_types(hf: Mapping[str, Any], num_layers: int, full_every: int) -> list[int]:
    """config.json's layer_types (Gemma 2 / 3, OLMo 3) as window_attn_skip_freq's list (1 = a
    sliding_attention layer); without the key (transformers 4.x configs) every `full_every`-th layer
    attends fully, as transformers fills it in."""
    types = hf.get("layer_types")
    if types is None:
        types = ["full_attention" if (i + 1) % full_every == 0 else "sliding_attention" for i in range(num_layers)]
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown or len(types) < num_layers:
        raise ValueError(f"config.json layer_types must name sliding_attention or full_attention for each of "
                         f"{num_layers} layers; it has {len(types)} entries{', and ' + ', '.join(unknown) if unknown else ''}.")
    return [int(t == "sliding_attention") for t in types[:num_layers]]


def local_rope_parameters(hf: Mapping[str, Any]) -> dict[str, Any]:
    """transformers 5's rope_parameters.sliding_attention ({} when absent), which must be the default rope."""
    params = hf.get("rope_parameters") or {}
    local = dict(params["sliding_attention"]) if isinstance(params.get("sliding_attention"), Mapping) else {}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"config.json rope_parameters.sliding_attention rope_type {local['rope_type']!r} is not "
                         f"supported; the sliding layers of {hf.get('model_type')} rotate with the default rope.")
    return local


def mellum_args(hf: Mapping[str, Any], num_layers: int, theta: float, partial: float) -> dict[str, Any]:
    """Mellum (mellum: JetBrains' Mellum2-12B-A2.5B) is Qwen3-MoE's layer (hf_moe_config reads its mlp_layer_types)
    with sliding layers where layer_types says (window sliding_window), which rotate with their own default rope
    (rope_parameters.sliding_attention: rope_local_base_freq) on the same part of each head as the full layers."""
    local = local_rope_parameters(hf)
    if float(local.get("partial_rotary_factor") or 1.0) != partial:
        raise ValueError(f"config.json rope_parameters.sliding_attention partial_rotary_factor "
                         f"{local.get('partial_rotary_factor')} differs from the full layers' {partial}; megatron "
                         f"rotates the same part of each head in every layer.")
    types = layer_types(hf, num_layers, 1)
    args: dict[str, Any] = {"window_attn_skip_freq": types} if any(types) else {}
    window = hf.get("sliding_window")
    if any(types) and window and int(window) < int(hf.get("max_position_embeddings", 4096)):
        args["sliding_window"] = int(window)
    if any(types) and float(local.get("rope_theta") or theta) != theta:
        args["rope_local_base_freq"] = float(local["rope_theta"])
    return args


def qwen3_5_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """Qwen3.5 (qwen3_5_text: the text model of Qwen3.5-0.8B ... 27B, `qwen3_5` checkpoints) mixes tokens
    with Gated DeltaNet in three of every four layers (layer_types "linear_attention": models/gated_delta_net.py,
    its sizes the linear_* keys) and attention in the others, whose output is gated by sigmoid of a second
    query-sized projection (models/qwen3_5.py; transformers always gates it, whatever attn_output_gate says),
    with per-head q / k norms and RoPE on the first quarter of each head (partial_rotary_factor). Every norm
    but the mixer's own scales by (1 + weight) (add_rmsnorm_offset). Its multi-token-prediction layers
    (mtp_num_hidden_layers, stored as mtp.*) are not read. Qwen3.5-MoE (qwen3_5_moe_text: Qwen3.5-35B-A3B,
    122B-A10B, 397B-A17B) is the same with every MLP Qwen2-MoE's (moe_args_from_hf: softmax routing, the top-k
    always renormalised, a shared expert with a sigmoid gate). Qwen3-Next (qwen3_next: Qwen3-Next-80B-A3B) is
    Qwen3.5-MoE's layers under other names: its DeltaNet projections fused per key head (in_proj_qkvz /
    in_proj_ba: hf_bridge/names.py), its routing renormalised as norm_topk_prob says, dense layers where
    mlp_only_layers / decoder_sparse_step put them (hf_moe_config.qwen_moe_layers)."""
    types = hf.get("layer_types")
    if types is None:
        every = int(hf.get("full_attention_interval") or 4)
        types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(num_layers)]
    unknown = sorted(set(types) - {"linear_attention", "full_attention"})
    if unknown or len(types) < num_layers:
        raise ValueError(f"config.json layer_types must name linear_attention or full_attention for each of "
                         f"{num_layers} layers; it has {len(types)} entries{', and ' + ', '.join(unknown) if unknown else ''}.")
    args = {"linear_attention_layers": [int(t == "linear_attention") for t in types[:num_layers]],
            "attention_output_gate": True, "add_rmsnorm_offset": True, "qk_layernorm": True}
    for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "linear_conv_kernel_dim"):
        args[key] = int(hf[key])
    return args


def olmo3_args(hf: Mapping[str, Any], num_layers: int, rope_type: str, theta: float) -> dict[str, Any]:
    """OLMo 3 (olmo3: Olmo-3-7B / 32B, base, -Instruct, -Think) is OLMo 2 with sliding-window layers:
    three of every four (layer_types; window 4096) attend to the latest sliding_window positions and
    rotate with the default rope at rope_theta, the full ones with rope_theta and rope_scaling (YaRN
    on the 65k-context models, attention factor included). So: Gemma 3's window pattern and local
    rotary table (window_attn_skip_freq, rope_local_base_freq, the latter only where the two tables
    differ), the attention factor on the full layers only (builder.rope_attention_scaling)."""
    window = hf.get("sliding_window")
    args: dict[str, Any] = {"window_attn_skip_freq": layer_types(hf, num_layers, 4)}
    if window and int(window) < int(hf.get("max_position_embeddings", 4096)):
        args["sliding_window"] = int(window)
    local_theta = float(local_rope_parameters(hf).get("rope_theta") or theta)
    if rope_type != "default" or local_theta != theta:
        args["rope_local_base_freq"] = local_theta
    return args


def window_pattern(window_attn_skip_freq: Any, num_layers: int) -> Optional[list[int]]:
    """megatron-core's window_attn_skip_freq as one 0/1 per layer (1 = a sliding-window layer): an
    int N means one full-attention layer after N - 1 sliding ones (layer numbers divisible by N
    attend fully), a list is taken as is. None: every layer is a sliding one (when there is a
    window). ValueError with the fix otherwise."""
    if window_attn_skip_freq is None:
        return None
    if isinstance(window_attn_skip_freq, bool) or not isinstance(window_attn_skip_freq, (int, list, tuple)):
        raise ValueError(f"window_attn_skip_freq {window_attn_skip_freq!r} must be an integer N (every N-th layer "
                         f"attends fully) or a list of 0 / 1 per layer (1 = sliding window).")
    if isinstance(window_attn_skip_freq, int):
        if window_attn_skip_freq < 1:
            raise ValueError(f"window_attn_skip_freq {window_attn_skip_freq} must be at least 1.")
        return [int((i + 1) % window_attn_skip_freq != 0) for i in range(num_layers)]
    pattern = list(window_attn_skip_freq)
    if len(pattern) != num_layers or any(x not in (0, 1) for x in pattern):
        raise ValueError(f"window_attn_skip_freq {pattern} must hold one 0 or 1 per layer ({num_layers}; 1 = "
                         f"sliding window).")
    return [int(x) for x in pattern]


def smollm3_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """SmolLM3's NoPE layers as megatron-core's no_rope_freq (a list, 1 = no RoPE): config.json's
    no_rope_layers (1 = RoPE), or every no_rope_layer_interval-th layer without it (transformers'
    default, 4)."""
    layers = hf.get("no_rope_layers")
    if layers is None:
        interval = int(hf.get("no_rope_layer_interval") or 4)
        layers = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(layers) < num_layers:
        raise ValueError(f"config.json no_rope_layers has {len(layers)} entries for {num_layers} layers.")
    skip = [0 if int(x) else 1 for x in layers[:num_layers]]
    return {"no_rope_freq": skip} if any(skip) else {}


def no_rope_pattern(no_rope_freq: Any, num_layers: int) -> Optional[list[int]]:
    """megatron-core's no_rope_freq as one 0/1 per layer (1 = that layer applies no RoPE): an int N
    means every N-th layer (N divides num_layers), a list is taken as is (one entry per layer). None
    or 0: every layer applies RoPE. ValueError with the fix otherwise."""
    if not no_rope_freq:
        return None
    if isinstance(no_rope_freq, bool) or not isinstance(no_rope_freq, (int, list, tuple)):
        raise ValueError(f"no_rope_freq {no_rope_freq!r} must be an integer N (every N-th layer without RoPE) or a "
                         f"list of 0 / 1 per layer (1 = no RoPE).")
    if isinstance(no_rope_freq, int):
        if no_rope_freq < 1 or num_layers % no_rope_freq:
            raise ValueError(f"no_rope_freq {no_rope_freq} must divide num_layers {num_layers} (every N-th layer "
                             "applies no RoPE).")
        return ([0] * (no_rope_freq - 1) + [1]) * (num_layers // no_rope_freq)
    pattern = list(no_rope_freq)
    if len(pattern) != num_layers or any(x not in (0, 1) for x in pattern):
        raise ValueError(f"no_rope_freq {pattern} must hold one 0 or 1 per layer ({num_layers}; 1 = no RoPE).")
    return [int(x) for x in pattern]


def exaone4_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """EXAONE 4.0 (exaone4: 1.2B, 32B) normalises the attention and MLP outputs only (OLMo 2's post
    norms: pre_norm false, post_norm) and each head's q / k (Qwen3's qk_layernorm). With a
    sliding_window (32B) its layers are hybrid: three of every four (layer_types, or
    sliding_window_pattern "LLLG" / 4) attend to the latest sliding_window positions with RoPE, the
    fourth attends fully without RoPE ("global NoPE"): window_attn_skip_freq, and no_rope_freq on
    the full layers. Without one (1.2B) every layer attends fully with RoPE."""
    return {"pre_norm": False, "post_norm": True, "qk_layernorm": True, **sliding_nope_args(hf, num_layers)}


def sliding_nope_args(hf: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """The hybrid layers of EXAONE 4.0 (32B) and Cohere 2 (Command R7B, Command A): with a sliding_window, three of
    every four (layer_types, or sliding_window_pattern "LLLG" / 4) attend to the latest sliding_window positions with
    RoPE, the fourth attends fully without RoPE ("global NoPE"): window_attn_skip_freq, and no_rope_freq on the full
    layers. Without one every layer attends fully with RoPE (no keys)."""
    args: dict[str, Any] = {}
    window = hf.get("sliding_window")
    if not window:
        return args
    pattern = hf.get("sliding_window_pattern")
    if hf.get("layer_types") is None and isinstance(pattern, str):  # "LLLG": L sliding, G full, repeated
        if set(pattern) - {"L", "G"} or not pattern:
            raise ValueError(f"config.json sliding_window_pattern {pattern!r} must be a string of L (sliding) and G "
                             f"(full attention) layers, e.g. LLLG.")
        types = [int(pattern[i % len(pattern)] == "L") for i in range(num_layers)]
    else:
        types = layer_types(hf, num_layers, int(pattern or 4))
    args["window_attn_skip_freq"] = types
    if not all(types):
        args["no_rope_freq"] = [1 - t for t in types]
    if int(window) < int(hf.get("max_position_embeddings", 4096)):
        args["sliding_window"] = int(window)
    return args


def sliding_window(hf: Mapping[str, Any]) -> Optional[int]:
    """The window of a Mistral / Mixtral / Phi-3 config.json whose every layer attends to at most that
    many latest positions, when it is shorter than max_position_embeddings (else it never applies);
    None otherwise."""
    window = hf.get("sliding_window") if hf.get("model_type") in WINDOW_ARCHS else None
    longest = int(hf.get("max_position_embeddings", 4096))
    return int(window) if window and int(window) < longest else None


def kv_channels(args: Mapping[str, Any]) -> int:
    """The attention head dimension of Megatron-named args: kv_channels, else multi-latent attention's
    v_head_dim (the width megatron sizes its attention output by), else hidden_size / heads."""
    if args.get("kv_channels"):
        return int(args["kv_channels"])
    if args.get("multi_latent_attention") and args.get("v_head_dim"):
        return int(args["v_head_dim"])
    return int(args["hidden_size"]) // int(args["num_attention_heads"])
