"""`load:` a HF directory with an empty model yaml: the architecture comes from config.json.

Table over every architecture the model builder supports (Llama with llama3 rope scaling, Mistral,
Phi-3, Qwen2 / Qwen2.5, Qwen3, Qwen3-MoE, Qwen2-MoE, Mixtral, SmolLM3, Granite, Gemma 3, Gemma 2, Gemma 1, OLMo 2, OLMo 3, Ministral 3, EXAONE 4.0, Seed-OSS, GLM-4, ERNIE 4.5, Arcee, GLM-4.5, DeepSeek-V3, DeepSeek-V2, GLM-4.7-Flash, gpt-oss, MiniMax-M2, Qwen3.5, Qwen3-Next, OLMoE, FlexOlmo, HunYuan, HunYuan-MoE, Granite MoE, Granite 4.0, GLM-4 (glm), Helium, StableLM 2, Nemotron, Cohere, Cohere 2, Phi-2, GPT-NeoX, Falcon, OLMo, StarCoder2, Nemotron-H, Falcon-H1, LFM2, LFM2-MoE, EXAONE 3.5, EXAONE MoE, HyperCLOVA X, IQuest-Coder, Hy3, AFMoE, Sarvam MoE, Sarvam MLA, Jais 2, Mellum): an empty model entry (or none at all) dry-runs; a key the user did set that
disagrees fails in dry_run with one sentence naming both values; weights whose safetensors
headers do not fit config.json fail in dry_run too (headers only).
"""
import json
from pathlib import Path

import pytest

import ray_gpt
from testing_utils import make_tiny_hf
from mindspeed_rl.config import load_config
from mindspeed_rl.models.hf_config import HF_ARCHS

