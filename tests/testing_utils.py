"""Shared test helpers (imported as `from testing_utils import ...`; conftest.py holds only hooks
and fixtures, because several conftest.py files exist and `from conftest import` is ambiguous).

run_gloo runs a function on N gloo processes with a free port and a hard timeout (tests marked
`dist`); make_tiny_hf saves tiny random Hugging Face checkpoints (no downloads).
"""

import datetime
import json
import os
import tempfile

import torch

from mindspeed_rl.platform import get_platform


def free_port() -> int:
    """A rendezvous port for a gloo job, chosen as the product chooses them (worker_env.free_port)."""
    from mindspeed_rl.distributed.worker_env import free_port as product_free_port

    return product_free_port("127.0.0.1")


def _gloo_entry(rank, fn, world_size, port, out_dir, timeout_s, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    get_platform("cpu").patch()
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        torch.save(fn(rank, world_size, *args), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def run_gloo(fn, world_size, *args, timeout_s=120, name=None):
    """Run fn(rank, world_size, *args) on `world_size` spawned gloo processes; return the list of
    their return values. A child's exception fails the test with its traceback; a job still
    running after `timeout_s` is killed and raises TimeoutError naming it."""
    name = name or getattr(fn, "__name__", "gloo job")
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = torch.multiprocessing.start_processes(
            _gloo_entry, args=(fn, world_size, free_port(), out_dir, timeout_s, args),
            nprocs=world_size, join=False, start_method="spawn")
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
        try:
            while not ctx.join(timeout=1.0):
                if datetime.datetime.now() > deadline:
                    raise TimeoutError(f"{name} on {world_size} gloo processes did not finish in {timeout_s} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]


# ---- a training step's gradients at TP 2, against transformers' autograd (tests/dist/models)
def tp2_batch(vocab: int = 120):
    """(ids, mask, weights): two rows of 24 tokens, the first left-padded by 5; loss = sum(logits x weights)
    over the real positions."""
    torch.manual_seed(3)
    ids = torch.randint(0, vocab, (2, 24))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    return ids, mask, torch.randn(2, 24, vocab)


def hf_tp2_reference(hf, vocab: int = 120) -> torch.Tensor:
    """transformers' logits on tp2_batch, its gradients left in `hf`'s parameters (.grad)."""
    from mindspeed_rl.models.forward import position_ids_from_mask

    ids, mask, weights = tp2_batch(vocab)
    logits = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    (logits * weights * mask[..., None]).sum().backward()
    return logits.detach()


def tp2_grads_job(rank, world_size, hf_dir, vocab: int = 120, padded: int = 128):
    """run_gloo job on 2 ranks: the HF checkpoint built at TP 2 without and with SP, one forward-backward of
    tp2_batch's loss, and the gradients a training step steps with (megatron's DDP, then
    train_step.finalize_grads). {sp: (gathered logits (b, s, vocab), {name: main_grad}, TP rank)}."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.optimizer import wrap_ddp
    from mindspeed_rl.models.parallel import pad_for_sequence_parallel, parallel_config_kwargs
    from mindspeed_rl.models.train_step import finalize_grads

    args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=padded)
    ids, mask, weights = tp2_batch(vocab)
    out = {}
    for sp in (False, True):
        init_parallel_state(tp=2, pp=1, seed=1)
        model = build_gpt_model(args, config_overrides=parallel_config_kwargs(sequence_parallel=sp))
        load_hf_checkpoint(model, hf_dir, args)
        ddp = wrap_ddp(model, use_distributed_optimizer=False)
        model.train()
        pids, pmask = ids, mask
        if sp:
            pids, pmask = pad_for_sequence_parallel(ids, mask, 2)
        logits = model(pids, position_ids_from_mask(pmask), attention_mask_4d(pmask))  # (b, s, V/TP)
        logits = gather_from_tensor_model_parallel_region(logits)[:, :ids.shape[1], :vocab]
        loss = (logits * weights * mask[..., None]).sum()
        ddp.zero_grad_buffer()
        loss.backward()
        finalize_grads([ddp])  # DP (1 here), SP and q / k norm sums over TP, as a training step does
        grads = {n: p.main_grad.clone() for n, p in model.named_parameters()}
        out[sp] = (logits.detach(), grads, ps.get_tensor_model_parallel_rank())
    ps.destroy_model_parallel()
    return out


# ---- tiny random Hugging Face checkpoints (no downloads)
TINY_HF = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=120, max_position_embeddings=128)


def QWEN3_5_TEXT(tiny):  # noqa: N802 (a table as a function of TINY_HF's sizes)
    return dict({"head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                 "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "pad_token_id": None, "eos_token_id": 2,
                 "layer_types": ["linear_attention", "full_attention"] * (tiny["num_hidden_layers"] // 2),
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                     "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
                **tiny, tie_word_embeddings=True)


def QWEN3_5_VISION(tiny):  # noqa: N802 (Qwen3.5's image-text checkpoints: a tiny vision tower, image tokens on top)
    return dict(image_token_id=119, video_token_id=118, vision_start_token_id=117, vision_end_token_id=116,
                vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                   out_hidden_size=tiny["hidden_size"]))


def QWEN3_5_MOE_TEXT(tiny):  # noqa: N802
    text = {k: v for k, v in QWEN3_5_TEXT(tiny).items() if k != "intermediate_size"}
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}
    return dict(text, tie_word_embeddings=False, **{k: tiny.get(k, v) for k, v in moe.items()})  # overrides win


def QWEN3_NEXT(tiny):  # noqa: N802 (Qwen3-Next: Qwen3.5-MoE's text model, no M-RoPE, its own names)
    text = {k: v for k, v in QWEN3_5_MOE_TEXT(tiny).items() if k != "rope_parameters"}
    return dict({"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}, **text,
                intermediate_size=tiny["intermediate_size"], rope_parameters={
                    "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})


# Granite's four scalars in the tiny models (not 1, so that each is tested)
GRANITE_SCALARS = {"embedding_multiplier": 2.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2,
                   "logits_scaling": 0.5}


def with_extended(ci, extended) -> list:
    """The parameters of a test: `ci`'s as they are, `extended`'s marked extended (run with --extended only)."""
    import pytest

    return [*ci, *(pytest.param(e, marks=pytest.mark.extended) for e in extended)]


# config.json variants (make_tiny_hf overrides) of the parity tests: arch-variant -> overrides

HF_VARIANTS = {
    # Gemma 4 without attention_k_eq_v (its full layers: v_proj, the sliding layers' 4 key / value heads, 32 wide),
    # proportional RoPE on half of the pairs at theta 1e5
    # Gemma 4 26B-A4B's layer: a dense MLP and 4 experts of 32 (top-2) side by side in every layer
    "gemma4_text-moe": {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32},
    # Gemma 4 E2B's layout: 4 layers (sliding, full, sliding, full), the last 2 reading the keys and values of the first
    # 2 (num_kv_shared_layers) with MLPs twice as wide; per-layer inputs of 8 per layer from a 120-row table
    "gemma4_text-ple": {"num_hidden_layers": 4, "attention_k_eq_v": False, "num_kv_shared_layers": 2,
                        "use_double_wide_mlp": True, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 120},
    "gemma4_text-kv": {"attention_k_eq_v": False, "rope_parameters": {
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
    # Granite 4.0 with experts: 4 of them (intermediate_size wide, top-2) beside its shared_mlp, every layer attention
    "granitemoehybrid-moe": {"num_local_experts": 4, "num_experts_per_tok": 2},
    # Granite 4.0-H: a Mamba-2 layer (4 heads of 32, one group of state 16, 16-token chunks) then an attention layer
    # without RoPE; -hmoe: with experts and two groups (Granite 4.0-H-Tiny / Small are MoE)
    "granitemoehybrid-h": {"layer_types": ["mamba", "attention"], "position_embedding_type": "nope",
                           "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 16,
                           "mamba_chunk_size": 16},
    "granitemoehybrid-hmoe": {"layer_types": ["mamba", "attention"], "position_embedding_type": "nope",
                              "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_n_groups": 2, "mamba_d_state": 16,
                              "mamba_chunk_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    # Nemotron 3 Nano's layout: the second layer an MoE one (4 experts of 32 without a gate, top-2 by sigmoid score +
    # expert bias within the best of 2 groups, renormalised, x 1.5; a shared expert 48 wide)
    "nemotron_h-moe": {"layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"], "n_routed_experts": 4,
                       "num_experts_per_tok": 2, "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 48,
                       "routed_scaling_factor": 1.5, "n_group": 2, "topk_group": 1},
    # Falcon-H1-0.5B's layout: no gated norm in the Mamba-2 mixer, one group of B / C, tied embedding
    "falcon_h1-nonorm": {"mamba_rms_norm": False, "mamba_n_groups": 1, "tie_word_embeddings": True},
    # LFM2's older config.json form (full_attn_idxs instead of layer_types), a multiplier on the MLP width (2/3 of
    # 180 x 1.5, rounded up to 192), untied
    "lfm2-idxs": {"layer_types": None, "full_attn_idxs": [1], "block_ffn_dim_multiplier": 1.5,
                  "tie_word_embeddings": False},
    "mistral-window": {"sliding_window": 12},  # Mistral 7B v0.1's every-layer window, scaled down
    "phi3-window": {"sliding_window": 12},  # Phi-3-mini-4k's
    "starcoder2-window": {"sliding_window": 12},  # StarCoder2's 4096 of 16384, scaled down
    "phi3-partial": {"partial_rotary_factor": 0.5},
    "nemotron-bias": {"attention_bias": True, "mlp_bias": True},
    "gpt_neox-seq": {"use_parallel_residual": False, "hidden_act": "gelu_fast"},  # rinna's Japanese GPT-NeoX layer
    # Falcon-40B / 180B: grouped key / value heads (2 here), ln_attn / ln_mlp; Falcon2-11B: grouped, one norm, untied,
    # its rope_theta; the sequential layer with per-head q / k / v and biases (no release; transformers runs it)
    "falcon-40b": {"new_decoder_architecture": True, "num_kv_heads": 2},
    "falcon-11b": {"new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 1,
                   "tie_word_embeddings": False, "rope_parameters": {"rope_type": "default", "rope_theta": 500042.0}},
    "falcon-seq": {"multi_query": False, "parallel_attn": False, "bias": True},
    "olmo-clip": {"clip_qkv": 0.5},  # OLMo-7B-0424 / 0724's clamp (8 there), scaled to the random weights  # Nemotron's biases on q / k / v / o and up / down
    # Qwen3-Next's other MoE layouts: its second layer a dense MLP (mlp_only_layers), the top-2 not renormalised
    "qwen3_next-mlponly": {"mlp_only_layers": [1], "norm_topk_prob": False},
    "qwen3_moe-mlponly": {"mlp_only_layers": [1]},  # Qwen3-MoE's dense layers: the same key
    # LongRoPE at its original length 32 (128 / 32: factor 4, attention factor sqrt(1 + ln 4 / ln 32))
    "phi3-longrope": dict(original_max_position_embeddings=32, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
        "long_factor": [2.0] * 8}),
    # Phi-4-mini's layout: longrope on the rotated half of each head (its attention factor scales only that half)
    "phi3-partiallongrope": dict(partial_rotary_factor=0.5, original_max_position_embeddings=32, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0] * 4}),
    # Qwen's long-context YaRN setting, scaled down
    "qwen2-yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 32}),
    # DeepSeek's mscale ratio, other betas, no truncation (gpt-oss)
    "qwen3-yarnmscale": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.7,
                                              "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2, "truncate": False,
                                              "original_max_position_embeddings": 32}),
    # SmolLM3's YaRN extension (its model card's): the attention factor only in the layers that rotate
    "smollm3-yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
                                          "original_max_position_embeddings": 32}),
    "mistral-linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.0}),
    # Moonlight's layout (DeepSeek-V3 with one full-rank query projection, plain RoPE)
    "deepseek_v3-moonlight": dict(q_lora_rank=None, rope_parameters={"rope_type": "default", "rope_theta": 5e4}),
}


def make_tiny_hf(arch, out_dir, seed=0, max_shard_size=None, config_only=False, **overrides):
    """Save a random fp32 llama / mistral / qwen2 / qwen3 / qwen3_moe CausalLM (GQA 4q/2kv heads, head_dim
    >= 16) to out_dir and return it in eval mode. llama: llama3 rope scaling, untied; mistral: rope
    theta 1e6, no sliding window unless overridden (sliding_window=N); qwen2: qkv bias, tied;
    qwen3: q/k norms, head_dim 32 != hidden/heads; qwen3_moe: as qwen3 with 4 experts of width 32,
    top-2, renormalised; qwen2_moe: qkv biases, 4 experts of width 32, top-2 not renormalised, and a
    gated shared expert of width 64; mixtral: 4 experts of width intermediate_size (128), top-2,
    renormalised, saved under Mixtral's names (block_sparse_moe, w1/w2/w3); phi3: tied, q/k/v and
    gate/up stored fused (qkv_proj, gate_up_proj), partial_rotary_factor when overridden; smollm3: tied,
    rope theta 5e5, every second layer without RoPE (no_rope_layer_interval 2); granite: tied, embeddings x 2,
    residuals x 0.5, scores x 0.2, logits / 0.5; gemma3_text (Gemma3ForCausalLM): tied, head_dim 16, scores
    scaled by 24^-1/2, sliding layers (window 12, theta 1e4) alternating with full ones (linear
    rope x 2, theta 1e5), sandwich (1 + w) norms, GeGLU; gemma3: that text model inside Gemma 3 4B+'s
    image-text model (Gemma3ForConditionalGeneration, a tiny vision tower); gemma2: Gemma 2 (even layers
    sliding, window 12, one theta), its soft caps lowered to 1 (scores) and 2 (logits); mistral3: a
    mistral inside Mistral Small 3.1's image-text model (Mistral3ForConditionalGeneration); gemma: Gemma 1
    (tied, head_dim 16, the (1 + w) norms, embedding scale and GeGLU); olmo2: OLMo 2 (norms after attention
    and MLP only, q / k norms across heads, untied); olmo3: OLMo 3 (OLMo 2 with sliding layers, window 12,
    alternating with full ones that rotate with YaRN x 4 over 32 positions and its attention factor 1.2,
    the sliding ones with the default rope at the same theta); exaone4: EXAONE 4.0 (OLMo 2's post norms, per-head
    q / k norms, a sliding layer with RoPE (window 12) and a full one without, llama3 rope x 4); seed_oss: Seed-OSS
    (q / k / v biases by default, head_dim 32, dropout 0.1 in config.json); glm4: GLM-4-0414 (transformers'
    defaults: q / k / v biases, RoPE on interleaved pairs of half of each head; sandwich norms, gate_up_proj);
    ernie4_5: ERNIE 4.5 (RoPE on interleaved pairs of the whole head, tied); arcee: Arcee AFM (an MLP without a gate,
    relu(up)^2, YaRN x 4 over 32 positions); glm4_moe: GLM-4.5 (first layer dense, the others MoE with sigmoid
    routing and a random expert bias, expert groups, a routed scale and a shared expert; q / k / v biases, q / k
    norms, partial rotary 0.5); qwen2_5_vl / qwen3_vl: a qwen2 (untied) / qwen3
    (tied) inside Qwen2.5-VL's / Qwen3-VL's image-text model (tiny vision towers, M-RoPE sections);
    ministral3: Ministral 3's image-text model (mistral3 around a ministral3 text model: YaRN x 4 over 64
    positions, Llama 4's query scaling past them); deepseek_v3: DeepSeek-V3 (multi-latent attention with YaRN x 4 over
    32 positions and two different mscales, GLM-4.5's MoE layout); deepseek_v2: DeepSeek-V2-Lite (MLA without a query
    rank, softmax routing not renormalised, weights x 2); minimax_m2: MiniMax-M2 (q / k norms across heads, RoPE on half of
    each head (rotary_dim), sigmoid routing with a random expert bias over 4 experts, Mixtral's names); glm4_moe_lite:
    GLM-4.7-Flash (DeepSeek-V3's attention and MoE, its dense first layer in mlp_layer_types); ernie4_5_moe: ERNIE 4.5
    MoE (ERNIE's attention; the first layer dense, then softmax routing with a random expert bias, a shared expert);
    apertus: Apertus (per-head q / k norms, llama3 rope x 8 over 32 positions, an xIELU MLP without a gate, its scalars
    random); olmoe: OLMoE (q / k norms across heads under pre-norms, 4 experts intermediate_size wide, top-2 not
    renormalised); flex_olmo: FlexOlmo (OLMo 2's post norms with OLMoE's experts); hunyuan_v1_dense: HunYuan (per-head
    q / k norms after RoPE, NTK alpha 1000); hunyuan_v1_moe: HunYuan-MoE (that attention, 4 experts and a shared MLP
    without a gate); granitemoe / granitemoeshared / granitemoehybrid: Granite's MoE models and Granite 4.0's dense
    one (GRANITE_SCALARS; see their entries); glm: GLM-4 (glm4's layers without its post norms); helium: Helium-1 (ERNIE 4.5's interleaved RoPE); stablelm: StableLM 2 1.6B (LayerNorms with biases); starcoder2: StarCoder2 (LayerNorms, biases everywhere, a tanh-GELU
    MLP without a gate); nemotron: Nemotron (LayerNorm1P, RoPE on half of each head, relu(x)^2 without a gate); cohere: Command R
    (a parallel-residual layer, weight-only LayerNorms, interleaved RoPE, logits x 0.25); cohere2: Command R7B (that
    layer, a 12-position window with RoPE in the odd layers, the even ones full without RoPE); phi: Phi-2 (that layer
    with LayerNorm biases, biases everywhere and on lm_head, a tanh-GELU MLP without a gate, RoPE on 0.4 of each head); gpt_neox: Pythia (multi-head attention, the MLP on its own norm
    of the layer input beside attention, biases everywhere, RoPE on a quarter of each head, exact GELU; the HF_VARIANTS
    gpt_neox-seq: megatron's usual layer, gelu_fast); falcon: Falcon-7B (multi-query, one norm beside attention and MLP,
    no biases, tied; HF_VARIANTS falcon-40b, falcon-11b, falcon-seq); olmo: OLMo 1 (LayerNorms without weights; olmo-clip:
    q / k / v clamped); nemotron_h: Nemotron-H (four layers of one block each: Mamba-2, MLP, attention, MLP; the
    HF_VARIANTS nemotron_h-moe: its second layer MoE); nanochat: nanochat (weightless RMSNorms, the embeddings' too, RoPE
    by minus the angle, relu(x)^2 without a gate, logits soft-capped at 15); vaultgemma: VaultGemma (gemma2's layer
    without its post norms). `overrides` change TINY_HF
    (num_hidden_layers=4). `config_only`: return the config.json it would save (as a dict), building nothing."""
    import transformers as tf

    tiny = dict(TINY_HF, **overrides)

    def gemma3_text():
        return tf.Gemma3TextConfig(**{
            "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 12,
            "layer_types": ["sliding_attention", "full_attention"] * (tiny["num_hidden_layers"] // 2),
            "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, **tiny})

    def gemma4_text(**changes):  # Gemma 4's dense layout (its entry below), with changes
        return tf.Gemma4TextConfig(**{
            "head_dim": 16, "global_head_dim": 32, "num_global_key_value_heads": 2, "attention_k_eq_v": True,
            "hidden_size_per_layer_input": 0, "sliding_window": 12, "final_logit_softcapping": 5.0,
            "layer_types": ["sliding_attention", "full_attention"] * (tiny["num_hidden_layers"] // 2),
            "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, **tiny, "num_key_value_heads": 4, **changes})

    def deepseek_v3(**changes):  # DeepSeek-V3's layout (its entry below), with changes (Sarvam-105B's)
        return tf.DeepseekV3Config(**{
            "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5,
            "pad_token_id": None, "eos_token_id": 2,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1,
                                "mscale": 1.0, "mscale_all_dim": 0.8},
            **tiny, "num_key_value_heads": tiny["num_attention_heads"], **changes})

    config = {
        "llama": lambda: tf.LlamaConfig(**tiny, rope_theta=5000.0, rope_scaling={
            "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}),
        "mistral": lambda: tf.MistralConfig(**{"sliding_window": None, "rope_theta": 1e6, **tiny}),
        "qwen2": lambda: tf.Qwen2Config(**tiny, tie_word_embeddings=True),
        "qwen3": lambda: tf.Qwen3Config(**tiny, head_dim=32),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**tiny, head_dim=32, moe_intermediate_size=32, num_experts=4,
                                               num_experts_per_tok=2, norm_topk_prob=True),
        "qwen2_moe": lambda: tf.Qwen2MoeConfig(**tiny, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                               norm_topk_prob=False, shared_expert_intermediate_size=64),
        "phi3": lambda: tf.Phi3Config(**{"sliding_window": None, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                                         **tiny}, tie_word_embeddings=True),
        "mixtral": lambda: tf.MixtralConfig(**{"sliding_window": None, **tiny}, num_local_experts=4,
                                            num_experts_per_tok=2),
        "granite": lambda: tf.GraniteConfig(**{"embedding_multiplier": 2.0, "residual_multiplier": 0.5,
                                               "attention_multiplier": 0.2, "logits_scaling": 0.5,
                                               "tie_word_embeddings": True, **tiny}),
        "smollm3": lambda: tf.SmolLM3Config(**{"no_rope_layer_interval": 2, "rope_theta": 5e5, "pad_token_id": 0,
                                               "bos_token_id": 1, "eos_token_id": 2, **tiny}),
        "gemma3_text": gemma3_text,
        "gemma": lambda: tf.GemmaConfig(**{"head_dim": 16, **tiny}),
        "olmo2": lambda: tf.Olmo2Config(**{"rope_theta": 5e5, "pad_token_id": 0, **tiny}),
        # OLMoE's layout scaled down: q / k norms across all heads (GQA: k_norm over 2 heads) under pre-norms, 4
        # experts intermediate_size (128) wide, top-2 softmax routing not renormalised, Qwen-MoE's names
        "olmoe": lambda: tf.OlmoeConfig(**{"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": False,
                                           "pad_token_id": None, "eos_token_id": 2, **tiny}),
        # FlexOlmo's: OLMo 2's layers (post norms only) with OLMoE's experts, here renormalised
        "flex_olmo": lambda: tf.FlexOlmoConfig(**{"num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
                                                  "rope_theta": 5e5, "pad_token_id": None, "eos_token_id": 2, **tiny}),
        # HunYuan's layout: per-head q / k norms after RoPE, its NTK alpha RoPE (labelled dynamic, fixed: theta x
        # alpha^(d / (d - 2))) as the releases write it (alpha 1000 and an unused factor 1), untied
        "hunyuan_v1_dense": lambda: tf.HunYuanDenseV1Config(**{
            "head_dim": 16, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0},
            **tiny}),
        # HunYuan-MoE's: that attention with 4 experts and one shared MLP, all intermediate_size (128) wide, top-2
        # renormalised, the router as gate.wg
        "hunyuan_v1_moe": lambda: tf.HunYuanMoEV1Config(**{
            "head_dim": 16, "num_experts": 4, "moe_topk": 2, "pad_token_id": None, "bos_token_id": 1,
            "eos_token_id": 2, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0},
            **tiny}),
        # Granite 3.x MoE's layout: Granite's four scalars, 4 experts intermediate_size (128) wide, top-2 (softmax over
        # the top-k logits), stacked as block_sparse_moe.input_linear / output_linear, the router as router.layer; tied
        "granitemoe": lambda: tf.GraniteMoeConfig(**{**GRANITE_SCALARS, "num_local_experts": 4, "num_experts_per_tok": 2,
                                                     "tie_word_embeddings": True, **tiny}),
        # with a shared MLP (no gate) 48 wide beside the experts, its gate / up fused as shared_mlp.input_linear
        "granitemoeshared": lambda: tf.GraniteMoeSharedConfig(**{
            **GRANITE_SCALARS, "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 48,
            "tie_word_embeddings": True, **tiny}),
        # Granite 4.0's dense layout (350M / 1B / Micro): every layer attention, the MLP its shared_mlp (96 wide;
        # intermediate_size unused), RoPE; the HF_VARIANTS granitemoehybrid-moe adds experts
        "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(**{
            **GRANITE_SCALARS, "num_local_experts": 0, "shared_intermediate_size": 96, "position_embedding_type": "rope",
            "layer_types": ["attention"] * tiny["num_hidden_layers"], "rope_parameters": {"rope_type": "default",
                                                                                         "rope_theta": 1e7},
            "tie_word_embeddings": True, **tiny}),
        # Nemotron-H's layout: one block per layer, Mamba-2 (4 heads of 32, two groups of state 16, 16-token chunks),
        # an MLP without a gate (relu2), attention without RoPE (head_dim 16), another MLP; untied
        # Falcon-H1's layout: attention (head_dim 32, not hidden / heads) and Mamba-2 (4 heads of 24: mamba_d_ssm 96,
        # not mamba_expand x hidden; two groups of state 16, the gated norm, 16-token chunks) side by side in every
        # layer, every muP multiplier other than 1 and each its own, RoPE theta 1e11 as the releases', untied
        "falcon_h1": lambda: tf.FalconH1Config(**{
            "head_dim": 32, "mamba_d_ssm": 96, "mamba_n_heads": 4, "mamba_d_head": 24, "mamba_n_groups": 2,
            "mamba_d_state": 16, "mamba_chunk_size": 16, "mamba_rms_norm": True, "mamba_norm_before_gate": False,
            "rope_theta": 1e11, "embedding_multiplier": 2.0, "lm_head_multiplier": 0.5, "key_multiplier": 0.8,
            "attention_in_multiplier": 1.1, "attention_out_multiplier": 0.9, "ssm_in_multiplier": 1.25,
            "ssm_out_multiplier": 0.7, "ssm_multipliers": [0.35, 0.25, 0.4, 0.5, 0.3], "mlp_multipliers": [0.9, 0.6],
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # LFM2's layout: conv layers (kernel 3) and attention ones with per-head q / k norms alternating, the MLP
        # width adjusted as its releases' (2/3 of 180, rounded up to a multiple of 32: 128), rope theta 1e6, tied
        "lfm2": lambda: tf.Lfm2Config(**{
            "layer_types": ["conv", "full_attention"] * (tiny["num_hidden_layers"] // 2), "block_multiple_of": 32,
            "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0, "conv_L_cache": 3,
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny, "intermediate_size": 180}),
        # LFM2-MoE's layout: a conv layer with a dense MLP (intermediate_size wide, no adjusting), then attention, conv
        # and attention layers with 4 experts of width 32, top-2 by sigmoid score + a random expert bias, renormalised,
        # x 1.5
        "lfm2_moe": lambda: tf.Lfm2MoeConfig(**{
            "layer_types": ["conv", "full_attention"] * 2, "num_dense_layers": 1, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "routed_scaling_factor": 1.5, "use_expert_bias": True,
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny, "num_hidden_layers": 4}),
        # EXAONE 3.5's layout (Llama under its own names: transformer.h.*, attn.attention.*, c_fc_0 / c_fc_1 / c_proj),
        # llama3 rope scaling x 4 over 32 positions at theta 1e6, untied
        "exaone": lambda: getattr(tf, "ExaoneConfig", tf.LlamaConfig)(**{  # (the vLLM venv's transformers has none)
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6, "factor": 4.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # EXAONE MoE's layout (K-EXAONE): three sliding layers (window 12, RoPE) and a full one without RoPE, per-head
        # q / k norms under pre-norms; the first MLP dense, then 4 experts of 32 in 2 groups (1 chosen), top-2 by sigmoid
        # score + a random expert bias, x 2.5, and a shared expert
        "exaone_moe": lambda: tf.ExaoneMoeConfig(**{
            "sliding_window": 12, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
            "first_k_dense_replace": 1, "num_shared_experts": 1, "routed_scaling_factor": 2.5,
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny, "num_hidden_layers": 4}),
        # Hy3's layout (Hy3-preview): per-head q / k norms, head_dim 32; the first MLP dense, then 4 experts of 32, top-2
        # by sigmoid score + a random expert bias, renormalised, x 2.826, beside a shared expert; with the keys the
        # releases also carry for vLLM (first_k_dense_replace, expert_hidden_dim, qk_norm, route_norm)
        "hy_v3": lambda: tf.HYV3Config(**{
            "head_dim": 32, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
            "num_shared_experts": 1, "router_scaling_factor": 2.826, "first_k_dense_replace": 1, "expert_hidden_dim": 32,
            "qk_norm": True, "route_norm": True, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # AFMoE's layout (Trinity): a sliding layer (window 12, RoPE; dense MLP) and a full one without RoPE (4 experts of
        # 32, top-2 by sigmoid score + a random expert bias, renormalised, x 2, beside a shared expert); sandwich norms,
        # per-head q / k norms, the attention output gated by its own projection, embeddings x sqrt(hidden) (mup)
        "afmoe": lambda: tf.AfmoeConfig(**{
            "head_dim": 32, "sliding_window": 12, "global_attn_every_n_layers": 2, "num_dense_layers": 1,
            "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1,
            "route_scale": 2.0, "mup_enabled": True, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # Sarvam MoE's layout (Sarvam-30B): GLM-4.5's model under Ling's names, per-head q / k norms, RoPE on whole
        # heads, head_dim 32; the first MLP dense, then 4 experts of 32 in 2 groups (1 chosen), top-2 by sigmoid score + a
        # random expert bias, x 2.5, and a shared expert (the vLLM venv's transformers has no SarvamMoEConfig: a GLM-4.5
        # saved and renamed as the release stores it, _as_sarvam_release)
        "sarvam_moe": lambda: getattr(tf, "SarvamMoEConfig", tf.Glm4MoeConfig)(**{
            "head_dim": 32, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2,
            "topk_group": 1, "n_shared_experts": 1, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
            "use_qk_norm": True, "partial_rotary_factor": 1.0, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1,
            **tiny}),
        # Mellum2's layout: Qwen3-MoE's layer, a sliding layer (window 12, its own theta 1e4; dense MLP) and a full one
        # (theta 5e5; 4 experts of 32, top-2 renormalised), head_dim 32
        # Gemma 4's dense layout (31B): sliding layers (window 12, theta 1e4, 4 key / value heads of 16) and full ones
        # (2 key / value heads of 32, the values their keys: no v_proj; proportional RoPE on a quarter of the pairs at
        # theta 1e6), weight-scaled norms before and after attention and MLP, q / k / v norms, unscaled scores, a
        # layer_scalar per layer, GeGLU, logits soft-capped at 5
        "gemma4_text": gemma4_text,
        "mellum": lambda: tf.MellumConfig(**{
            "head_dim": 32, "sliding_window": 12, "layer_types": ["sliding_attention", "full_attention"],
            "mlp_layer_types": ["dense", "sparse"], "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # HyperCLOVA X SEED Think's layout: Granite's four scalars (logits x 0.5: a multiplier here), Peri-LN's norms on
        # the attention and MLP outputs, untied
        "hyperclovax": lambda: tf.HyperCLOVAXConfig(**{
            "embedding_multiplier": 2.0, "residual_multiplier": 0.5, "logits_scaling": 0.5, "attention_multiplier": 0.2,
            "use_post_norm": True, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # IQuest-Coder's layout: Llama with head_dim 32 (not hidden / heads), untied
        "iquestcoder": lambda: getattr(tf, "IQuestCoderConfig", tf.LlamaConfig)(**{"head_dim": 32, "pad_token_id": 0, "eos_token_id": 2,
                                                       "bos_token_id": 1, **tiny}),
        # InternLM3's layout: Llama with head_dim 32 under its own model_type, its dynamic NTK RoPE (factor 6: the
        # default RoPE within max_position_embeddings), untied; saved with the release's architecture name
        "internlm3": lambda: getattr(tf, "InternLM3Config", tf.LlamaConfig)(**{
            "head_dim": 32, "rope_parameters": {"rope_type": "dynamic", "factor": 6.0, "rope_theta": 10000.0},
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # Youtu-LLM's layout scaled down: DeepSeek-V3's multi-latent attention (query rank 24, key / value rank 16, 16 + 8
        # RoPE dimensions per head over interleaved pairs, values 16) with a dense SwiGLU MLP in every layer, tied
        "youtu": lambda: getattr(tf, "YoutuConfig")(**{
            "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1.6e6}, "pad_token_id": None, "eos_token_id": 2,
            "bos_token_id": 1, **tiny, "num_key_value_heads": tiny["num_attention_heads"]}),
        "nemotron_h": lambda: tf.NemotronHConfig(**{
            "layers_block_type": ["linear_attention", "mlp", "full_attention", "mlp"], "mamba_num_heads": 4, "mamba_head_dim": 32,
            "n_groups": 2, "ssm_state_size": 16, "chunk_size": 16, "head_dim": 16,
            "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1,
            **{k: v for k, v in tiny.items() if k not in ("num_hidden_layers", "rms_norm_eps")}}),
        # GLM-4-0414: q / k / v biases, sandwich norms, gate_up_proj, RoPE on interleaved pairs of half of each head
        "glm4": lambda: tf.Glm4Config(**{"head_dim": 16, "pad_token_id": 0, "eos_token_id": 2, **tiny}),
        # GLM-4 (glm-4-9b-hf): GLM-4-0414's layers without the norms after attention and MLP
        "glm": lambda: tf.GlmConfig(**{"head_dim": 16, "pad_token_id": 0, "eos_token_id": 2, **tiny}),
        # StableLM 2 1.6B's layout: LayerNorms with biases, q / k / v biases, RoPE on a quarter of each head
        "stablelm": lambda: tf.StableLmConfig(**{"use_qkv_bias": True, "pad_token_id": 0, "eos_token_id": 2,
                                                 "bos_token_id": 1, **tiny}),
        # StarCoder2's layout: LayerNorms, biases on every linear layer, gelu_tanh(c_fc) without a gate, no window
        # unless overridden (sliding_window=N), its dropouts (0.1 in the releases) in config.json
        "starcoder2": lambda: tf.Starcoder2Config(**{"sliding_window": None, "attention_dropout": 0.1,
                                                     "residual_dropout": 0.1, "embedding_dropout": 0.1,
                                                     "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
                                                     **tiny}),
        # Nemotron-Mini's layout: LayerNorm1P (1 + w, with its bias), RoPE on half of each head, relu(up)^2, no biases
        # unless overridden (attention_bias=True, mlp_bias=True)
        "nemotron": lambda: tf.NemotronConfig(**{"pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1,
                                                 **tiny}),
        # Jais 2's: LayerNorms with biases, Llama's attention and an MLP without a gate, relu(up(x))^2, biases on every
        # linear layer (transformers' defaults), untied
        "jais2": lambda: tf.Jais2Config(**{"pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, **tiny}),
        # Command R's layout: x + attn(ln x) + mlp(ln x), weight-only LayerNorms, RoPE on interleaved pairs, tied,
        # the logits scaled (0.0625 in the releases)
        "cohere": lambda: tf.CohereConfig(**{"logit_scale": 0.25, "pad_token_id": 0, "eos_token_id": 2,
                                             "bos_token_id": 1, **tiny}),
        # Command R7B's: that layer, sliding layers with RoPE and full ones without (every second layer full here,
        # every fourth in the releases)
        "cohere2": lambda: tf.Cohere2Config(**{"logit_scale": 0.25, "sliding_window": 12, "pad_token_id": 0,
                                               "eos_token_id": 2, "bos_token_id": 1,
                                               "sliding_window_pattern": 2, **tiny}),
        # Phi-2's layout: Cohere's parallel layer with LayerNorm biases, biases everywhere and on lm_head, RoPE on 0.4
        # of each head (its 32 of 80; 6 of 16 here), gelu_new, its dropouts (0.1 in phi-2's residuals) in config.json
        "phi": lambda: tf.PhiConfig(**{"partial_rotary_factor": 0.4, "resid_pdrop": 0.1, "pad_token_id": None,
                                       "bos_token_id": 1, "eos_token_id": 2, **tiny}),
        # Pythia's layout: multi-head attention (4 heads here), x + attn(ln1 x) + mlp(ln2 x), biases everywhere, q / k / v
        # per head in query_key_value, RoPE on a quarter of each head (4 of 16), exact gelu, untied embed_out; its 4.x
        # RoPE keys (rotary_pct, rotary_emb_base) as transformers 5 writes them (rope_parameters)
        "gpt_neox": lambda: tf.GPTNeoXConfig(**{"rotary_pct": 0.25, "rotary_emb_base": 10000, "hidden_dropout": 0.1,
                                                "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
                                                **{k: v for k, v in tiny.items() if k != "num_key_value_heads"}}),
        # Falcon-7B's layout: multi-query attention (one key / value head) stored fused, one LayerNorm before attention and
        # MLP beside each other, an MLP without a gate (exact gelu), no biases, tied; the HF_VARIANTS falcon-40b (two
        # key / value heads per group, ln_attn / ln_mlp), falcon-11b (grouped, one norm, untied, its rope_theta) and
        # falcon-seq (per-head q / k / v, the sequential layer, biases)
        "falcon": lambda: tf.FalconConfig(**{"multi_query": True, "parallel_attn": True, "bias": False,
                                             "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
                                             "ffn_hidden_size": tiny["intermediate_size"],
                                             **{k: v for k, v in tiny.items() if k != "num_key_value_heads"}}),
        # nanochat: Llama's layout with weightless RMSNorms (layers, final, per-head q / k, the embeddings), RoPE by minus
        # the angle, fc2(relu(fc1 x)^2), untied, logits soft-capped at 15 (transformers' default)
        "nanochat": lambda: tf.NanoChatConfig(**{"pad_token_id": 1, "eos_token_id": 2, "bos_token_id": 0, **tiny}),
        # OLMo 1: Llama's layout with LayerNorms without weight or bias; the HF_VARIANTS olmo-clip clamps q / k / v at 0.5
        # (the 0424 / 0724 releases at 8, scaled to these random weights: it clamps about half of them)
        "olmo": lambda: tf.OlmoConfig(**{"pad_token_id": 1, "eos_token_id": 2, "bos_token_id": None, **tiny}),
        # Helium-1: Llama with RoPE on interleaved pairs of the whole head (ERNIE 4.5's), eps 1e-8
        "helium": lambda: tf.HeliumConfig(**{"head_dim": 16, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1,
                                             **tiny}),
        # GLM-4.5's layout scaled down: the first layer dense, then MoE layers with sigmoid routing, a per-expert
        # bias, 2 groups of 2 experts (1 eligible), weights x 1.5, one shared expert; q / k / v biases, q / k
        # norms, RoPE on half of each head (Llama's pairs)
        "glm4_moe": lambda: tf.Glm4MoeConfig(**{
            "head_dim": 16, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
            "routed_scaling_factor": 1.5, "use_qk_norm": True, "attention_bias": True, "pad_token_id": None,
            "eos_token_id": 2, **tiny}),
        # dots.llm1's layout scaled down (dots1): Qwen3's attention with GLM-4.5's MoE layout (dense first layer, sigmoid
        # routing with a random expert bias, 2 groups of 2 experts, weights x 1.5, one shared expert, renormalised top-k)
        "dots1": lambda: tf.Dots1Config(**{
            "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5,
            "norm_topk_prob": True, "pad_token_id": None, "eos_token_id": 2, **tiny}),
        # Solar Open's layout scaled down (solar_open): Llama's attention (head_dim 16) with GLM-4.5's MoE in every layer
        # (sigmoid routing with a random expert bias over 4 experts in 2 groups, top-2, weights x 1.5, a shared expert)
        "solar_open": lambda: tf.SolarOpenConfig(**{
            "head_dim": 16, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5, "pad_token_id": None,
            "eos_token_id": 2, **{k: v for k, v in tiny.items() if k != "intermediate_size"}}),
        # DeepSeek-V3's layout scaled down: multi-latent attention (query rank 24, key / value rank 16, 16 + 8
        # RoPE dimensions per head, values 16), YaRN x 4 over 32 positions with mscale 1 / mscale_all_dim 0.8 (so
        # cos / sin and the scores scale differently), and GLM-4.5's MoE layout (dense first layer, sigmoid
        # routing with a random expert bias, 2 groups of 2 experts, weights x 1.5, one shared expert)
        "deepseek_v3": lambda: deepseek_v3(),
        # Sarvam-105B's layout scaled down (sarvam_mla): DeepSeek-V3's with one full-rank query projection, YaRN x 4
        # (two different mscales), routing over all 4 experts (no groups), x 2.5, a dense first layer and a shared
        # expert; written as the release spells it (_as_sarvam_mla_release: Ling's keys, deepseek_yarn)
        "sarvam_mla": lambda: deepseek_v3(q_lora_rank=None, n_group=1, topk_group=1, routed_scaling_factor=2.5),
        # MiMo-7B's layout: a Qwen2 (q / k / v biases, untied, rope theta 640000), saved as the release stores it
        # (_as_mimo_release: model_type mimo and one multi-token-prediction layer's tensors, which are not read)
        "mimo": lambda: tf.Qwen2Config(**tiny, rope_theta=640000.0, tie_word_embeddings=False),
        # DeepSeek-V2-Lite's layout scaled down: multi-latent attention with one full-rank query projection, YaRN x 4
        # (mscale = mscale_all_dim 0.707), softmax routing without renormalising (top-2 of 4, weights x 2), a dense
        # first layer and one shared expert
        "deepseek_v2": lambda: tf.DeepseekV2Config(**{
            "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "routed_scaling_factor": 2.0, "topk_method": "greedy", "norm_topk_prob": False,
            "pad_token_id": None, "eos_token_id": 2,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                "original_max_position_embeddings": 32, "mscale": 0.707, "mscale_all_dim": 0.707},
            **tiny, "num_key_value_heads": tiny["num_attention_heads"]}),
        # GLM-4.7-Flash's layout scaled down: DeepSeek-V3's multi-latent attention (query rank 24, key / value rank 16,
        # 16 + 8 RoPE dimensions per head, values 24) without rope scaling, its dense first layer listed in
        # mlp_layer_types, sigmoid routing with a random expert bias over 4 experts (top-2, weights x 1.8), a shared expert
        "glm4_moe_lite": lambda: tf.Glm4MoeLiteConfig(**{
            "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 24,
            "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "routed_scaling_factor": 1.8, "pad_token_id": None, "eos_token_id": 2, "rope_theta": 1e6,
            "mlp_layer_types": ["dense"] + ["sparse"] * (tiny["num_hidden_layers"] - 1),
            **tiny, "num_key_value_heads": tiny["num_attention_heads"]}),
        # gpt-oss's layout scaled down: attention sinks, biases on q / k / v / o, the router and the experts, 4
        # experts of width 128 (top-2, softmax over the top-2), the clamped SwiGLU with its limit lowered to 0.5 so
        # it bites on random weights, sliding (window 12) and full layers alternating, YaRN x 4 over 32 positions
        # without rounding the ramp (truncate false), head_dim 16 (heads x head_dim != hidden)
        "gpt_oss": lambda: tf.GptOssConfig(**{
            "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": 12, "swiglu_limit": 0.5, "pad_token_id": None, "eos_token_id": 2,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.5e5, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32}, **tiny}),
        # MiniMax-M2's layout scaled down: q / k norms across all heads (GQA: k_norm over 2 heads), RoPE on the first
        # 8 of 16 dimensions per head (the releases' rotary_dim), head_dim 16 x 4 heads, 4 experts of width 128
        # (top-2, sigmoid routing with a random expert bias, renormalised), Mixtral's names
        "minimax_m2": lambda: tf.MiniMaxM2Config(**{
            "head_dim": 16, "rotary_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2, "scoring_func": "sigmoid",
            "use_routing_bias": True, "rope_theta": 5e6, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
            **tiny}),
        # AFM-4.5B's layout: an MLP without a gate (relu2), YaRN past its original positions (here 32)
        "arcee": lambda: tf.ArceeConfig(**{"rope_theta": 1e4, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                                           "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32}, **tiny}),
        # Apertus-8B's layout: per-head q / k norms, llama3 rope x 8 over 32 positions, an xIELU MLP without a gate
        "apertus": lambda: tf.ApertusConfig(**{
            "head_dim": 16, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 1.2e7, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, **tiny}),
        # ERNIE 4.5 0.3B: Llama with RoPE on interleaved pairs, tied (its config's default)
        "ernie4_5": lambda: tf.Ernie4_5Config(**{"head_dim": 16, **tiny}),
        # ERNIE-4.5-21B-A3B's layout scaled down: the first layer dense, the others MoE (moe_layer_start_index 1),
        # 4 experts of width 32, top-2 by softmax + a random expert bias, one shared expert, tied
        "ernie4_5_moe": lambda: tf.Ernie4_5_MoeConfig(**{
            "head_dim": 16, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32, "moe_num_shared_experts": 1,
            "moe_layer_start_index": 1, "moe_layer_interval": 1, "pad_token_id": None, "bos_token_id": 1,
            "eos_token_id": 2, **tiny}),  # no pad id: transformers' padding_idx would zero token 0's input gradient
        # Seed-OSS: Qwen2's biases on q / k / v (its config's default), head_dim 32 != 64 / 4, untied
        "seed_oss": lambda: tf.SeedOssConfig(**{"head_dim": 32, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                                               "attention_dropout": 0.1, "residual_dropout": 0.1, **tiny}),
        # EXAONE 4.0 32B's hybrid layout scaled down: sliding layers (window 12) with RoPE, full ones without
        "exaone4": lambda: tf.Exaone4Config(**{
            "sliding_window": 12, "sliding_window_pattern": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "rope_theta": 1e6, "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            "layer_types": ["sliding_attention", "full_attention"] * (tiny["num_hidden_layers"] // 2), **tiny}),
        # config.json as OLMo 3's 65k-context releases write it (rope_theta, rope_scaling of the full layers)
        "olmo3": lambda: tf.Olmo3Config(**{
            "sliding_window": 12, "pad_token_id": 0, "rope_theta": 5e5,
            "layer_types": ["sliding_attention", "full_attention"] * (tiny["num_hidden_layers"] // 2),
            "eos_token_id": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                             "attention_factor": 1.2, "beta_fast": 32, "beta_slow": 1}, **tiny}),
        # Gemma 2: soft caps low enough to bite on random weights (scores past 1, logits past 2)
        "gemma2": lambda: tf.Gemma2Config(**{"head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 12,
                                            "attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0,
                                            "attn_implementation": "eager", **tiny}),
        # VaultGemma: Gemma 2's layer without its norms after attention and MLP (the same sizes, window and caps)
        "vaultgemma": lambda: tf.VaultGemmaConfig(**{"head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 12,
                                                    "attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0,
                                                    "attn_implementation": "eager", **tiny}),
        # Gemma 3 4B+'s image-text layout around the same text model: a tiny SigLIP tower, image
        # tokens at the top of the 120-token vocabulary (prompts use ids below 117)
        "gemma3": lambda: tf.Gemma3Config(
            text_config=gemma3_text().to_dict(), mm_tokens_per_image=4, image_token_index=119, boi_token_index=117,
            eoi_token_index=118, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                    num_attention_heads=2, image_size=28, patch_size=14)),
        # Qwen2.5-VL-7B's and Qwen3-VL-4B's image-text layouts around a tiny Qwen2 (untied) / Qwen3 (tied), tiny
        # vision towers, M-RoPE sections as the releases' (scaled to head_dim 16); image tokens at the top
        "qwen2_5_vl": lambda: tf.Qwen2_5_VLConfig(
            text_config=dict(tiny, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
            image_token_id=119, video_token_id=118, vision_start_token_id=117, vision_end_token_id=116,
            tie_word_embeddings=False, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                          out_hidden_size=tiny["hidden_size"])),
        "qwen3_vl": lambda: tf.Qwen3VLConfig(
            text_config=dict({"head_dim": 16, **tiny}, tie_word_embeddings=True, rope_parameters={
                "rope_type": "default", "rope_theta": 5e6, "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
            image_token_id=119, video_token_id=118, vision_start_token_id=117, vision_end_token_id=116,
            tie_word_embeddings=True, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                         out_hidden_size=tiny["hidden_size"], deepstack_visual_indexes=[0])),
        # Qwen3-VL-30B-A3B's image-text layout around a tiny Qwen3-MoE text model (4 experts of width 48, top-2,
        # renormalised; its checkpoint stores each layer's experts stacked, gate and up as halves of gate_up_proj)
        "qwen3_vl_moe": lambda: tf.Qwen3VLMoeConfig(
            text_config=dict({"head_dim": 16, **tiny}, tie_word_embeddings=False, moe_intermediate_size=48,
                             num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, rope_parameters={
                                 "rope_type": "default", "rope_theta": 5e6, "mrope_section": [3, 3, 2],
                                 "mrope_interleaved": True}),
            image_token_id=119, video_token_id=118, vision_start_token_id=117, vision_end_token_id=116,
            tie_word_embeddings=False, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                          out_hidden_size=tiny["hidden_size"], deepstack_visual_indexes=[0])),
        # Ministral 3's (3B / 8B / 14B, 2512) image-text layout around a tiny Ministral 3 text model: YaRN x 4 over 64
        # positions (mscale = mscale_all_dim: attention factor 1) and Llama 4's query scaling past 64
        "ministral3": lambda: tf.Mistral3Config(
            text_config=tf.Ministral3Config(**{"head_dim": 16, **tiny}, rope_parameters={
                "type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64,
                "max_position_embeddings": tiny["max_position_embeddings"], "beta_fast": 32.0, "beta_slow": 1.0,
                "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}).to_dict(),
            image_token_index=119, tie_word_embeddings=False,
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14, head_dim=16)),
        # Qwen3.5's text model scaled down: Gated DeltaNet (2 key heads of 16, 4 value heads of 8, conv 4) in the first
        # of every two layers, gated attention (head_dim 32, RoPE on its first quarter, (1 + w) q / k norms) in
        # the second; the M-RoPE sections its releases carry (scaled to 4 rotary pairs); tied, as the small ones are
        "qwen3_5_text": lambda: tf.Qwen3_5TextConfig(**QWEN3_5_TEXT(tiny)),
        # Qwen3.5's image-text checkpoint (Qwen3_5ForConditionalGeneration) around that text model, a tiny vision tower
        "qwen3_5": lambda: tf.Qwen3_5Config(text_config=QWEN3_5_TEXT(tiny), tie_word_embeddings=True,
                                            **QWEN3_5_VISION(tiny)),
        # Qwen3.5-MoE's text model scaled down: the layers above with Qwen2-MoE's experts in every layer (4 of width
        # 32, top-2 renormalised, a gated shared expert of width 48); untied, as its releases are
        "qwen3_5_moe_text": lambda: tf.Qwen3_5MoeTextConfig(**QWEN3_5_MOE_TEXT(tiny)),
        # Qwen3-Next's layers scaled down (Qwen3.5-MoE's, its DeltaNet projections stored fused per key head:
        # in_proj_qkvz / in_proj_ba), every layer MoE with the top-2 renormalised, as Qwen3-Next-80B-A3B's
        "qwen3_next": lambda: tf.Qwen3NextConfig(**QWEN3_NEXT(tiny)),
        "qwen3_5_moe": lambda: tf.Qwen3_5MoeConfig(text_config=QWEN3_5_MOE_TEXT(tiny), tie_word_embeddings=False,
                                                   **QWEN3_5_VISION(tiny)),
        # Mistral Small 3.1's image-text layout around a tiny Mistral (a tiny Pixtral tower; untied)
        # LFM2-VL's image-text layout (model.language_model.*, model.vision_tower.*, tied) around the tiny LFM2
        "lfm2_vl": lambda: tf.Lfm2VlConfig(
            text_config=dict(model_type="lfm2", layer_types=["conv", "full_attention"] * (tiny["num_hidden_layers"] // 2),
                             block_auto_adjust_ff_dim=False, pad_token_id=0, eos_token_id=2, bos_token_id=1, **tiny),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
            image_token_id=119),
        "gemma4": lambda: tf.Gemma4Config(
            text_config=gemma4_text().to_dict(), audio_config=None, image_token_id=119, boi_token_id=117,
            eoi_token_id=118, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, num_key_value_heads=2, head_dim=16)),
        "mistral3": lambda: tf.Mistral3Config(
            text_config=tf.MistralConfig(**{"sliding_window": None, "rope_theta": 1e6, **tiny}).to_dict(),
            image_token_index=119, tie_word_embeddings=False,
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=28, patch_size=14, head_dim=16)),
    }[arch]()
    if config_only:
        return config.to_dict()
    cls = {"llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM, "qwen2": tf.Qwen2ForCausalLM, "qwen3": tf.Qwen3ForCausalLM,
           "qwen3_moe": tf.Qwen3MoeForCausalLM, "qwen2_moe": tf.Qwen2MoeForCausalLM,
           "mixtral": tf.MixtralForCausalLM, "phi3": tf.Phi3ForCausalLM, "smollm3": tf.SmolLM3ForCausalLM,
           "granite": tf.GraniteForCausalLM, "gemma3_text": tf.Gemma3ForCausalLM,
           "gemma3": tf.Gemma3ForConditionalGeneration, "gemma2": tf.Gemma2ForCausalLM,
           "mistral3": tf.Mistral3ForConditionalGeneration, "gemma": tf.GemmaForCausalLM,
           "olmo2": tf.Olmo2ForCausalLM, "olmo3": tf.Olmo3ForCausalLM, "exaone4": tf.Exaone4ForCausalLM, "seed_oss": tf.SeedOssForCausalLM, "glm4": tf.Glm4ForCausalLM, "ernie4_5": tf.Ernie4_5ForCausalLM, "ernie4_5_moe": tf.Ernie4_5_MoeForCausalLM, "apertus": tf.ApertusForCausalLM,
           "arcee": tf.ArceeForCausalLM, "glm4_moe": tf.Glm4MoeForCausalLM, "deepseek_v3": tf.DeepseekV3ForCausalLM, "sarvam_mla": tf.DeepseekV3ForCausalLM,
           "deepseek_v2": tf.DeepseekV2ForCausalLM, "gpt_oss": tf.GptOssForCausalLM,
           "minimax_m2": tf.MiniMaxM2ForCausalLM, "glm4_moe_lite": tf.Glm4MoeLiteForCausalLM, "ministral3": tf.Mistral3ForConditionalGeneration, "qwen2_5_vl": tf.Qwen2_5_VLForConditionalGeneration, "qwen3_vl": tf.Qwen3VLForConditionalGeneration,
           "qwen3_vl_moe": tf.Qwen3VLMoeForConditionalGeneration, "qwen3_5_text": tf.Qwen3_5ForCausalLM,
           "qwen3_5": tf.Qwen3_5ForConditionalGeneration, "qwen3_5_moe_text": tf.Qwen3_5MoeForCausalLM,
           "qwen3_5_moe": tf.Qwen3_5MoeForConditionalGeneration, "qwen3_next": tf.Qwen3NextForCausalLM,
           "olmoe": tf.OlmoeForCausalLM, "flex_olmo": tf.FlexOlmoForCausalLM,
           "hunyuan_v1_dense": tf.HunYuanDenseV1ForCausalLM, "hunyuan_v1_moe": tf.HunYuanMoEV1ForCausalLM,
           "granitemoe": tf.GraniteMoeForCausalLM, "granitemoeshared": tf.GraniteMoeSharedForCausalLM,
           "granitemoehybrid": tf.GraniteMoeHybridForCausalLM, "glm": tf.GlmForCausalLM,
           "helium": tf.HeliumForCausalLM, "stablelm": tf.StableLmForCausalLM, "nemotron_h": tf.NemotronHForCausalLM, "falcon_h1": tf.FalconH1ForCausalLM, "lfm2": tf.Lfm2ForCausalLM, "lfm2_moe": tf.Lfm2MoeForCausalLM, "lfm2_vl": tf.Lfm2VlForConditionalGeneration, "exaone_moe": tf.ExaoneMoeForCausalLM, "hy_v3": tf.HYV3ForCausalLM, "afmoe": tf.AfmoeForCausalLM, "sarvam_moe": tf.Glm4MoeForCausalLM, "jais2": tf.Jais2ForCausalLM, "mellum": tf.MellumForCausalLM, "gemma4_text": tf.Gemma4ForCausalLM, "gemma4": tf.Gemma4ForConditionalGeneration, "hyperclovax": tf.HyperCLOVAXForCausalLM, "iquestcoder": tf.LlamaForCausalLM, "internlm3": tf.LlamaForCausalLM, "youtu": tf.YoutuForCausalLM, "mimo": tf.Qwen2ForCausalLM, "exaone": tf.LlamaForCausalLM,
           "starcoder2": tf.Starcoder2ForCausalLM, "nemotron": tf.NemotronForCausalLM,
           "cohere": tf.CohereForCausalLM, "cohere2": tf.Cohere2ForCausalLM, "phi": tf.PhiForCausalLM,
           "gpt_neox": tf.GPTNeoXForCausalLM, "falcon": tf.FalconForCausalLM, "olmo": tf.OlmoForCausalLM,
           "nanochat": tf.NanoChatForCausalLM, "vaultgemma": tf.VaultGemmaForCausalLM,
           "dots1": tf.Dots1ForCausalLM, "solar_open": tf.SolarOpenForCausalLM}[arch]
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm_1.weight", "norm_2.weight", "router.scale", "per_expert_scale")) \
                    and not (arch.startswith(("gemma", "vaultgemma")) and not arch.startswith("gemma4") or arch == "nemotron"):
                p.add_(1.0)  # (Gemma 1-3's norms scale by 1 + weight; Gemma 4's router scales by its own)
        for name, b in model.named_buffers():  # sigmoid routing's expert bias (GLM-4.5): a buffer, not 0
            if name.endswith(("e_score_correction_bias", "feed_forward.expert_bias")):  # (LFM2-MoE's name)
                b.normal_(0.0, 0.1)
            if name.endswith("layer_scalar"):  # Gemma 4's per-layer constant: not 1
                b.uniform_(0.5, 1.5)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    if arch == "exaone" and not hasattr(tf, "ExaoneConfig"):  # saved as a Llama: as EXAONE's releases store it instead
        _as_exaone_release(out_dir)
    if arch == "iquestcoder" and not hasattr(tf, "IQuestCoderConfig"):  # (the vLLM venv's transformers has none)
        _retype(out_dir, "iquestcoder", "IQuestCoderForCausalLM")
    if arch == "internlm3":  # as the release names its class (transformers saves LlamaForCausalLM)
        _retype(out_dir, "internlm3", "InternLM3ForCausalLM")
    if arch == "sarvam_moe" and not hasattr(tf, "SarvamMoEConfig"):  # (nor this)
        _as_sarvam_release(out_dir)
    if arch == "sarvam_mla":
        _as_sarvam_mla_release(out_dir)
    if arch == "mimo":
        _as_mimo_release(out_dir)
    return model


# EXAONE 3.0 / 3.5's release names for a Llama's (transformers >= 5.20 saves them so itself: test_checkpoint.py checks it)
EXAONE_RELEASE_NAMES = ((r"^model\.embed_tokens\.", "transformer.wte."), (r"^model\.layers\.", "transformer.h."),
                        (r"^model\.norm\.", "transformer.ln_f."), (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
                        (r"\.self_attn\.", ".attn.attention."), (r"\.input_layernorm\.", ".ln_1."),
                        (r"\.post_attention_layernorm\.", ".ln_2."), (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
                        (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."), (r"\.mlp\.down_proj\.", ".mlp.c_proj."))


def _as_exaone_release(out_dir):
    """A Llama saved in `out_dir` renamed as EXAONE 3.5's release: its tensor names and config.json's model_type."""
    import re

    from safetensors.torch import load_file, save_file

    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    for pattern, repl in EXAONE_RELEASE_NAMES:
        tensors = {re.sub(pattern, repl, k): v for k, v in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})
    _retype(out_dir, "exaone", "ExaoneForCausalLM")


# Sarvam MoE's (Ling's) release names for a GLM-4.5's (transformers >= 5.24 saves them so itself: test_hf_bridge_io.py
# checks it); q / k / v are fused as attention.query_key_value by _as_sarvam_release
SARVAM_RELEASE_NAMES = ((r"^model\.embed_tokens\.", "model.word_embeddings."), (r"\.self_attn\.o_proj\.", ".attention.dense."),
                        (r"\.self_attn\.q_norm\.", ".attention.query_layernorm."),
                        (r"\.self_attn\.k_norm\.", ".attention.key_layernorm."),
                        (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.gate.expert_bias"))


def _as_sarvam_release(out_dir):
    """A GLM-4.5 saved in `out_dir` renamed as Sarvam MoE's release: q / k / v (and their biases) fused as
    attention.query_key_value, SARVAM_RELEASE_NAMES, config.json's model_type and architecture."""
    import re

    from safetensors.torch import load_file, save_file

    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    for name in [n for n in tensors if ".self_attn.q_proj." in n]:
        parts = [tensors.pop(name.replace(".q_proj.", f".{p}_proj.")) for p in "qkv"]
        tensors[name.replace(".self_attn.q_proj.", ".attention.query_key_value.")] = torch.cat(parts)
    for pattern, repl in SARVAM_RELEASE_NAMES:
        tensors = {re.sub(pattern, repl, k): v for k, v in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})
    _retype(out_dir, "sarvam_moe", "SarvamMoEForCausalLM")


def _as_mimo_release(out_dir):
    """A Qwen2 saved in `out_dir` as MiMo-7B's release stores it: config.json's model_type mimo (MiMoForCausalLM, its
    remote code in auto_map, attention_bias true, one multi-token-prediction layer) and that layer's tensors
    (model.mtp_layers.0.*: norms, the input projection and a Qwen2 layer, random) beside the model's."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    g = torch.Generator().manual_seed(7)
    mtp = {n.replace("model.layers.0.", "model.mtp_layers.0."): torch.randn(t.shape, generator=g) * 0.02
           for n, t in tensors.items() if n.startswith("model.layers.0.")}
    hidden = tensors["model.norm.weight"].shape[0]
    mtp.update({f"model.mtp_layers.0.{n}.weight": torch.ones(hidden) for n in ("token_layernorm", "hidden_layernorm",
                                                                                "final_layernorm")})
    mtp["model.mtp_layers.0.input_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=g) * 0.02
    save_file({**tensors, **mtp}, path, metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    config.update(model_type="mimo", architectures=["MiMoForCausalLM"], attention_bias=True, num_nextn_predict_layers=1,
                  auto_map={"AutoConfig": "configuration_mimo.MiMoConfig",
                            "AutoModelForCausalLM": "modeling_mimo.MiMoForCausalLM"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)


def _as_sarvam_mla_release(out_dir):
    """A DeepSeek-V3 saved in `out_dir` with config.json as Sarvam-105B's release spells it: model_type sarvam_mla, Ling's
    num_experts / num_shared_experts, rope type deepseek_yarn, the legacy head_dim (= qk_rope_head_dim) and the keys of
    vLLM's Sarvam module (score_function, moe_router_enable_expert_bias). The tensors keep DeepSeek-V3's names."""
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    config["num_experts"], config["num_shared_experts"] = config.pop("n_routed_experts"), config.pop("n_shared_experts")
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope.pop("rope_theta"), rope_scaling={**{k: v for k, v in rope.items() if k != "rope_type"},
                                                                   "type": "deepseek_yarn"},
                  head_dim=config["qk_rope_head_dim"], score_function="sigmoid", moe_router_enable_expert_bias=True,
                  model_type="sarvam_mla", architectures=["SarvamMLAForCausalLM"])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)


def _retype(out_dir, model_type, architecture):
    """config.json in `out_dir` saying `model_type` and `architecture` (a Llama saved in their stead)."""
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    config.update(model_type=model_type, architectures=[architecture])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)


# config.json of released checkpoints, as published (not downloadable here)
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "first_k_dense_replace": 3,
               "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
               "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
               "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
               "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
               "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                                       "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                                       "type": "yarn"},
               "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
               "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280}


DEEPSEEK_V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "aux_loss_alpha": 0.001,
                    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944,
                    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
                    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
                    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
                    "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
                    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
                    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
                    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
                    "vocab_size": 102400}

# EleutherAI/pythia-70m's config.json (transformers 4.24: the RoPE keys rotary_pct / rotary_emb_base)
PYTHIA_70M = {"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
              "hidden_size": 512, "initializer_range": 0.02, "intermediate_size": 2048, "layer_norm_eps": 1e-05,
              "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 8,
              "num_hidden_layers": 6, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
              "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
              "use_parallel_residual": True, "vocab_size": 50304}

# tiiuae/falcon-7b's config.json (multi-query, one norm beside attention and MLP, tied) and falcon-40b's (grouped,
# two norms: new_decoder_architecture), as published
FALCON_7B = {"alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
             "attention_dropout": 0.0, "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
             "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
             "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71,
             "num_hidden_layers": 32, "parallel_attn": True, "torch_dtype": "bfloat16",
             "transformers_version": "4.27.4", "use_cache": True, "vocab_size": 65024}
FALCON_40B = dict(FALCON_7B, hidden_size=8192, num_attention_heads=128, num_hidden_layers=60, num_kv_heads=8,
                  new_decoder_architecture=True)

# allenai/OLMo-7B-0424-hf's config.json layout (transformers 4.40 keys; q / k / v clamped at 8)
OLMO_7B_0424 = {"architectures": ["OlmoForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                "bos_token_id": None, "clip_qkv": 8.0, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 4096,
                "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
                "model_type": "olmo", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
                "pad_token_id": 1, "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False,
                "torch_dtype": "float32", "use_cache": True, "vocab_size": 50304}

# openai/gpt-oss-20b's config.json (its weights: MXFP4 experts, see hf_bridge/names.py)
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
               "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
               "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
               "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
               "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
               "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
               "output_router_logits": False, "pad_token_id": 199999,
               "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                  "model.embed_tokens", "lm_head"],
                                       "quant_method": "mxfp4"},
               "rms_norm_eps": 1e-05,
               "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
               "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
               "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
               "vocab_size": 201088}

# MiniMax-M2's config.json as MiniMaxAI/MiniMax-M2 publishes it (its architecture keys; MiniMax-M2.1 / M2.5 the same):
# RoPE on rotary_dim 64 of 128 written the legacy way, three MTP modules after layer 61, block FP8 weights
MINIMAX_M2 = {"architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [1] * 62, "head_dim": 128,
              "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536, "layernorm_full_attention_beta": 1.0,
              "layernorm_linear_attention_beta": 1.0, "layernorm_mlp_beta": 1.0, "max_position_embeddings": 196608,
              "model_type": "minimax_m2", "mtp_transformer_layers": 1, "num_attention_heads": 48,
              "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8, "num_local_experts": 256,
              "num_mtp_modules": 3, "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06, "rope_theta": 5000000,
              "rotary_dim": 64, "router_jitter_noise": 0.0, "scoring_func": "sigmoid", "shared_intermediate_size": 0,
              "sliding_window": None, "tie_word_embeddings": False, "use_mtp": True, "use_qk_norm": True,
              "use_routing_bias": True, "vocab_size": 200064,
              "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                                      "weight_block_size": [128, 128],
                                      "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}}

# HunYuan's config.json in the form tencent/Hunyuan-7B-Instruct publishes it (it cannot be downloaded here: the keys
# and the RoPE are the release's form, the sizes as documented for the 7B): NTK alpha 1000 labelled dynamic, with
# YaRN-style keys transformers does not read for it
HUNYUAN_7B = {"architectures": ["HunYuanDenseV1ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 1, "eos_token_id": 127960, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
              "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
              "mlp_bias": False, "model_type": "hunyuan_v1_dense", "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 8, "pad_token_id": 127961, "rms_norm_eps": 1e-05,
              "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0, "mscale": 1.0,
                               "mscale_all_dim": 1.0, "type": "dynamic"},
              "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
              "vocab_size": 128167}

# HunYuan-MoE's config.json in the form tencent/Hunyuan-A13B-Instruct publishes it (the same caveat): per-layer lists
# of moe_topk / moe_intermediate_size / num_shared_expert, 64 experts, no cross-layer attention
HUNYUAN_A13B = dict(HUNYUAN_7B, architectures=["HunYuanMoEV1ForCausalLM"], model_type="hunyuan_v1_moe",
                    intermediate_size=3072, num_experts=64, moe_topk=[8] * 32, moe_intermediate_size=[3072] * 32,
                    num_shared_expert=[1] * 32, use_mixed_mlp_moe=True, moe_layer_num_skipped=0, use_cla=False,
                    cla_share_factor=2, use_qk_norm=True, tie_word_embeddings=True)

# OLMoE's config.json as allenai/OLMoE-1B-7B-0125-Instruct publishes it (0924, base, SFT and DPO alike)
# Granite 3.1 3B-A800M's (granitemoe: 40 experts 512 wide, 8 per token, Granite's scalars, tied) and Granite 4.0
# Micro's (granitemoehybrid: 40 attention layers, no experts, its shared_mlp 8192 wide, RoPE at theta 1e7) layouts
GRANITE_3B_A800M = {"architectures": ["GraniteMoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.1,
                    "attention_multiplier": 0.015625, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
                    "hidden_act": "silu", "hidden_size": 1536, "intermediate_size": 512, "logits_scaling": 6.0,
                    "max_position_embeddings": 131072, "model_type": "granitemoe", "num_attention_heads": 24,
                    "num_experts_per_tok": 8, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 40,
                    "pad_token_id": 0, "residual_multiplier": 0.22, "rms_norm_eps": 1e-06, "rope_scaling": None,
                    "rope_theta": 10000000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 49155}
GRANITE_4_MICRO = {"architectures": ["GraniteMoeHybridForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                   "attention_multiplier": 0.015625, "bos_token_id": 100257, "embedding_multiplier": 12,
                   "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 8192,
                   "layer_types": ["attention"] * 40, "logits_scaling": 10, "mamba_chunk_size": 256, "mamba_d_conv": 4,
                   "mamba_d_head": 64, "mamba_d_state": 256, "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 128,
                   "max_position_embeddings": 131072, "model_type": "granitemoehybrid", "num_attention_heads": 40,
                   "num_experts_per_tok": 0, "num_hidden_layers": 40, "num_key_value_heads": 8, "num_local_experts": 0,
                   "pad_token_id": 100256, "position_embedding_type": "rope", "residual_multiplier": 0.22,
                   "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000000, "shared_intermediate_size": 8192,
                   "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 100352}
OLMOE_1B_7B = {"architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
               "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
               "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 64,
               "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
               "output_router_logits": False, "pad_token_id": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
               "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 50304}


def add_mtp_layer(hf_dir):
    """Append a random multi-token-prediction layer to a tiny 2-layer DeepSeek-V3 / GLM-4.5 checkpoint
    (made by make_tiny_hf; transformers saves none although config.json says num_nextn_predict_layers 1):
    model.layers.2.* as layer 1's tensors plus enorm, hnorm and eh_proj, as DeepSeek-V3 stores its
    layer 61. Returns the added tensors."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(hf_dir, "model.safetensors")
    weights = load_file(path)
    g = torch.Generator().manual_seed(3)
    hidden = weights["model.embed_tokens.weight"].shape[1]
    mtp = {n.replace("model.layers.1.", "model.layers.2."): torch.randn(t.shape, generator=g)
           for n, t in weights.items() if n.startswith("model.layers.1.")}
    mtp.update({"model.layers.2.enorm.weight": torch.ones(hidden), "model.layers.2.hnorm.weight": torch.ones(hidden),
                "model.layers.2.eh_proj.weight": torch.randn(hidden, 2 * hidden, generator=g)})
    save_file({**weights, **mtp}, path, metadata={"format": "pt"})
    return mtp


def save_random_reward_model(config, out_dir, seed=0):
    """Save a random fp32 Qwen2ForSequenceClassification of `config` (num_labels=1) to out_dir, with
    weights ~ N(0, 0.1) and norm weights ~ 1 + N(0, 0.1) so scores vary visibly. Returns it."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.Qwen2ForSequenceClassification(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.1)
            if name.endswith("norm.weight"):
                p.add_(1.0)
    model.save_pretrained(out_dir)
    return model


class FakeGroup:
    """A worker group without Ray: records run_all / run_sharded calls as (name, method) in `log`
    and answers from `answers[method]`, as the real workers would."""

    def __init__(self, name, log, answers):
        self.name, self.log, self.answers = name, log, answers

    def run_all(self, method, *args, timeout_s=None):
        self.log.append((self.name, method))
        return self.answers[method](*args)

    def run_sharded(self, method, batch, *args, layout=None, combine=None):
        """One shard per DP rank of `layout` (default 1); outputs joined by `combine` as the real group does."""
        from mindspeed_rl.distributed.worker_group import concat_batches, split_batch

        self.log.append((self.name, method))
        if layout is None or layout.dp_size == 1:
            out = self.answers[method](batch, *args)
            return combine([out]) if combine else out
        return (combine or concat_batches)([self.answers[method](s, *args) for s in split_batch(batch, layout.dp_size)])


def per_expert(tensors, model_type=None):
    """transformers 5 keeps MoE experts fused in memory ((E, 2f, h) gate_up_proj, (E, h, f) down_proj);
    the checkpoint, our bridge and vLLM's loader name them per expert. gpt-oss keeps them stacked in its
    own layout (hf_bridge/names.py's _STACKED), read as the bridge reads them. Granite's MoE modules name the
    experts block_sparse_moe.experts, the router block_sparse_moe.router and keep the shared MLP's gate / up as
    shared_mlp.input_linear: named here as the bridge names them."""
    from mindspeed_rl.models.hf_bridge.names import stacked_expert, stacked_layout, stacked_module_layout, stacked_parts

    out = {}
    for name, t in tensors.items():
        name = name.replace(".block_sparse_moe.experts.", ".mlp.experts.").replace(".block_sparse_moe.router.weight",
                                                                                   ".mlp.gate.weight")
        name = name.replace(".feed_forward.experts.", ".mlp.experts.")  # LFM2-MoE's
        parts = stacked_parts(name, model_type, t.shape[0])
        if name.endswith("shared_mlp.input_linear.weight"):  # Granite's shared MLP: [gate; up]
            prefix = name[:-len("shared_mlp.input_linear.weight")]
            out[f"{prefix}mlp.shared_expert.gate_proj.weight"], out[f"{prefix}mlp.shared_expert.up_proj.weight"] = \
                t.chunk(2, dim=0)
        elif parts is not None:
            out.update({canonical: stacked_expert(t[e], part, stacked_layout(model_type), stacked_module_layout(model_type))
                        for canonical, e, part in parts})
        elif name.endswith("mlp.experts.gate_up_proj"):
            for e, w in enumerate(t):
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"], \
                    out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = w.chunk(2, dim=0)
        elif name.endswith(("mlp.experts.down_proj", "mixer.experts.down_proj", "mixer.experts.up_proj")):
            # (Nemotron-H's experts, without a gate: up_proj (E, f, h), under its mixer)
            proj = name.rsplit(".", 1)[1]
            prefix = name[:-len(proj)].replace(".mixer.experts.", ".mlp.experts.")
            for e, w in enumerate(t):
                out[f"{prefix}{e}.{proj}.weight"] = w
        else:
            out[name] = t
    return out


FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_gpt_oss(src_dir, dst_dir):
    """gpt-oss's own release format from a make_tiny_hf("gpt_oss") checkpoint: each expert weight in MXFP4
    (OCP microscaling: groups of 32 values along the input dimension, one power-of-two scale each stored as
    exponent + 127, values as FP4 e2m1 codes two per byte, the even element in the low nibble) as
    `<proj>_blocks` (E, out, in / 32, 16) + `<proj>_scales` (E, out, in / 32), config.json with
    quantization_config mxfp4. Returns {stored weight name: its dequantized (E, in, out) value}."""
    import shutil

    from safetensors.torch import load_file, save_file

    os.makedirs(dst_dir, exist_ok=True)
    for f in os.listdir(src_dir):
        if f != "model.safetensors":
            shutil.copy(os.path.join(src_dir, f), os.path.join(dst_dir, f))
    tensors, values = load_file(os.path.join(src_dir, "model.safetensors")), {}
    lut = torch.tensor(FP4_VALUES)
    for name in [n for n in tensors if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        w = tensors.pop(name).float().transpose(1, 2)  # (E, out, in): groups along in
        groups = w.reshape(*w.shape[:2], -1, 32)
        exp = torch.ceil(torch.log2(groups.abs().amax(-1).clamp_min(1e-30) / 6.0)).clamp(-127, 127)
        scaled = groups / torch.exp2(exp)[..., None]
        codes = (scaled[..., None] - lut).abs().argmin(-1).to(torch.uint8)  # nearest FP4 value
        tensors[name + "_blocks"] = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
        tensors[name + "_scales"] = (exp + 127).to(torch.uint8).contiguous()
        values[name] = (lut[codes.long()] * torch.exp2(exp)[..., None]).reshape(w.shape).transpose(1, 2)
    save_file(tensors, os.path.join(dst_dir, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(dst_dir, "config.json")))
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    json.dump(config, open(os.path.join(dst_dir, "config.json"), "w"))
    return values


def fp8_blockwise(src_dir, dst_dir, block=128):
    """A block-wise FP8 checkpoint (DeepSeek-V3's release format) from a HF directory: every 2-D
    `.weight` of the layers in float8_e4m3fn with a float32 `<name>_scale_inv` per block x block
    tile (its max / 448), config.json with quantization_config fp8 [128, 128]. Returns {weight name:
    its dequantized fp32 value}."""
    import shutil

    from safetensors.torch import load_file, save_file

    os.makedirs(dst_dir, exist_ok=True)
    for f in os.listdir(src_dir):
        if f != "model.safetensors":
            shutil.copy(os.path.join(src_dir, f), os.path.join(dst_dir, f))
    tensors, values = load_file(os.path.join(src_dir, "model.safetensors")), {}
    for name in [n for n in tensors if ".layers." in n and n.endswith(".weight") and tensors[n].dim() == 2]:
        w = tensors[name].float()
        rows, cols = -(-w.shape[0] // block), -(-w.shape[1] // block)
        padded = torch.zeros(rows * block, cols * block)
        padded[:w.shape[0], :w.shape[1]] = w
        tiles = padded.reshape(rows, block, cols, block)
        scale = (tiles.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-12)  # (rows, cols)
        q = (tiles / scale[:, None, :, None]).reshape(padded.shape)[:w.shape[0], :w.shape[1]].to(torch.float8_e4m3fn)
        tensors[name], tensors[name + "_scale_inv"] = q.contiguous(), scale.contiguous()
        full = scale.repeat_interleave(block, 0)[:w.shape[0]].repeat_interleave(block, 1)[:, :w.shape[1]]
        values[name] = q.float() * full
    save_file(tensors, os.path.join(dst_dir, "model.safetensors"), metadata={"format": "pt"})
    config = json.load(open(os.path.join(dst_dir, "config.json")))
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [block, block]}
    json.dump(config, open(os.path.join(dst_dir, "config.json"), "w"))
    return values


# ---- the Gated DeltaNet mixer against transformers' Qwen3.5 layer (tests/unit/models, tests/dist/models)
def hf_delta_net(key_heads=2, value_heads=4, key_dim=8, value_dim=6, hidden=32, seed=0):
    """transformers' Qwen3_5GatedDeltaNet with every parameter random (norm weight, A_log, dt_bias too)."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(hidden_size=hidden, num_hidden_layers=1, layer_types=["linear_attention"],
                               linear_num_key_heads=key_heads, linear_num_value_heads=value_heads,
                               linear_key_head_dim=key_dim, linear_value_head_dim=value_dim,
                               linear_conv_kernel_dim=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               vocab_size=64)
    layer = Qwen3_5GatedDeltaNet(config, 0).float()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        layer.A_log.copy_(torch.empty_like(layer.A_log).uniform_(0, 1.5))
        layer.norm.weight.add_(1.0)
    return layer, config


def shape_of(config):
    from mindspeed_rl.models.delta_layout import DeltaNetShape

    return DeltaNetShape(config.linear_num_key_heads, config.linear_num_value_heads, config.linear_key_head_dim,
                         config.linear_value_head_dim, config.linear_conv_kernel_dim, config.rms_norm_eps)


def ours_delta_net(hf, config, tp=1, rank=0, sequence_parallel=False):
    """Our mixer at TP `tp` (this process's megatron groups), holding rank `rank`'s share of hf's weights."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mindspeed_rl.models.delta_layout import conv_from_hf, in_proj_from_parts
    from mindspeed_rl.models.gated_delta_net import GatedDeltaNet

    shape = shape_of(config)
    mcfg = TransformerConfig(num_layers=1, hidden_size=config.hidden_size, num_attention_heads=4,
                             tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel,
                             use_cpu_initialization=True, params_dtype=torch.float32)
    ours = GatedDeltaNet(mcfg, shape=shape)
    with torch.no_grad():
        in_proj = in_proj_from_parts(hf.in_proj_qkv.weight, hf.in_proj_z.weight, hf.in_proj_b.weight,
                                     hf.in_proj_a.weight, shape)
        ours.in_proj.weight.copy_(in_proj.chunk(tp)[rank])  # whole key heads per rank
        ours.conv1d.weight.copy_(conv_from_hf(hf.conv1d.weight, shape).chunk(tp)[rank])
        ours.A_log.copy_(hf.A_log.chunk(tp)[rank])
        ours.dt_bias.copy_(hf.dt_bias.chunk(tp)[rank])
        ours.norm.weight.copy_(hf.norm.weight)
        ours.out_proj.weight.copy_(hf.out_proj.weight.chunk(tp, dim=1)[rank])
    return ours


def assert_near(got, want, rel=1e-5, what=""):
    """max |got - want| <= rel x max |want|: fp32 round-off relative to the tensor's scale."""
    diff, scale = (got - want).abs().max().item(), want.abs().max().item()
    assert diff <= rel * scale, f"{what}: max difference {diff:.3g} against a scale of {scale:.3g}"


def mask_4d(mask2d):
    from mindspeed_rl.models.forward import attention_mask_4d

    return attention_mask_4d(mask2d)


def delta_batch(hidden=32, seq=70, pad=9, seed=1):
    torch.manual_seed(seed)
    x = torch.randn(2, seq, hidden)
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[0, :pad] = 0
    return x, mask, torch.randn(2, seq, hidden)


def hf_mamba2(heads=4, head_dim=8, groups=1, state=6, hidden=32, chunk=16, seed=0):
    """transformers' GraniteMoeHybridMambaLayer (Granite 4.0-H's Mamba-2 mixer) with every parameter random
    (norm weight, A_log, D, dt_bias, conv bias too)."""
    from transformers import GraniteMoeHybridConfig
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer

    torch.manual_seed(seed)
    config = GraniteMoeHybridConfig(hidden_size=hidden, num_hidden_layers=1, layer_types=["mamba"],
                                    mamba_n_heads=heads, mamba_d_head=head_dim, mamba_expand=heads * head_dim // hidden,
                                    mamba_n_groups=groups, mamba_d_state=state, mamba_chunk_size=chunk,
                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=64, num_local_experts=0,
                                    shared_intermediate_size=64, position_embedding_type="nope")
    layer = GraniteMoeHybridMambaLayer(config, 0).float()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        layer.A_log.copy_(torch.empty_like(layer.A_log).uniform_(-1, 1.5))
        layer.norm.weight.add_(1.0)
    return layer, config


def mamba_shape_of(config):
    from mindspeed_rl.models.mamba_layout import MambaShape

    return MambaShape(config.mamba_n_heads, config.mamba_d_head, config.mamba_n_groups, config.mamba_d_state,
                      config.mamba_d_conv, config.mamba_chunk_size, config.mamba_conv_bias, config.rms_norm_eps)


def ours_mamba2(hf, config, tp=1, rank=0, sequence_parallel=False):
    """Our Mamba-2 mixer at TP `tp` (this process's megatron groups), holding rank `rank`'s share of hf's weights."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mindspeed_rl.models.mamba2 import Mamba2Mixer
    from mindspeed_rl.models.mamba_layout import zxdt_from_parts

    shape = mamba_shape_of(config)
    mcfg = TransformerConfig(num_layers=1, hidden_size=config.hidden_size, num_attention_heads=4,
                             tensor_model_parallel_size=tp, sequence_parallel=sequence_parallel,
                             use_cpu_initialization=True, params_dtype=torch.float32)
    ours = Mamba2Mixer(mcfg, shape=shape)
    z, x, b, c, dt = hf.in_proj.weight.split(shape.stored_in_proj_widths())
    cx, cbc = hf.conv1d.weight.split([shape.inner, 2 * shape.groups * shape.state])
    bx, bbc = hf.conv1d.bias.split([shape.inner, 2 * shape.groups * shape.state])
    with torch.no_grad():
        ours.in_proj_zxdt.weight.copy_(zxdt_from_parts(z, x, dt, shape).chunk(tp)[rank])  # whole heads per rank
        ours.in_proj_bc.weight.copy_(torch.cat([b, c]))
        ours.conv1d_x.weight.copy_(cx.chunk(tp)[rank])
        ours.conv1d_x.bias.copy_(bx.chunk(tp)[rank])
        ours.conv1d_bc.weight.copy_(cbc)
        ours.conv1d_bc.bias.copy_(bbc)
        ours.ssm_A_log.copy_(hf.A_log.chunk(tp)[rank])
        ours.ssm_D.copy_(hf.D.chunk(tp)[rank])
        ours.ssm_dt_bias.copy_(hf.dt_bias.chunk(tp)[rank])
        ours.ssm_norm.weight.copy_(hf.norm.weight.chunk(tp)[rank])
        ours.ssm_out_proj.weight.copy_(hf.out_proj.weight.chunk(tp, dim=1)[rank])
    return ours


def mamba2_grads_as_hf(ours, shape):
    """Our TP-1 mixer's gradients under transformers' names and layouts."""
    from mindspeed_rl.models.mamba_layout import zxdt_to_parts

    z, x, dt = zxdt_to_parts(ours.in_proj_zxdt.weight.grad, shape)
    b, c = ours.in_proj_bc.weight.grad.chunk(2)
    return {"in_proj": torch.cat([z, x, b, c, dt]),
            "conv1d.weight": torch.cat([ours.conv1d_x.weight.grad, ours.conv1d_bc.weight.grad]),
            "conv1d.bias": torch.cat([ours.conv1d_x.bias.grad, ours.conv1d_bc.bias.grad]),
            "A_log": ours.ssm_A_log.grad, "D": ours.ssm_D.grad, "dt_bias": ours.ssm_dt_bias.grad,
            "norm": ours.ssm_norm.weight.grad, "out_proj": ours.ssm_out_proj.weight.grad}
