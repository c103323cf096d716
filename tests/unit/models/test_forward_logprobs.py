"""models.forward: masks, log-probs / entropy from (TP=1) logits, and logit + log-prob parity with
transformers for tiny random Llama / Qwen2 / Qwen3 in one process (TP=1, PP=1)."""

import json
import math

import pytest
import torch

from testing_utils import HF_VARIANTS, make_tiny_hf
from mindspeed_rl.models.forward import (attention_mask_4d, compute_log_probs, position_ids_from_mask,
                                         vocab_parallel_log_probs)


def test_attention_mask_is_causal_and_hides_padding():
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    m = attention_mask_4d(mask)  # (B, 1, S, S), True = masked
    assert m.shape == (2, 1, 3, 3)
    assert m[0, 0].tolist() == [[True, True, True], [True, False, True], [True, False, False]]
    assert m[1, 0].tolist() == [[False, True, True], [False, False, True], [False, False, True]]
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 1], [0, 1, 1]]  # padding: meaningless


def test_log_probs_and_entropy_match_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 12, requires_grad=True)  # (B, S, V_pad), real vocab 10
    targets = torch.randint(0, 10, (2, 5))
    lp, ent = vocab_parallel_log_probs(logits, targets, temperature=0.7, vocab_size=10, with_entropy=True)
    ref_logp = torch.log_softmax(logits[..., :10] / 0.7, dim=-1)
    torch.testing.assert_close(lp, ref_logp.gather(-1, targets[..., None]).squeeze(-1))
    torch.testing.assert_close(ent, -(ref_logp.exp() * ref_logp).sum(-1))
    (lp.sum() + ent.sum()).backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref_lp = ref_logp.gather(-1, targets[..., None]).squeeze(-1)
    (ref_lp.sum() - (ref_logp.exp() * ref_logp).sum()).backward()
    torch.testing.assert_close(grad, logits.grad)
    assert grad[..., 10:].abs().sum() == 0  # padding rows get no gradient
    with pytest.raises(ValueError, match="temperature"):
        vocab_parallel_log_probs(logits, targets, temperature=0.0)


def _batches():
    torch.manual_seed(1)
    ids = torch.randint(0, 120, (2, 32))  # (B, S)
    left = torch.ones(2, 32, dtype=torch.long)
    left[0, :7] = 0
    right = torch.ones(2, 32, dtype=torch.long)
    right[1, 20:] = 0
    return {"left": (ids, left), "right": (ids, right)}


@pytest.mark.parametrize("arch", ["llama", "mistral", "phi3", "phi3-partial", "phi3-longrope", "qwen2", "qwen3",
                                  "phi3-partiallongrope", "qwen2-yarn", "qwen3-yarnmscale", "mistral-linear",
                                  "smollm3", "smollm3-yarn", "granite", "gemma3_text", "gemma2", "gemma", "olmo2",
                                  "olmo3", "exaone4", "seed_oss", "glm4", "ernie4_5", "arcee", "glm4_moe",
                                  "deepseek_v3", "deepseek_v3-moonlight", "deepseek_v2", "glm4_moe_lite", "gpt_oss",
                                  "minimax_m2", "ernie4_5_moe", "apertus", "qwen3_5_text", "qwen3_5",
                                  "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next", "qwen3_next-mlponly",
                                  "qwen3_moe-mlponly", "olmoe", "flex_olmo", "hunyuan_v1_dense",
                                  "hunyuan_v1_moe", "granitemoe", "granitemoeshared", "granitemoehybrid",
                                  "granitemoehybrid-moe", "granitemoehybrid-h", "granitemoehybrid-hmoe", "nemotron_h", "nemotron_h-moe", "falcon_h1", "falcon_h1-nonorm", "lfm2", "lfm2-idxs", "lfm2_moe", "exaone", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe", "sarvam_mla", "jais2", "mellum", "hyperclovax", "iquestcoder", "internlm3", "youtu", "mimo", "nanochat", "vaultgemma", "dots1", "solar_open", "gemma4_text", "gemma4_text-kv", "gemma4_text-moe", "gemma4_text-ple", "glm",
                                  "helium", "stablelm",
                                  "starcoder2", "starcoder2-window", "nemotron", "nemotron-bias", "cohere", "cohere2", "phi",
                                  "gpt_neox", "gpt_neox-seq", "falcon", "falcon-40b", "falcon-11b", "falcon-seq",
                                  "olmo", "olmo-clip"])