CONFIGS = Path(__file__).resolve().parents[2] / "data" / "ray_gpt_configs"
ARCHS = {"llama": dict(rotary_base=5000.0, rope_scaling_type="llama3", untie_embeddings_and_output_weights=True),
         "phi3": dict(rotary_base=10000.0, rotary_percent=1.0, untie_embeddings_and_output_weights=False),
         "mistral": dict(rotary_base=1e6, rope_scaling_type=None, untie_embeddings_and_output_weights=True,
                         max_position_embeddings=128),
         "qwen2": dict(add_qkv_bias=True, untie_embeddings_and_output_weights=False),
         "qwen3": dict(qk_layernorm=True, kv_channels=32),
         "qwen3_moe": dict(qk_layernorm=True, kv_channels=32, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                           norm_topk_prob=True),
         "qwen2_moe": dict(add_qkv_bias=True, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                           norm_topk_prob=False, moe_shared_expert_intermediate_size=64, shared_expert_gate=True),
         "mixtral": dict(rotary_base=1e6, qk_layernorm=False, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128,
                         norm_topk_prob=True, untie_embeddings_and_output_weights=True),
         "smollm3": dict(rotary_base=5e5, no_rope_freq=[0, 1], untie_embeddings_and_output_weights=False),
         "granite": dict(embedding_multiplier_scale=2.0, residual_multiplier=0.5, output_multiplier_scale=2.0,
                         softmax_scale=0.2),
         # Granite's MoE models: those scalars, Mixtral's routing over 4 experts intermediate_size wide, tied; a shared
         # MLP without a gate (granitemoeshared); Granite 4.0's dense model, its shared_mlp (96 wide) the MLP
         "granitemoe": dict(embedding_multiplier_scale=2.0, residual_multiplier=0.5, output_multiplier_scale=2.0,
                            softmax_scale=0.2, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128,
                            norm_topk_prob=True, untie_embeddings_and_output_weights=False),
         "granitemoeshared": dict(embedding_multiplier_scale=2.0, num_experts=4, moe_ffn_hidden_size=128,
                                  moe_shared_expert_intermediate_size=48, shared_expert_gate=False),
         "granitemoehybrid": dict(embedding_multiplier_scale=2.0, softmax_scale=0.2, rotary_base=1e7,
                                  untie_embeddings_and_output_weights=False),
         # GLM-4 (glm-4-9b-hf): q / k / v biases, RoPE on interleaved pairs of half of each head, no post norms
         "glm": dict(add_qkv_bias=True, rotary_interleaved=True, rotary_percent=0.5, post_norm=False, kv_channels=16),
         # Helium-1: RoPE on interleaved pairs of the whole head, eps 1e-8
         "helium": dict(rotary_interleaved=True, add_qkv_bias=False, norm_epsilon=1e-8, kv_channels=16),
         # StableLM 2 1.6B: LayerNorms with biases, q / k / v biases, RoPE on a quarter of each head
         "stablelm": dict(normalization="LayerNorm", add_qkv_bias=True, rotary_percent=0.25, norm_epsilon=1e-5),
         # StarCoder2: LayerNorms, biases on every linear layer, gelu_tanh(c_fc) without a gate
         "starcoder2": dict(normalization="LayerNorm", swiglu=False, openai_gelu=True, add_qkv_bias=True,
                            disable_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0),
         # Nemotron: LayerNorm1P, relu(up)^2 without a gate, RoPE on half of each head, no biases
         "nemotron": dict(normalization="LayerNorm", apply_layernorm_1p=True, swiglu=False, squared_relu=True,
                          rotary_percent=0.5, add_qkv_bias=False, disable_bias_linear=True, kv_channels=16),
         # Jais 2: LayerNorms with biases, relu(up)^2 without a gate, biases on every linear layer
         "jais2": dict(normalization="LayerNorm", swiglu=False, squared_relu=True, add_qkv_bias=True,
                       disable_bias_linear=False, untie_embeddings_and_output_weights=True),
         # Command R: a parallel-residual layer with weight-only LayerNorms, interleaved RoPE, the logits x 0.25
         "cohere": dict(normalization="LayerNorm", layernorm_bias=False, parallel_residual=True, rotary_interleaved=True,
                        output_multiplier_scale=0.25, untie_embeddings_and_output_weights=False),
         # Command R7B: that layer, the first sliding with RoPE, the second full without
         "cohere2": dict(parallel_residual=True, layernorm_bias=False, window_attn_skip_freq=[1, 0], no_rope_freq=[0, 1],
                         sliding_window=12, output_multiplier_scale=0.25),
         # Phi-2: Cohere's layer with LayerNorm biases, biases everywhere and on lm_head, gelu_tanh(fc1) without a gate
         "phi": dict(parallel_residual=True, add_output_layer_bias=True, openai_gelu=True, swiglu=False,
                     disable_bias_linear=False, rotary_percent=0.4, layernorm_bias=True),
         # OLMo 1: Llama's layout with LayerNorms without weight or bias
         "olmo": dict(normalization="LayerNorm", layernorm_affine=False, norm_epsilon=1e-5, clip_qkv=None),
         # Falcon-7B: multi-query, one LayerNorm before attention and MLP beside each other, exact gelu, no biases, tied
         "falcon": dict(parallel_residual=True, parallel_residual_mlp_norm=False, swiglu=False, openai_gelu=False,
                        disable_bias_linear=True, add_qkv_bias=False, untie_embeddings_and_output_weights=False,
                        normalization="LayerNorm"),
         # Pythia: multi-head, x + attn(ln1 x) + mlp(ln2 x), biases everywhere, exact gelu, RoPE on a quarter, untied
         "gpt_neox": dict(parallel_residual=True, parallel_residual_mlp_norm=True, swiglu=False, openai_gelu=False,
                          disable_bias_linear=False, add_qkv_bias=True, rotary_percent=0.25, group_query_attention=False,
                          untie_embeddings_and_output_weights=True, normalization="LayerNorm"),
         "gemma3_text": dict(window_attn_skip_freq=[1, 0], sliding_window=12, rope_local_base_freq=1e4, post_norm=True,
                             add_rmsnorm_offset=True, geglu=True, swiglu=False, input_embeds_norm=True,
                             rope_scaling_type="linear", rotary_base=1e5),
         "gemma2": dict(window_attn_skip_freq=[1, 0], sliding_window=12, post_norm=True, qk_layernorm=False,
                        attn_logit_softcapping=1.0, output_logit_softcapping=2.0, rope_local_base_freq=None),
         # VaultGemma: Gemma 2 without the norms after attention and MLP
         "vaultgemma": dict(window_attn_skip_freq=[1, 0], sliding_window=12, post_norm=False, qk_layernorm=False,
                            attn_logit_softcapping=1.0, output_logit_softcapping=2.0, add_rmsnorm_offset=True),
         "gemma": dict(add_rmsnorm_offset=True, input_embeds_norm=True, geglu=True, post_norm=False, kv_channels=16),
         "olmo2": dict(pre_norm=False, post_norm=True, qk_layernorm=True, qk_layernorm_across_heads=True,
                       rotary_base=5e5, untie_embeddings_and_output_weights=True),
         "olmo3": dict(pre_norm=False, post_norm=True, qk_layernorm_across_heads=True, window_attn_skip_freq=[1, 0],
                       sliding_window=12, rope_local_base_freq=5e5, rope_scaling_type="yarn", rope_scaling_factor=4.0,
                       rope_attention_factor=1.2),
         "exaone4": dict(pre_norm=False, post_norm=True, qk_layernorm=True, qk_layernorm_across_heads=False,
                         window_attn_skip_freq=[1, 0], no_rope_freq=[0, 1], sliding_window=12, rope_scaling_type="llama3"),
         "glm4": dict(rotary_interleaved=True, rotary_percent=0.5, post_norm=True, add_qkv_bias=True, kv_channels=16),
         "ernie4_5": dict(rotary_interleaved=True, untie_embeddings_and_output_weights=False, kv_channels=16),
         "glm4_moe": dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=[0, 1],
                          moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                          moe_router_num_groups=2, moe_router_group_topk=1, moe_router_topk_scaling_factor=1.5,
                          moe_shared_expert_intermediate_size=32, rotary_percent=0.5, add_qkv_bias=True,
                          qk_layernorm=True, kv_channels=16),
         # dots.llm1: GLM-4.5's routing and layout under Qwen3's attention (whole-head RoPE, no biases), read as GLM-4.5
         "dots1": dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=[0, 1],
                       moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_num_groups=2,
                       moe_router_group_topk=1, moe_router_topk_scaling_factor=1.5,
                       moe_shared_expert_intermediate_size=32, rotary_percent=1.0, add_qkv_bias=False,
                       qk_layernorm=True),
         # Solar Open: Llama's attention (head_dim 16) with GLM-4.5's MoE in every layer, read as GLM-4.5
         "solar_open": dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_router_score_function="sigmoid",
                            moe_router_enable_expert_bias=True, moe_router_num_groups=2, moe_router_group_topk=1,
                            moe_router_topk_scaling_factor=1.5, moe_shared_expert_intermediate_size=32,
                            qk_layernorm=False, add_qkv_bias=False, kv_channels=16),
         # DeepSeek-V3: multi-latent attention (every head its own key and value), GLM-4.5's MoE layout
         "deepseek_v3": dict(multi_latent_attention=True, qk_layernorm=True, q_lora_rank=24, kv_lora_rank=16, qk_head_dim=16,
                             qk_pos_emb_head_dim=8, v_head_dim=16, kv_channels=16, group_query_attention=False,
                             num_query_groups=4, num_experts=4, moe_layer_freq=[0, 1],
                             moe_router_score_function="sigmoid", rope_scaling_type="yarn",
                             rope_scaling_mscale_all_dim=0.8),
         # Sarvam-105B: DeepSeek-V3's MLA without a query rank, routing without groups x 2.5, under its release's spellings
         "sarvam_mla": dict(multi_latent_attention=True, qk_layernorm=True, q_lora_rank=None, kv_lora_rank=16,
                            qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, kv_channels=16,
                            group_query_attention=False, num_query_groups=4, num_experts=4, moe_layer_freq=[0, 1],
                            moe_router_score_function="sigmoid", moe_router_topk_scaling_factor=2.5,
                            rope_scaling_type="yarn", rope_scaling_mscale_all_dim=0.8),
         # DeepSeek-V2-Lite: MLA without a query rank, softmax routing not renormalised, weights x 2
         "deepseek_v2": dict(multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=16, qk_pos_emb_head_dim=8,
                             num_experts=4, moe_router_score_function="softmax", norm_topk_prob=False,
                             moe_router_topk_scaling_factor=2.0, moe_shared_expert_intermediate_size=32),
         # GLM-4.7-Flash: DeepSeek-V3's layout, its dense first layer from mlp_layer_types
         "glm4_moe_lite": dict(multi_latent_attention=True, q_lora_rank=24, kv_lora_rank=16, qk_head_dim=16,
                               qk_pos_emb_head_dim=8, v_head_dim=24, kv_channels=24, num_experts=4, moe_layer_freq=[0, 1],
                               moe_router_score_function="sigmoid", moe_router_topk_scaling_factor=1.8,
                               moe_shared_expert_intermediate_size=32, rotary_base=1e6),
         # gpt-oss: sinks, biases everywhere, the clamped SwiGLU, sliding / full layers, YaRN without rounding
         "gpt_oss": dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128, norm_topk_prob=True,
                         disable_bias_linear=False, add_qkv_bias=True, softmax_type="learnable", quick_geglu=True,
                         glu_linear_offset=1.0, activation_func_clamp_value=0.5, window_attn_skip_freq=[1, 0],
                         sliding_window=12, rope_scaling_type="yarn", rope_scaling_truncate=False, kv_channels=16,
                         rotary_base=1.5e5, untie_embeddings_and_output_weights=True),
         # MiniMax-M2: q / k norms across heads under the usual pre-norms, RoPE on half of each head, sigmoid routing
         # with the expert bias, every layer MoE, experts as wide as intermediate_size
         "minimax_m2": dict(qk_layernorm=True, qk_layernorm_across_heads=True, pre_norm=True, rotary_percent=0.5,
                            num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128, moe_router_score_function="sigmoid",
                            moe_router_enable_expert_bias=True, kv_channels=16, rotary_base=5e6,
                            untie_embeddings_and_output_weights=True),
         # OLMoE: q / k norms across heads under pre-norms, experts intermediate_size wide, top-k not renormalised
         "olmoe": dict(qk_layernorm=True, qk_layernorm_across_heads=True, pre_norm=True, num_experts=4,
                       moe_router_topk=2, moe_ffn_hidden_size=128, norm_topk_prob=False, norm_epsilon=1e-5,
                       untie_embeddings_and_output_weights=True),
         # FlexOlmo: OLMo 2's layers (post norms only) with OLMoE's experts
         "flex_olmo": dict(qk_layernorm=True, qk_layernorm_across_heads=True, pre_norm=False, post_norm=True,
                           num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128, norm_topk_prob=True,
                           rotary_base=5e5),
         # HunYuan: per-head q / k norms after RoPE, NTK alpha 1000 read as the default RoPE at theta x 1000^(16 / 14)
         "hunyuan_v1_dense": dict(qk_layernorm=True, qk_layernorm_after_rope=True, kv_channels=16,
                                  rotary_base=10000.0 * 1000.0 ** (16 / 14), norm_epsilon=1e-5,
                                  untie_embeddings_and_output_weights=True),
         # HunYuan-MoE: that attention, every layer MoE with a shared expert as wide as the experts
         "hunyuan_v1_moe": dict(qk_layernorm_after_rope=True, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128,
                                moe_shared_expert_intermediate_size=128, norm_topk_prob=True),
         # ERNIE 4.5 MoE: ERNIE's attention, a dense first layer, softmax routing with the expert bias, a shared expert
         "ernie4_5_moe": dict(rotary_interleaved=True, untie_embeddings_and_output_weights=False, kv_channels=16,
                              num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=[0, 1],
                              moe_router_score_function="softmax", moe_router_enable_expert_bias=True,
                              norm_topk_prob=True, moe_shared_expert_intermediate_size=32),
         # Apertus: per-head q / k norms, llama3 rope, an xIELU MLP without a gate
         "apertus": dict(swiglu=False, xielu=True, squared_relu=False, qk_layernorm=True, rope_scaling_type="llama3",
                         rope_scaling_factor=8.0, rotary_base=1.2e7, kv_channels=16,
                         untie_embeddings_and_output_weights=True),
         # Qwen3.5: Gated DeltaNet in the first of every two layers, output-gated attention with (1 + w) norms
         "qwen3_5_text": dict(linear_attention_layers=[1, 0], attention_output_gate=True, add_rmsnorm_offset=True,
                              qk_layernorm=True, rotary_percent=0.25, kv_channels=32, linear_num_key_heads=2,
                              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                              linear_conv_kernel_dim=4, rotary_base=1e7, untie_embeddings_and_output_weights=False),
         # Qwen3.5-MoE: the same layers, Qwen2-MoE's experts (always renormalised) and gated shared expert, untied
         "qwen3_5_moe_text": dict(linear_attention_layers=[1, 0], attention_output_gate=True, qk_layernorm=True,
                                  rotary_percent=0.25, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                                  norm_topk_prob=True, moe_shared_expert_intermediate_size=48, shared_expert_gate=True,
                                  untie_embeddings_and_output_weights=True),
         # Qwen3-Next: Qwen3.5-MoE's layers from its own names (in_proj_qkvz / in_proj_ba), a dense MLP width of its own
         "qwen3_next": dict(linear_attention_layers=[1, 0], attention_output_gate=True, qk_layernorm=True,
                            add_rmsnorm_offset=True, rotary_percent=0.25, num_experts=4, moe_router_topk=2,
                            moe_ffn_hidden_size=32, norm_topk_prob=True, moe_shared_expert_intermediate_size=48,
                            shared_expert_gate=True, linear_num_key_heads=2, untie_embeddings_and_output_weights=True),
         "arcee": dict(swiglu=False, squared_relu=True, rope_scaling_type="yarn", rope_scaling_factor=4.0,
                       untie_embeddings_and_output_weights=True),
         "seed_oss": dict(add_qkv_bias=True, kv_channels=32, untie_embeddings_and_output_weights=True,
                          attention_dropout=0.0, hidden_dropout=0.0),
         # Nemotron-H: one block per layer (Mamba-2, MLP, attention without RoPE, MLP: 4 layers), relu(up)^2, untied
         "nemotron_h": dict(hybrid_override_pattern="M-*-", mamba_layers=[1, 0, 0, 0], no_rope_freq=[1, 1, 1, 1],
                            mamba_num_heads=4, mamba_head_dim=32, mamba_num_groups=2, mamba_state_dim=16, swiglu=False,
                            squared_relu=True, kv_channels=16, untie_embeddings_and_output_weights=True),
         # Falcon-H1: attention (head_dim 32) and Mamba-2 (4 heads of 24, two groups, its gated norm) in every layer, its
         # multipliers, RoPE theta 1e11, untied
         "falcon_h1": dict(parallel_hybrid=True, mamba_num_heads=4, mamba_head_dim=24, mamba_num_groups=2,
                           mamba_state_dim=16, mamba_chunk_size=16, mamba_norm=True,
                           mamba_in_multipliers=[0.35, 0.25, 0.4, 0.5, 0.3], embedding_multiplier_scale=2.0,
                           output_multiplier_scale=0.5, key_multiplier=0.8, attention_in_multiplier=1.1,
                           attention_out_multiplier=0.9, ssm_in_multiplier=1.25, ssm_out_multiplier=0.7,
                           mlp_gate_multiplier=0.9, mlp_down_multiplier=0.6, rotary_base=1e11, kv_channels=32,
                           untie_embeddings_and_output_weights=True),
         # LFM2: a short-convolution layer (kernel 3, no biases), then attention with per-head q / k norms; its MLP width
         # adjusted from config.json (2/3 of 180 rounded up to 128), RoPE theta 1e6, tied
         "lfm2": dict(short_conv_layers=[1, 0], short_conv_kernel=3, short_conv_bias=False, qk_layernorm=True,
                      rotary_base=1e6, norm_epsilon=1e-5, untie_embeddings_and_output_weights=False),
         # LFM2-MoE: LFM2's layers (conv, attention, twice), the first MLP dense (128 wide: no adjusting), then 4
         # experts of width 32 routed by sigmoid score + the expert bias, renormalised, x 1.5
         "lfm2_moe": dict(short_conv_layers=[1, 0, 1, 0], qk_layernorm=True, num_experts=4, moe_router_topk=2,
                          moe_ffn_hidden_size=32, moe_layer_freq=[0, 1, 1, 1], moe_router_score_function="sigmoid",
                          moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=1.5,
                          untie_embeddings_and_output_weights=False),
         # EXAONE 3.5: Llama's layout under its own names, llama3 rope scaling over 32 positions at theta 1e6, untied
         "exaone": dict(rotary_base=1e6, rope_scaling_type="llama3", rope_scaling_factor=4.0,
                        untie_embeddings_and_output_weights=True, norm_epsilon=1e-5),
         # EXAONE MoE: three sliding layers (window 12, RoPE) and a full one without, per-head q / k norms, the first
         # MLP dense, then 4 experts of 32 in 2 groups (1 chosen), sigmoid + expert bias, x 2.5, a shared expert
         "exaone_moe": dict(qk_layernorm=True, sliding_window=12, window_attn_skip_freq=[1, 1, 1, 0],
                            no_rope_freq=[0, 0, 0, 1], num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                            moe_layer_freq=[0, 1, 1, 1], moe_router_num_groups=2, moe_router_group_topk=1,
                            moe_router_topk_scaling_factor=2.5, moe_shared_expert_intermediate_size=32,
                            moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True),
         # Hy3: per-head q / k norms, head_dim 32, its own theta; the first MLP dense, then 4 experts of 32, sigmoid +
         # expert bias without groups, x 2.826, a shared expert
         "hy_v3": dict(qk_layernorm=True, kv_channels=32, rotary_base=11158840.0, num_experts=4, moe_router_topk=2,
                       moe_ffn_hidden_size=32, moe_layer_freq=[0, 1], moe_router_topk_scaling_factor=2.826,
                       moe_shared_expert_intermediate_size=32, moe_router_score_function="sigmoid",
                       moe_router_enable_expert_bias=True, untie_embeddings_and_output_weights=True),
         # AFMoE: a sliding layer (window 12, RoPE) and a full one without, sandwich norms, per-head q / k norms, the
         # output gate's own projection, embeddings x sqrt(hidden); the second MLP 4 experts of 32, x 2, a shared expert
         "afmoe": dict(qk_layernorm=True, kv_channels=32, post_norm=True, attention_output_gate=True,
                       attention_gate_proj=True, input_embeds_norm=True, sliding_window=12, window_attn_skip_freq=[1, 0],
                       no_rope_freq=[0, 1], num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                       moe_layer_freq=[0, 1], moe_router_topk_scaling_factor=2.0, moe_shared_expert_intermediate_size=32,
                       moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                       untie_embeddings_and_output_weights=True),
         # Sarvam MoE: GLM-4.5 under Ling's names (q / k / v fused), per-head q / k norms, head_dim 32, RoPE on whole
         # heads; the second MLP 4 experts of 32 in 2 groups (1 chosen), sigmoid + expert bias, x 2.5, a shared expert
         "sarvam_moe": dict(qk_layernorm=True, kv_channels=32, rotary_base=8000000.0, num_experts=4, moe_router_topk=2,
                            moe_ffn_hidden_size=32, moe_layer_freq=[0, 1], moe_router_num_groups=2,
                            moe_router_group_topk=1, moe_router_topk_scaling_factor=2.5,
                            moe_shared_expert_intermediate_size=32, moe_router_score_function="sigmoid",
                            moe_router_enable_expert_bias=True, untie_embeddings_and_output_weights=True),
         # Mellum2: Qwen3-MoE's layer, a sliding layer (window 12, theta 1e4; dense MLP) and a full one (theta 5e5; MoE)
         "mellum": dict(qk_layernorm=True, kv_channels=32, rotary_base=500000.0, rope_local_base_freq=10000.0,
                        sliding_window=12, window_attn_skip_freq=[1, 0], num_experts=4, moe_router_topk=2,
                        moe_ffn_hidden_size=32, moe_layer_freq=[0, 1], untie_embeddings_and_output_weights=True),
         # Gemma 4: the full layers' 2 key / value heads of 32 (their values the keys, proportional RoPE on a quarter of the
         # pairs), the sliding layer's 4 of 16 (window 12, theta 1e4), value norms, unscaled scores, each layer's scalar
         "gemma4_text": dict(kv_channels=32, sliding_kv_channels=16, sliding_num_query_groups=4, attention_k_eq_v=True,
                             value_norm=True, layer_scalar=True, softmax_scale=1.0, rope_scaling_type="proportional",
                             rope_proportion=0.25, window_attn_skip_freq=[1, 0], sliding_window=12,
                             output_logit_softcapping=5.0, rope_local_base_freq=10000.0, post_norm=True),
         # HyperCLOVA X: Granite's scalars (logits x 0.5, a multiplier), Peri-LN's norms on the attention / MLP outputs
         "hyperclovax": dict(embedding_multiplier_scale=2.0, residual_multiplier=0.5, output_multiplier_scale=0.5,
                             softmax_scale=0.2, post_norm=True, pre_norm=True),
         # IQuest-Coder: Llama with head_dim 32 (transformers' default 128 when config.json has none), untied
         "iquestcoder": dict(kv_channels=32, untie_embeddings_and_output_weights=True, qk_layernorm=False),
         # InternLM3: that under its own model_type, its dynamic NTK RoPE read as the default RoPE at its theta
         "internlm3": dict(kv_channels=32, untie_embeddings_and_output_weights=True, rotary_base=10000.0,
                           rope_scaling_type=None, max_position_embeddings=128),
         # Youtu-LLM: DeepSeek-V3's attention (ranks 24 / 16, 16 + 8 dimensions per head, values 16), dense, tied
         "youtu": dict(multi_latent_attention=True, qk_layernorm=True, q_lora_rank=24, kv_lora_rank=16, qk_head_dim=16,
                       qk_pos_emb_head_dim=8, v_head_dim=16, kv_channels=16, rotary_base=1.6e6,
                       untie_embeddings_and_output_weights=False, num_query_groups=4),
         # MiMo-7B: a Qwen2 (q / k / v biases, untied) under its own model_type, its multi-token-prediction layer unread
         "mimo": dict(add_qkv_bias=True, untie_embeddings_and_output_weights=True, rotary_base=640000.0),
         # nanochat: weightless RMSNorms (the embeddings' and per-head q / k ones too), RoPE by minus the angle, relu^2
         # without a gate, untied, logits soft-capped at 15
         "nanochat": dict(layernorm_affine=False, embedding_norm=True, rotary_negated=True, qk_layernorm=True,
                          swiglu=False, squared_relu=True, output_logit_softcapping=15.0,
                          untie_embeddings_and_output_weights=True, norm_epsilon=1e-6),
         # Ministral 3's image-text checkpoint: its text model, the length limit where Llama 4's query scaling starts
         "ministral3": dict(rope_scaling_type="yarn", rope_scaling_factor=4.0, max_position_embeddings=64,
                            untie_embeddings_and_output_weights=True, kv_channels=16)}


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    for arch in ARCHS:
        make_tiny_hf(arch, str(root / arch))
    return {arch: str(root / arch) for arch in ARCHS}


