"""Logit and log-prob parity with transformers at (TP, PP) in {(1,1), (2,1), (1,2)} on 2 gloo
processes, left and right padding, for tiny random Llama / Qwen2 / Qwen3 (and SmolLM3 with YaRN, a
sliding window, partial LongRoPE); and TP=2 vocab-parallel
log-prob / entropy gradients against full-vocabulary autograd."""

import pytest
import torch

from testing_utils import HF_VARIANTS, make_tiny_hf, run_gloo

pytestmark = pytest.mark.dist

# and per-layer features across the layouts: SmolLM3's NoPE second layer with YaRN's factor on the
# rotation (PP 2 puts the layers on different ranks: global layer numbers), a sliding window, and
# Phi-4-mini-style partial LongRoPE, Granite's multipliers (the embedding's on the first stage, the logits' on the last),
# Gemma 3's sliding and full layers (PP 2: one of each per stage; TP 2: post norms replicated), Gemma 2's
# soft caps (TP 2: each rank caps its heads' scores and its vocabulary shard's logits), OLMo 3's q / k norms
# across heads (TP 2: half the heads per rank, the squares' sum all-reduced) and its YaRN full layer beside
# a sliding one with the default rope (PP 2: one of each per stage), Qwen3.5's Gated DeltaNet layer and gated
# attention (TP 2: half the key heads and query groups, with their gates, per rank; PP 2: one of each per stage),
# Qwen3-Next's (TP 2: each rank's key heads read from in_proj_qkvz / in_proj_ba, fused per key head; its experts),
# HunYuan's q / k norms after RoPE (PP 2: the second stage turns each left-padded row to its position ids from the
# position ids it receives too; TP 2: per-head norms whole on each rank), Granite 4.0's dense layout (TP 2: each rank's
# gate / up rows of shared_mlp.input_linear, as wide as shared_intermediate_size), StableLM 2 (LayerNorm biases whole on
# each rank), StarCoder2 (TP 2: each rank's rows of c_fc's bias, c_proj's and o_proj's whole, added once), Cohere 2
# (TP 2: the MLP's normed input from the layer's input on each rank; PP 2: the second stage's layer hooks), Phi-2
# (TP 2: each rank's rows of lm_head's bias, padded to the vocabulary's 128), GPT-NeoX (TP 2: each rank's heads of the
# per-head query_key_value and its bias; the MLP's own norm whole on each rank; PP 2: the second stage's hooks),
# Falcon-40B (TP 2: one key / value group of query_key_value per rank), OLMo (TP 2: each rank's q / k / v clamped by
# the hook on megatron's linear_qkv; no norm parameters at all), Granite 4.0-H (TP 2: half of the Mamba-2 heads per
# rank, B / C whole on both, one norm group over both ranks (-h) or one per rank (-hmoe); PP 2: the Mamba-2 layer
# on the first stage, the attention without RoPE on the second), Falcon-H1 (TP 2: each rank half of the attention
# heads and half of the Mamba-2 heads beside them, one group of B / C each (-nonorm: the one group on both); PP 2:
# one parallel layer per stage, every multiplier on both), LFM2 (TP 2: half of the conv layer's channels and half of
# the attention heads per rank; PP 2: the conv layer on the first stage, the attention on the second), LFM2-MoE (TP 2:
# each rank half of every expert's width; PP 2: the dense layer and the first MoE one on the first stage), Gemma 4 (TP 2:
# each rank 2 of the sliding layer's 4 key / value heads of 16 and 1 of the full layer's 2 of 32 with its query heads,
# the values its keys; PP 2: the sliding layer on the first stage with its own rotary table, the full one on the second)
ARCHS = ("llama", "qwen2", "qwen3", "smollm3-yarn", "mistral-window", "phi3-partiallongrope", "granite", "gemma3_text",
         "gemma2", "olmo3", "qwen3_5_text", "qwen3_next", "hunyuan_v1_dense", "granitemoehybrid", "stablelm",
         "starcoder2-window", "cohere2", "phi", "gpt_neox", "falcon-40b", "olmo-clip", "granitemoehybrid-h",
         "granitemoehybrid-hmoe", "nemotron_h", "falcon_h1", "falcon_h1-nonorm", "lfm2", "lfm2_moe", "gemma4_text")
PARALLEL = ((2, 1), (1, 2))  # TP 1 / PP 1: tests/unit/models/test_forward_logprobs.py
VOCAB, PADDED, SEQ, TEMP = 120, 128, 32, 0.7


def _batches():
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (4, SEQ))  # (B, S)
    left, right = torch.ones(4, SEQ, dtype=torch.long), torch.ones(4, SEQ, dtype=torch.long)
    left[0, :7], left[2, :20] = 0, 0
    right[1, 20:], right[3, 9:] = 0, 0
    return {"left": (ids, left), "right": (ids, right)}


