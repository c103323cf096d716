"""NativeEngine at TP=2 on 2 gloo processes: greedy generation equals transformers generate token
for token on tiny Llama, Qwen2, DeepSeek-V3 (multi-latent attention: its latent cache with the up
projection absorbed, each rank its heads; mixed prompt lengths), gpt-oss (each rank its heads' sinks) and
Qwen3.5 (each rank its Gated DeltaNet key heads' conv history and state, its gated attention heads),
both TP ranks return the same seeded
samples, rollout log-probs match the TP=2 training forward. PP: test_native_pp2.py."""

import pytest
import torch

from testing_utils import make_tiny_hf, run_gloo

pytestmark = pytest.mark.dist

VOCAB, PADDED = 120, 128
PROMPTS = [[5, 17, 99], [3, 1, 4, 1, 5, 9, 2, 6, 53], [7], [88, 12, 40, 41, 42]]


def _tp2_job(rank, world_size, hf_dirs):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.forward import compute_log_probs
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    results = {}
    for arch, hf_dir in hf_dirs.items():
        args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=PADDED)
        init_parallel_state(tp=2, pp=1, seed=1, etp=1 if arch == "gpt_oss" else None)  # gpt-oss: experts whole
        model = build_gpt_model(args).eval()
        load_hf_checkpoint(model, hf_dir, args)
        engine = NativeEngine(model, vocab_size=VOCAB, max_length=128)
        greedy = engine.generate(PROMPTS, SamplingParams(do_sample=False, max_new_tokens=16))
        sampled = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.8, top_p=0.9, max_new_tokens=12,
                                                          seed=rank))  # different seeds: rank 0's tokens win
        batch = sampled.to_batch()
        lp, _ = compute_log_probs(model, batch["input_ids"], batch["attention_mask"], micro_batch_size=8,
                                  temperature=0.8, vocab_size=VOCAB)
        train_lp = lp[:, sampled.prompts.shape[1] - 1:]
        results[arch] = dict(greedy=greedy.responses, sampled=sampled.responses, mask=sampled.response_mask,
                             rollout_lp=sampled.log_probs, train_lp=train_lp)
    return results


def test_tp2_greedy_parity_and_rank_agreement(tmp_path):
    hf_models, hf_dirs = {}, {}
    for arch in ("llama", "qwen2", "deepseek_v3", "gpt_oss", "qwen3_5_text", "youtu", "nanochat"):
        hf_dirs[arch] = str(tmp_path / arch)
        hf_models[arch] = make_tiny_hf(arch, hf_dirs[arch])
    r0, r1 = run_gloo(_tp2_job, 2, hf_dirs, timeout_s=120)

    P = max(map(len, PROMPTS))
    ids = torch.zeros(len(PROMPTS), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    for arch, hf in hf_models.items():
        ref = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
                          eos_token_id=None, pad_token_id=0)[:, P:]
        assert torch.equal(r0[arch]["greedy"], ref), arch
        assert torch.equal(r1[arch]["greedy"], ref), arch
        assert torch.equal(r0[arch]["sampled"], r1[arch]["sampled"]), f"{arch}: TP ranks disagree"
        for r in (r0, r1):  # each rank's log-probs are of the tokens actually kept (rank 0's)
            m = r[arch]["mask"].bool()
            diff = (r[arch]["rollout_lp"] - r[arch]["train_lp"])[m].abs()
            assert diff.mean() <= 1e-5 and diff.max() <= 1e-4, f"{arch}: mean {diff.mean():.2e}"