def _overrides(hf_dir, *extra):
    return [f"actor_rollout_ref.actor_rollout.load={hf_dir}", f"actor_rollout_ref.ref.load={hf_dir}", *extra]


def test_table_covers_every_builder_architecture():
    assert set(ARCHS) == set(HF_ARCHS) | {"sarvam_mla", "mimo", "dots1", "solar_open"}  # (read as deepseek_v3 / qwen2 / glm4_moe: SAME_AS)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_empty_model_yaml_takes_config_json(arch, hf_dirs, capsys):
    cfg = load_config("grpo_trainer_hf_any", _overrides(hf_dirs[arch]), config_dir=str(CONFIGS))
    for role in (cfg.actor, cfg.ref):
        a = role.arch
        assert role.arch_set == {}
        # config.json's 2 KV heads, not the schema default group_query_attention=false (MLA: one per head)
        # Qwen3.5-MoE and Solar Open have no dense width: their experts'; Granite 4.0's dense MLP is its shared_mlp (96 wide)
        ffn = 32 if arch in ("qwen3_5_moe_text", "solar_open") else 96 if arch == "granitemoehybrid" else 128
        layers = 4 if arch in ("nemotron_h", "lfm2_moe", "exaone_moe") else 2  # (its tiny model's four kinds of block; LFM2-MoE's four)
        assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads) == (layers, 64, ffn, 4)
        if not arch.startswith("deepseek") and arch not in ("glm4_moe_lite", "gpt_neox", "falcon", "sarvam_mla", "youtu"):
            assert a.group_query_attention is True and a.num_query_groups == 2  # (GPT-NeoX: multi-head; Falcon-7B: 1)
        assert a.padded_vocab_size == 120
        for key, value in ARCHS[arch].items():
            assert getattr(a, key) == value, key
    assert ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(hf_dirs[arch])]) == 0
    assert "dry_run: the config is valid" in capsys.readouterr().out