def _parity_job(rank, world_size, dirs):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.forward import compute_log_probs, forward_microbatches
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    results = {}
    for arch, hf_dir in dirs.items():
        args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=PADDED)
        for tp, pp in PARALLEL:
            init_parallel_state(tp, pp)
            model = build_gpt_model(args).eval()
            load_hf_checkpoint(model, hf_dir, args)
            for padding, (ids, mask) in _batches().items():
                logits = forward_microbatches(  # gathered over TP: (b, S, PADDED) per micro-batch
                    model, ids, mask, micro_batch_size=2,
                    post_fn=lambda out, mb: gather_from_tensor_model_parallel_region(out))
                lp = compute_log_probs(model, ids, mask, micro_batch_size=2, temperature=TEMP,
                                       vocab_size=VOCAB, with_entropy=True)
                if ps.is_pipeline_last_stage():
                    results[(arch, tp, pp, padding)] = (torch.cat(logits), *lp)
    results["tp_grad"] = _tp_grad(rank)
    ps.destroy_model_parallel()
    return results


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    dirs, refs = {}, {}
    for arch in ARCHS:
        dirs[arch] = str(tmp_path_factory.mktemp(arch))
        # qwen2 is saved sharded (index + several files) to load through the index path
        hf = make_tiny_hf(arch.split("-")[0], dirs[arch], max_shard_size="100KB" if arch == "qwen2" else None,
                          **HF_VARIANTS.get(arch, {}))
        for padding, (ids, mask) in _batches().items():
            with torch.no_grad():
                from mindspeed_rl.models.forward import position_ids_from_mask

                refs[(arch, padding)] = hf(input_ids=ids, attention_mask=mask,
                                           position_ids=position_ids_from_mask(mask)).logits
    per_rank = run_gloo(_parity_job, 2, dirs, timeout_s=240, name="HF parity job")
    return per_rank, refs


@pytest.mark.parametrize("tp,pp", PARALLEL)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_log_probs_match_transformers(parity, arch, tp, pp):
    per_rank, refs = parity
    for padding, (ids, mask) in _batches().items():
        got = [r[(arch, tp, pp, padding)] for r in per_rank if (arch, tp, pp, padding) in r]
        assert len(got) == (1 if pp == 2 else 2)  # last pipeline stage(s) report
        ref = refs[(arch, padding)]  # (B, S, VOCAB)
        real = mask.bool()
        both = real[:, 1:] & real[:, :-1]
        ref_lp = torch.log_softmax(ref[:, :-1] / TEMP, dim=-1)
        for logits, lp, ent in got:
            diff = (logits[..., :VOCAB] - ref)[real].abs().max().item()
            assert diff <= 1e-4, f"{arch} TP={tp} PP={pp} {padding} padding: max |logit diff| {diff}"
            lp_diff = (lp - ref_lp.gather(-1, ids[:, 1:, None]).squeeze(-1))[both].abs().max().item()
            ent_diff = (ent + (ref_lp.exp() * ref_lp).sum(-1))[both].abs().max().item()
            assert lp_diff <= 1e-4 and ent_diff <= 1e-4, f"{arch} TP={tp} PP={pp} {padding}: {lp_diff}, {ent_diff}"


def _tp_grad(rank):
    """TP=2 vocab-parallel log-probs / entropy and the gradient of this rank's logits shard."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.builder import init_parallel_state
    from mindspeed_rl.models.forward import vocab_parallel_log_probs

    init_parallel_state(tp=2, pp=1)
    torch.manual_seed(0)  # the same full logits on both ranks
    full = torch.randn(3, 5, PADDED)  # (B, S, V_pad)
    targets = torch.randint(0, VOCAB, (3, 5))
    shard = full.chunk(2, dim=-1)[ps.get_tensor_model_parallel_rank()].clone().requires_grad_(True)
    lp, ent = vocab_parallel_log_probs(shard, targets, TEMP, VOCAB, with_entropy=True)
    (lp.sum() + 0.5 * ent.sum()).backward()
    ps.destroy_model_parallel()
    return full, targets, lp.detach(), ent.detach(), shard.grad


def test_tp2_log_prob_and_entropy_gradients(parity):
    for rank, res in enumerate(parity[0]):
        full, targets, lp, ent, grad = res["tp_grad"]
        logits = full.clone().requires_grad_(True)
        ref_logp = torch.log_softmax(logits[..., :VOCAB] / TEMP, dim=-1)
        ref_lp = ref_logp.gather(-1, targets[..., None]).squeeze(-1)
        ref_ent = -(ref_logp.exp() * ref_logp).sum(-1)
        (ref_lp.sum() + 0.5 * ref_ent.sum()).backward()
        torch.testing.assert_close(lp, ref_lp.detach())
        torch.testing.assert_close(ent, ref_ent.detach())
        torch.testing.assert_close(grad, logits.grad.chunk(2, dim=-1)[rank])