def test_logits_and_log_probs_match_transformers(arch, tmp_path, gloo_world1):
    """phi3: q/k/v and gate/up read as row ranges of its fused tensors; phi3-partial: half of each
    head rotated (partial_rotary_factor 0.5 = megatron's rotary_percent); phi3-longrope: LongRoPE's
    short factors and attention factor (sqrt(1 + ln 4 / ln 32)) at the original length, 32;
    phi3-partiallongrope (Phi-4-mini): the same on half of each head, the attention factor on the
    rotation (rope_mscale); qwen2-yarn / qwen3-yarnmscale: YaRN's blended frequencies and attention
    factor (0.1 ln 4 + 1; DeepSeek's mscale ratio, other betas, no truncation); mistral-linear:
    positions divided by 3; smollm3: no RoPE in every second layer (megatron-core 0.12: a hook on
    those layers' attention; 0.16: its own no_rope_freq); granite: its four multipliers; gemma3: (1 + w)
    norms before and after attention and MLP, GeGLU, embeddings x sqrt(64), a 12-position window and
    theta 1e4 in the sliding layer, linear rope x 2 at theta 1e5 in the full one (models/gemma.py);
    gemma2: the same norms and MLP, its first layer sliding, scores and logits soft-capped; vaultgemma: that without
    the norms after attention and MLP; nanochat: weightless RMSNorms (the embeddings' too), RoPE by minus the angle,
    relu(x)^2 without a gate; gemma
    (Gemma 1): the (1 + w) pre-norms, embedding scale and GeGLU alone; olmo3: OLMo 2's norms, a
    12-position window in the sliding layer with the default rope, YaRN and its attention factor 1.2
    in the full one only; exaone4: OLMo 2's post norms with per-head q / k norms, RoPE in the sliding
    layer only (window 12), none in the full one; seed_oss: q / k / v biases, head_dim 32
    (transformers in eval mode: its 0.1 dropout off, as ours always is); glm4: RoPE over interleaved
    pairs of half of each head (megatron's rotary_interleaved), norms before and after attention and
    MLP, gate / up read from gate_up_proj; ernie4_5: RoPE over interleaved pairs of the whole head;
    arcee: fc1 is up_proj alone, relu(x)^2 between it and down_proj, YaRN x 4; glm4_moe: a dense first layer
    and an MoE one routed by sigmoid scores plus the checkpoint's expert bias within the best group, the
    weights renormalised and x 1.5, a shared expert, partial rotary on Llama's pairs; deepseek_v3: multi-latent
    attention (low-rank query and key / value, RoPE over interleaved pairs of a separate part of each head,
    YaRN with mscale 1 / mscale_all_dim 0.8: cos / sin and the scores scaled apart) on GLM-4.5's MoE layout;
    deepseek_v3-moonlight: one full-rank query projection, plain RoPE; gpt_oss: attention sinks, biases on the
    attention, the router and the experts (read from its stacked, interleaved expert tensors), the clamped
    SwiGLU, sliding and full layers, YaRN without rounding (models/gpt_oss.py); minimax_m2: OLMo 2's q / k norms
    across all heads (GQA) under pre-norms, RoPE on the first rotary_dim of each head, sigmoid routing with the
    expert bias read from beside the router under Mixtral's expert names; glm4_moe_lite: GLM-4.7-Flash, DeepSeek-V3's
    layout under its own model type (values wider than the query / key heads' nope part); ernie4_5_moe: ERNIE 4.5
    MoE, a dense first layer, then softmax routing whose top-2 is chosen by the probabilities + the checkpoint's
    expert bias (read from its (1, E) moe_statics tensor; models/moe_replay.install_softmax_bias), a shared expert;
    apertus: an MLP without a gate and xIELU between up_proj and down_proj, its per-layer scalars read from the
    checkpoint (models/xielu.py), per-head q / k norms, llama3 rope x 8, its norms under their own names;
    qwen3_5_text: Qwen3.5's Gated DeltaNet layer (models/gated_delta_net.py, left padding included) and its
    output-gated attention (models/qwen3_5.py) with (1 + w) norms and RoPE on a quarter of each head;
    qwen3_5: the same text model read from Qwen3.5's image-text checkpoint (M-RoPE on text = RoPE); qwen3_5_moe_text /
    qwen3_5_moe: Qwen3.5-MoE, those layers with Qwen2-MoE's experts (renormalised top-2, a gated shared expert);
    qwen3_next: Qwen3-Next, Qwen3.5-MoE's layers with the DeltaNet projections read from in_proj_qkvz / in_proj_ba
    (fused per key head); qwen3_next-mlponly: its second layer dense (mlp_only_layers), the top-2 not renormalised;
    qwen3_moe-mlponly: Qwen3-MoE's second layer dense by the same key; olmoe: q / k norms across heads (GQA)
    under pre-norms with Qwen2-MoE's experts intermediate_size wide, top-k not renormalised; flex_olmo: those
    under OLMo 2's post norms only; hunyuan_v1_dense: per-head q / k norms after RoPE (left padding exact: each
    row turned to its position ids), its NTK alpha RoPE; granitemoe: Granite's four scalars with Mixtral's routing over
    experts read from their stacked block_sparse_moe.input_linear / output_linear; granitemoeshared: a shared MLP
    without a gate beside them, gate / up read from shared_mlp.input_linear; granitemoehybrid: Granite 4.0's dense
    model (its shared_mlp the only MLP); granitemoehybrid-moe: with experts beside it; granitemoehybrid-h: Granite
    4.0-H, a Mamba-2 layer (models/mamba2.py: one group, a 32-token row over two scan chunks, left padding included)
    and an attention layer without RoPE; granitemoehybrid-hmoe: two groups, experts beside the shared MLP; glm: GLM-4 (glm-4-9b-hf), glm4's
    interleaved partial RoPE, q / k / v biases and gate_up_proj without the post norms; helium: Helium-1, RoPE on
    interleaved pairs of the whole head; stablelm: StableLM 2, LayerNorms with biases (megatron's LayerNorm), q / k / v
    biases, RoPE on a quarter of each head; starcoder2: StarCoder2, LayerNorms, biases on every linear layer, an MLP
    without a gate (gelu with the tanh approximation: openai_gelu), its 0.1 dropouts in config.json not taken;
    starcoder2-window: its every-layer sliding window (12); nemotron: Nemotron, LayerNorm1P (1 + w, with its bias:
    apply_layernorm_1p), RoPE on half of each head, relu(up)^2 without a gate; nemotron-bias: with biases on q / k /
    v / o and up / down; cohere: Command R, x + attn(ln x) + mlp(ln x) (parallel_residual) with weight-only LayerNorms,
    RoPE on interleaved pairs, logits x 0.25; cohere2: Command R7B, that layer with a sliding first layer (RoPE, 12
    positions) and a full second one without RoPE; phi: Phi-2, that layer with LayerNorm biases, biases on every
    linear layer and on lm_head (add_output_layer_bias), a tanh-GELU MLP without a gate, RoPE on 0.4 of each head;
    gpt_neox: Pythia, multi-head attention with q / k / v per head in query_key_value, x + attn(ln1 x) + mlp(ln2 x)
    (parallel_residual_mlp_norm), biases everywhere, exact GELU, RoPE on a quarter of each head, its own tensor names;
    gpt_neox-seq: its sequential layer (use_parallel_residual false) with gelu_fast; nemotron_h: Nemotron-H, one block
    per layer (Mamba-2 with two groups, an MLP without a gate, attention without RoPE, an MLP: models/hybrid_pattern.py),
    its tensors under backbone.* / mixer.* and each layer's one norm read by its block; nemotron_h-moe: its second
    layer an MoE one (experts and a shared expert without a gate, DeepSeek-V3's routing with groups); falcon_h1:
    Falcon-H1, attention and Mamba-2 side by side in every layer (models/parallel_hybrid.py) with every muP multiplier
    its own, the mixer's inner width its own (mamba_d_ssm); falcon_h1-nonorm: without the mixer's gated norm, one group,
    tied; lfm2: LFM2, a short convolution (models/short_conv.py, left padding included) and attention with per-head
    q / k norms, its MLP width adjusted from config.json; lfm2-idxs: its older full_attn_idxs, a width multiplier,
    untied; lfm2_moe: LFM2-MoE, a dense first layer, then experts routed by sigmoid score + the expert bias, x 1.5;
    exaone: EXAONE 3.5, Llama with llama3 rope scaling under its own names (transformer.h.*, attn.attention.*);
    exaone_moe: EXAONE MoE, EXAONE 4.0's sliding / NoPE attention under pre-norms with DeepSeek-V3's routing;
    hyperclovax: HyperCLOVA X, Granite's scalars with Peri-LN norms on each attention / MLP output; iquestcoder:
    IQuest-Coder, Llama with head_dim 32 under its own model_type; internlm3: InternLM3, that with dynamic NTK RoPE
    (factor 6: the default RoPE within max_position_embeddings); youtu: Youtu-LLM, DeepSeek-V3's multi-latent
    attention with a dense SwiGLU MLP in every layer, tied; mimo: MiMo-7B, a Qwen2 whose checkpoint also holds a
    multi-token-prediction layer (model.mtp_layers.0.*, not read); hy_v3: Hy3, per-head q / k norms and DeepSeek-V3's
    routing without groups under the release's names (mlp.router.gate, mlp.expert_bias, mlp.shared_mlp); gemma4_text:
    Gemma 4, sliding layers (4 key / value heads of 16) and full ones (2 of 32, their values the keys, proportional RoPE on
    a quarter of the pairs) in one model, value norms, unscaled scores, each layer's scalar (models/gemma4.py);
    gemma4_text-kv: the full layers with values of their own; gemma4_text-moe: Gemma 4 26B-A4B's layer, a dense MLP and
    experts side by side (models/gemma4.Gemma4MoE); gemma4: that text model read from Gemma 4's image-text checkpoint."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    hf = make_tiny_hf(arch.split("-")[0], str(tmp_path), **HF_VARIANTS.get(arch, {}))
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    if arch == "phi3-longrope":
        assert args["max_position_embeddings"] == 32 and model.config.softmax_scale == pytest.approx(1.4 / 16 ** 0.5)
    if arch == "phi3-partiallongrope":  # cos / sin of the rotated half scaled, the scores' scale untouched
        assert model.config.rope_mscale == pytest.approx(1.4 ** 0.5) and model.config.softmax_scale is None
    if arch == "qwen2-yarn":
        assert model.config.softmax_scale == pytest.approx((0.1 * math.log(4) + 1) ** 2 / 16 ** 0.5)
    if arch.endswith("-mlponly"):  # the second layer a dense MLP, as transformers built it
        assert args["moe_layer_freq"] == [1, 0] and not hasattr(hf.model.layers[1].mlp, "experts")
    if arch.startswith("nemotron") and not arch.startswith("nemotron_h"):  # LayerNorm1P everywhere, final norm too
        assert {type(m).__name__ for m in (model.decoder.final_layernorm, model.decoder.layers[1].pre_mlp_layernorm)} == \
            {"OffsetLayerNorm"}
    if arch.startswith("nemotron_h"):  # one block per layer: Mamba-2, MLP (-moe: MoE), attention, MLP; the other half
        # IdentityOp
        kinds = [(type(layer.self_attention).__name__, type(layer.mlp).__name__) for layer in model.decoder.layers]
        assert kinds == [("Mamba2Mixer", "IdentityOp"), ("IdentityOp", "MoELayer" if arch.endswith("moe") else "MLP"),
                         ("SelfAttention", "IdentityOp"), ("IdentityOp", "MLP")]
    if arch.startswith("falcon_h1"):  # attention with Mamba-2 beside it in every layer
        assert {type(layer.self_attention).__name__ for layer in model.decoder.layers} == {"ParallelHybridAttention"}
        assert (model.decoder.layers[0].self_attention.mamba.ssm_norm is None) == arch.endswith("nonorm")
    if arch == "lfm2_moe":  # a conv layer with a dense MLP, attention and a conv layer with experts
        kinds = [(type(layer.self_attention).__name__, type(layer.mlp).__name__) for layer in model.decoder.layers]
        assert kinds == [("ShortConv", "MLP"), ("SelfAttention", "MoELayer"), ("ShortConv", "MoELayer"),
                         ("SelfAttention", "MoELayer")]
    elif arch.startswith("lfm2"):  # a short convolution in the conv layers, attention in the others
        kinds = [type(layer.self_attention).__name__ for layer in model.decoder.layers]
        assert kinds == ["ShortConv", "SelfAttention"] and args["ffn_hidden_size"] == (192 if arch.endswith("idxs") else 128)
    if arch == "arcee":  # no gate: fc1 as wide as the MLP
        assert model.decoder.layers[0].mlp.linear_fc1.weight.shape[0] == args["ffn_hidden_size"]
    if arch == "olmo3":  # the attention factor on the full layer's rotation; the sliding one's config at 1
        sliding, full = (layer.self_attention for layer in model.decoder.layers)
        assert (model.config.rope_mscale, sliding.config.rope_mscale, full.config.rope_mscale) == (1.2, 1.0, 1.2)
    load_hf_checkpoint(model, str(tmp_path), args)
    if arch == "ernie4_5_moe":  # the bias decides some choices here: without it the logits differ (checked)
        router = model.decoder.layers[1].mlp.router
        assert router.expert_bias.abs().min() > 0 and not router.config.moe_router_enable_expert_bias
    for padding, (ids, mask) in _batches().items():
        pos = position_ids_from_mask(mask)
        with torch.no_grad():
            ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits  # (B, S, 120)
            out = model(ids, pos, attention_mask_4d(mask))  # (B, S, 128)
        real = mask.bool()
        assert (out[..., :120] - ref)[real].abs().max() <= 1e-4, f"{arch} {padding} padding"
        lp, ent = compute_log_probs(model, ids, mask, micro_batch_size=1, temperature=0.7,
                                    vocab_size=120, with_entropy=True)  # (B, S-1)
        ref_lp = torch.log_softmax(ref[:, :-1] / 0.7, dim=-1)
        both = real[:, 1:] & real[:, :-1]
        torch.testing.assert_close(lp[both], ref_lp.gather(-1, ids[:, 1:, None]).squeeze(-1)[both], atol=1e-4, rtol=0)
        torch.testing.assert_close(ent[both], -(ref_lp.exp() * ref_lp).sum(-1)[both], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["mistral", "phi3"])
def test_sliding_window_is_exact_past_the_window(arch, tmp_path, gloo_world1):
    """A 12-position window on 32 tokens (Mistral 7B v0.1, Phi-3-mini-4k): the windowed scores are
    masked in every layer (models/sliding_window.py), so logits and log-probs equal transformers' on
    every position, with left and right padding, and without a mask; full attention would differ
    past 12 (checked)."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    hf = make_tiny_hf(arch, str(tmp_path), sliding_window=12)
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    assert (args["max_position_embeddings"], args["sliding_window"]) == (128, 12)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path), args)
    full = build_gpt_model(dict(args, sliding_window=None)).eval()
    full.load_state_dict(model.state_dict())
    for padding, (ids, mask) in _batches().items():
        pos = position_ids_from_mask(mask)
        real = mask.bool()
        with torch.no_grad():
            ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            out = model(ids, pos, attention_mask_4d(mask))[..., :120]
            unwindowed = full(ids, pos, attention_mask_4d(mask))[..., :120]
        assert (out - ref)[real].abs().max() <= 1e-4, padding
        assert (unwindowed - ref)[real].abs().max() > 1e-2, padding  # the window bites past 12 positions
        lp, _ = compute_log_probs(model, ids, mask, micro_batch_size=2, temperature=1.0, vocab_size=120)
        ref_lp = torch.log_softmax(ref[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        both = real[:, 1:] & real[:, :-1]
        torch.testing.assert_close(lp[both], ref_lp[both], atol=1e-4, rtol=0)
    ids = _batches()["left"][0]
    with torch.no_grad():  # no padding: no mask at all (SDPA's causal flag before), the window still applies
        ref = hf(input_ids=ids).logits
        out = model(ids, position_ids_from_mask(torch.ones_like(ids)), None)[..., :120]
    assert (out - ref).abs().max() <= 1e-4


def _text_logits_match(hf, model, tokens: range, hf_positions: bool = True) -> None:
    """A left-padded batch of text (token ids in `tokens`: below an image-text model's image / video tokens) gives the
    image-text model's logits within 1e-4 (hf_positions false: the HF model computes its own positions from the mask,
    as Qwen-VL's M-RoPE does)."""
    torch.manual_seed(1)
    ids = torch.randint(tokens.start, tokens.stop, (2, 32))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    pos = position_ids_from_mask(mask)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, **({"position_ids": pos} if hf_positions else {})).logits
        out = model(ids, pos, attention_mask_4d(mask))
    assert (out[..., :120] - ref)[mask.bool()].abs().max() <= 1e-4


@pytest.mark.parametrize("arch, prefix", [(a, p) for a in ("gemma3", "mistral3")
                                          for p in ("language_model.model.", "model.language_model.")]
                         + [("gemma4", "model.language_model.")])
def test_image_text_checkpoint_trains_its_text_model(arch, prefix, tmp_path, gloo_world1):
    """Gemma 3 4B and up (gemma3, Gemma3ForConditionalGeneration), Mistral Small 3.1 (mistral3,
    untied) and Gemma 4 (gemma4, Gemma4ForConditionalGeneration: transformers 5's layout only, its text_config's
    full layers in per_layer_config) are image-text checkpoints: their config.json's sparse text_config, completed with
    transformers' defaults, is the text model's (gemma3_text / mistral), and the language model's
    weights are read under either prefix (transformers 4.x hub files: language_model.model.*,
    language_model.lm_head; 5.x: model.language_model.*, lm_head), the vision tower left unread;
    logits on text equal the image-text model's within 1e-4."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.hf_bridge.checkpoint_io import SafetensorsReader

    text_type = {"gemma3": "gemma3_text", "mistral3": "mistral", "gemma4": "gemma4_text"}[arch]
    tied = arch in ("gemma3", "gemma4")
    hf = make_tiny_hf(arch, str(tmp_path))
    raw = json.loads((tmp_path / "config.json").read_text())
    defaults = AutoConfig.for_model(text_type).to_dict()  # the hub's files list only what differs (gemma-3-4b-it)
    raw["text_config"] = {k: v for k, v in raw["text_config"].items() if defaults.get(k) != v or k == "model_type"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert raw["model_type"] == arch and "rms_norm_eps" not in raw["text_config"]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert any(n.startswith(("vision_tower.", "model.vision_tower.")) for n in tensors)
    assert ("language_model.lm_head.weight" in tensors) == (arch == "mistral3")  # Mistral Small is untied
    if prefix != "language_model.model.":  # transformers 5's own layout
        renamed = {}
        for n, t in tensors.items():
            if n.startswith("language_model.model."):
                n = "model.language_model." + n[len("language_model.model."):]
            elif n.startswith("language_model.lm_head."):
                n = n[len("language_model."):]
            renamed[n] = t
        save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    config = read_hf_config(str(tmp_path))
    assert (config["model_type"], config["num_attention_heads"]) == (text_type, 4)
    assert config["tie_word_embeddings"] == tied
    if tied:
        assert SafetensorsReader(str(tmp_path)).stored("model.layers.1.post_attention_layernorm.weight") == \
            prefix + "layers.1.pre_feedforward_layernorm.weight"
    args = dict(model_config_from_hf(raw), padded_vocab_size=128)
    assert args == dict(model_config_from_hf(config), padded_vocab_size=128)
    assert args["untie_embeddings_and_output_weights"] == (arch == "mistral3")
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path), args)
    _text_logits_match(hf, model, range(0, 117))  # below the image tokens


def test_lfm2_vl_checkpoint_trains_its_text_model(tmp_path, gloo_world1):
    """LFM2-VL (lfm2_vl: model.language_model.*, model.vision_tower.*, tied) trains its LFM2 text model: the text
    model's config.json and weights read from the image-text checkpoint, the vision tower left unread; logits on
    text equal the image-text model's within 1e-4, with left padding."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    hf = make_tiny_hf("lfm2_vl", str(tmp_path))
    config = read_hf_config(str(tmp_path))
    assert (config["model_type"], config["architectures"], config["tie_word_embeddings"]) == (
        "lfm2", ["Lfm2ForCausalLM"], True)
    args = dict(model_config_from_hf(config), padded_vocab_size=128)
    assert args["short_conv_layers"] == [1, 0] and not args["untie_embeddings_and_output_weights"]
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path), args)
    _text_logits_match(hf, model, range(3, 119))  # below the image token


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "ministral3"])
def test_vl_and_ministral3_checkpoints_train_their_text_model(arch, tmp_path, gloo_world1):
    """Qwen2.5-VL (qwen2_5_vl; its hub files' layout: model.layers.*, visual.*, lm_head, untied) and
    Qwen3-VL (qwen3_vl: model.language_model.*, model.visual.*, tied, q / k norms, interleaved
    sections) train their text model, a Qwen2 / Qwen3: M-RoPE turns every section by the same
    position on text, so the 1-D RoPE gives the image-text model's logits within 1e-4, with left
    padding (transformers computes its 3-D positions from the mask itself). Ministral 3 (mistral3
    around a ministral3, completed with Ministral 3's defaults: no window) likewise, YaRN included,
    its length limit the 64 positions below which Llama 4's query scaling is 1. Qwen3-VL-MoE
    (qwen3_vl_moe) trains its Qwen3-MoE text model, read from its stacked experts (gate and up as the
    halves of gate_up_proj), stored as transformers 5 saves them and as the releases do (transposed):
    the same logits either way."""
    from safetensors.torch import load_file, save_file

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    hf = make_tiny_hf(arch, str(tmp_path))
    raw = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(str(tmp_path / "model.safetensors"))
    config = read_hf_config(str(tmp_path))
    if arch == "ministral3":
        assert raw["model_type"] == "mistral3" and any(n.startswith("vision_tower.") for n in tensors)
        assert (config["model_type"], config["architectures"], config["sliding_window"]) == \
            ("ministral3", ["Ministral3ForCausalLM"], None)
    else:
        assert raw["model_type"] == arch and "mrope_section" in raw["text_config"]["rope_parameters"]
        assert any("visual." in n for n in tensors)
        text_type = {"qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe"}[arch]
        assert (config["model_type"], config["tie_word_embeddings"]) == (text_type, arch == "qwen3_vl")
        assert "mrope" not in json.dumps(config)
    assert any(n.endswith("lm_head.weight") for n in tensors) == (arch != "qwen3_vl")
    args = dict(model_config_from_hf(config), padded_vocab_size=128)
    assert args["add_qkv_bias"] == (arch == "qwen2_5_vl") and args["qk_layernorm"] == arch.startswith("qwen3_vl")
    if arch == "qwen3_vl_moe":  # the router always renormalises; the experts stacked in the checkpoint
        assert (args["num_experts"], args["moe_ffn_hidden_size"], args["norm_topk_prob"]) == (4, 48, True)
        assert tensors["model.language_model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 96, 64)
    if arch == "ministral3":
        assert (args["max_position_embeddings"], args["rope_scaling_type"], args["rope_scaling_factor"]) == (64, "yarn", 4)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path), args)
    _text_logits_match(hf, model, range(0, 116), hf_positions=False)  # below the image / video / vision marker tokens
    if arch == "qwen3_vl_moe":  # the releases' layout, (E, h, 2f) / (E, f, h): the same weights read
        save_file({n: t.transpose(1, 2).contiguous() if n.endswith(("experts.gate_up_proj", "experts.down_proj")) else t
                   for n, t in tensors.items()}, str(tmp_path / "model.safetensors"))
        again = build_gpt_model(args).eval()
        load_hf_checkpoint(again, str(tmp_path), args)
        for (n, a), b in zip(model.state_dict().items(), again.state_dict().values()):
            assert n.endswith("_extra_state") or torch.equal(a, b), n