def test_no_model_yaml_at_all(hf_dirs):
    """Without any model file the roles name no model; config.json still supplies everything."""
    from mindspeed_rl.config import build_config, compose_yaml
    from mindspeed_rl.config.validate import validate

    raw = compose_yaml("grpo_trainer_hf_any", _overrides(hf_dirs["qwen3"]), config_dir=str(CONFIGS))
    del raw["model"], raw["actor_rollout_ref"]["actor_rollout"]["model"], raw["actor_rollout_ref"]["ref"]["model"]
    cfg = build_config(raw)
    validate(cfg)
    assert cfg.actor.model_name == "" and cfg.actor.arch.qk_layernorm and cfg.actor.arch.kv_channels == 32


def test_user_set_key_that_agrees_is_kept_and_recorded(hf_dirs):
    cfg = load_config("grpo_trainer_hf_any", _overrides(hf_dirs["qwen2"], "training.num_query_groups=2",
                                                        "actor_rollout_ref.actor_rollout.padded_vocab_size=128"),
                      config_dir=str(CONFIGS))
    assert cfg.actor.arch_set == {"num_query_groups": "training.num_query_groups",
                                  "padded_vocab_size": "actor_rollout_ref.actor_rollout.padded_vocab_size"}
    assert cfg.actor.arch.padded_vocab_size == 128 and cfg.ref.arch.padded_vocab_size == 120


@pytest.mark.parametrize("arch,override,message", [
    ("llama", "training.rotary_base=10000",
     r"training.rotary_base is 10000.0 but config.json in \S+ says 5000.0 \(rope_theta\); "
     r"fix `training.rotary_base` or drop it to take it from config.json."),
    ("qwen2", "actor_rollout_ref.actor_rollout.group_query_attention=false",
     r"actor_rollout_ref.actor_rollout.group_query_attention is False but config.json in \S+ says 2 "
     r"\(num_key_value_heads\)"),
    ("qwen3", "actor_rollout_ref.actor_rollout.num_layers=3", r"num_layers is 3 but config.json in \S+ says 2"),
    ("qwen3", "training.qk_layernorm=false", r"training.qk_layernorm is False but .* says True"),
    ("qwen2", "training.norm_epsilon=1e-5", r"norm_epsilon is 1e-05 but .* says 1e-06 \(rms_norm_eps\)"),
    ("llama", "training.num_query_groups=4", r"training.num_query_groups is 4 but .* says 2"),
    ("glm4_moe", "training.moe_layer_freq=1",
     r"training.moe_layer_freq is \[1, 1\] but config.json in \S+ says \[0, 1\] \(first_k_dense_replace\)"),
    ("arcee", "training.swiglu=true", r"training.swiglu is True but config.json in \S+ says False \(hidden_act\)"),
    ("minimax_m2", "training.qk_layernorm_across_heads=false",
     r"training.qk_layernorm_across_heads is False but config.json in \S+ says True \(model_type\)"),
    ("gpt_neox", "training.parallel_residual_mlp_norm=false",
     r"training.parallel_residual_mlp_norm is False but config.json in \S+ says True \(model_type / use_parallel_residual\)"),
    ("falcon", "training.num_query_groups=2",
     r"training.num_query_groups is 2 but config.json in \S+ says 1 \(num_kv_heads / multi_query\)"),
    ("phi", "training.norm_epsilon=1e-6", r"training.norm_epsilon is 1e-06 but .* says 1e-05 \(layer_norm_eps\)"),
    ("deepseek_v3", "training.qk_rope_head_dim=16",
     r"training.qk_rope_head_dim is 16 but config.json in \S+ says 8 \(qk_rope_head_dim\)"),
])
def test_wrong_user_set_key_fails_in_dry_run(arch, override, message, hf_dirs, capsys):
    code = ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(hf_dirs[arch], override)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    import re
    assert re.search(message, err), err