@pytest.mark.parametrize("arch", ["olmo2", "olmo3", "gemma3_text"])
def test_norms_round_as_transformers_in_bf16(arch, tmp_path, gloo_world1):
    """In bf16 every norm of the built model (post norms, final norm; OLMo's q / k norms across heads)
    gives transformers' norm's bits. OLMo's RMSNorm multiplies by its weight in fp32 and casts once;
    torch's RMSNorm (OLMo's post and final norms here) does the same on CPU (torch 2.13: checked
    against a cast-first formula, which rounds differently here); Gemma's (1 + w) norm is our own."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    hf = make_tiny_hf(arch, str(tmp_path)).to(torch.bfloat16)
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args, params_dtype=torch.bfloat16).eval()
    load_hf_checkpoint(model, str(tmp_path), args)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16) * 4
    pairs = [(model.decoder.final_layernorm, hf.model.norm)]
    for ours, theirs in zip(model.decoder.layers, hf.model.layers):
        pairs += [(ours.post_self_attn_layernorm, theirs.post_attention_layernorm),
                  (ours.post_mlp_layernorm, theirs.post_feedforward_layernorm)]
    with torch.no_grad():
        for ours, theirs in pairs:
            assert torch.equal(ours(x), theirs(x)), type(ours).__name__
        if arch.startswith("olmo"):
            q = x.reshape(3, 5, 4, 16)  # the whole query's norm over its 4 heads of 16 (one rank)
            ours = model.decoder.layers[0].self_attention.q_layernorm(q).reshape(3, 5, 64)
            assert torch.equal(ours, hf.model.layers[0].self_attn.q_norm(x))
            norm = hf.model.norm
            h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
            assert not torch.equal(h.to(torch.bfloat16) * norm.weight, norm(x))  # cast first: other bits


def test_expert_bias_stays_fp32_in_a_bf16_model(tmp_path, gloo_world1):
    """GLM-4.5's e_score_correction_bias chooses experts: in a bf16 model it stays fp32 and equal to the
    checkpoint's (transformers and megatron keep it fp32; rounded to bf16 it would flip near ties), and
    the placement check accepts it."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.platform.placement import placement_problems

    hf = make_tiny_hf("glm4_moe", str(tmp_path))
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args, torch.bfloat16)
    load_hf_checkpoint(model, str(tmp_path), args)
    bias = model.decoder.layers[1].mlp.router.expert_bias
    assert bias.dtype == torch.float32 and torch.equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias)
    assert model.decoder.layers[1].mlp.router.weight.dtype == torch.bfloat16
    assert placement_problems(model, torch.device("cpu"), torch.bfloat16) == []


def test_kimi_k2_checkpoint_is_read_as_deepseek_v3(tmp_path, gloo_world1):
    """Kimi K2's config.json says model_type kimi_k2 (DeepseekV3ForCausalLM with a remote-code config
    class): the same checkpoint under that model type loads as DeepSeek-V3 (hf_config.SAME_AS: its MLA
    norm q_a_layernorm found, logits equal transformers' DeepSeek-V3), and the config.json handed on to
    vLLM and exports is DeepSeek-V3's, without the auto_map."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    hf = make_tiny_hf("deepseek_v3", str(tmp_path))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), model_type="kimi_k2", auto_map={
        "AutoConfig": "configuration_deepseek.DeepseekV3Config"})))
    config = read_hf_config(str(tmp_path))
    assert config["model_type"] == "deepseek_v3" and "auto_map" not in config
    args = dict(model_config_from_hf(json.loads(path.read_text())), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path), args)
    ids, mask = _batches()["left"]
    pos = position_ids_from_mask(mask)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        out = model(ids, pos, attention_mask_4d(mask))
    assert (out[..., :120] - ref)[mask.bool()].abs().max() <= 1e-4