def test_weights_that_do_not_fit_config_json_fail_in_dry_run(hf_dirs, tmp_path, capsys):
    """config.json edited to 1 KV head: the k_proj header says [32, 64], the architecture [16, 64]."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(hf_dirs["llama"], bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(config, num_key_value_heads=1)))
    code = ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(str(bad))])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert ("tensor model.layers.0.self_attn.k_proj.weight in" in err and "has shape [32, 64], but the "
            "architecture implies [16, 64] (num_query_groups 1 x kv_channels 16, hidden_size 64)" in err), err
    (bad / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=1)))
    code = ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(str(bad))])
    err = capsys.readouterr().err
    assert code == 2 and "holds 2 layers but the architecture has num_layers 1" in err, err


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A Mistral with a 24-token sliding window (max_position_embeddings 128)."""
    out = tmp_path_factory.mktemp("mistral_window")
    make_tiny_hf("mistral", str(out), sliding_window=24)
    return str(out)


def test_mistral_sliding_window_is_a_key_and_caps_the_length_only_on_npu(windowed, capsys):
    """The window is the arch's sliding_window (exact at every length on CPU / CUDA), not a length
    cap; on NPU (MindSpeed's fused attention, full causal) 16 prompt + 16 response tokens do not fit
    the 24-token window: validation says so, naming the window."""
    cfg = load_config("grpo_trainer_hf_any", _overrides(windowed), config_dir=str(CONFIGS))
    assert (cfg.actor.arch.max_position_embeddings, cfg.actor.arch.sliding_window) == (128, 24)
    assert ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(windowed, "training.max_position_embeddings=64")]) == 0
    capsys.readouterr()
    code = ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(windowed, "training.platform=npu")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert ("max_prompt_length: 16` + max_new_tokens 16 exceeds the sliding_window 24 of model from_checkpoint: on "
            "NPU attention runs in MindSpeed's fused kernel, full causal, which equals the model's sliding-window "
            "attention only within the window; shorten one.") in err, err


def test_longrope_caps_the_length_limit_at_the_original_length(tmp_path, capsys):
    """A Phi-3.5-style LongRoPE config (original length 24 here): 16 + 16 tokens do not fit, and
    the sentence says why."""
    make_tiny_hf("phi3", str(tmp_path), rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "long_factor": [2.0] * 8, "short_factor": [1.5] * 8},
        original_max_position_embeddings=24)
    cfg = load_config("grpo_trainer_hf_any", _overrides(str(tmp_path), "actor_rollout_ref.actor_rollout.max_new_tokens=8"),
                      config_dir=str(CONFIGS))
    assert (cfg.actor.arch.max_position_embeddings, cfg.actor.arch.rope_scaling_type) == (24, "longrope")
    assert cfg.actor.arch.rope_short_factor == [1.5] * 8 and cfg.actor.arch.rope_attention_factor > 1.0
    code = ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(str(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and ("exceeds max_position_embeddings 24 of model from_checkpoint (config.json's "
                          "original_max_position_embeddings: LongRoPE is computed with its short factors, which "
                          "hold up to that length); shorten one.") in err, err


def test_ministral3_caps_the_length_limit_where_its_query_scaling_starts(tmp_path, capsys):
    """Ministral 3 (image-text; YaRN over 64 positions here, Llama 4's query scaling past them): a
    prompt + response longer than 64 is refused in dry_run with the reason."""
    make_tiny_hf("ministral3", str(tmp_path))
    code = ray_gpt.main(["--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any", "dry_run=true",
                         *_overrides(str(tmp_path), "actor_rollout_ref.actor_rollout.max_new_tokens=64")])
    err = capsys.readouterr().err
    assert code == 2 and ("exceeds max_position_embeddings 64 of model from_checkpoint (config.json's "
                          "rope_parameters.original_max_position_embeddings: Ministral 3's query scaling "
                          "(llama_4_scaling_beta) is 1 up to that length and is not computed past it); "
                          "shorten one.") in err, err
