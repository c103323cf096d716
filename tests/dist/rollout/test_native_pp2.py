"""NativeEngine with pipeline parallelism on gloo processes: PP=2 (TP=1) on 2 processes and
TP=2 x PP=2 on 4 give, token for token, the output of the same model unpipelined (and, greedy,
of transformers generate), on every rank of the replica; rollout log-probs match the pipelined
training forward; a stage whose peer never comes raises a message naming what it waited for."""

import pytest
import torch

from testing_utils import make_tiny_hf, run_gloo

pytestmark = pytest.mark.dist

VOCAB, PADDED = 120, 128
PROMPTS = [[5, 17, 99], [3, 1, 4, 1, 5, 9, 2, 6, 53], [7], [88, 12, 40, 41, 42]]
EOS = tuple(range(6, VOCAB, 12))  # 10 stop ids: sampled rows finish at different steps (compaction)
GREEDY_NEW = 16


def _build(hf_dir, tp, pp):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=PADDED)
    init_parallel_state(tp=tp, pp=pp, seed=1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, hf_dir, args)
    return model


def _outputs(model, with_no_cache=False):
    """Greedy (no stopping, as HF generate with eos None) and seeded sampled output with stop ids,
    chunked (max_batch_size 5 of 8 rows) and compacting as soon as a row finishes."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.forward import compute_log_probs
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    engine = NativeEngine(model, vocab_size=VOCAB, max_length=128, eos_token_ids=EOS, compact_fraction=0.0,
                          max_batch_size=5, comm_timeout_s=60)
    greedy = engine.generate(PROMPTS, SamplingParams(do_sample=False, max_new_tokens=GREEDY_NEW, ignore_eos=True))
    sampled = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.8, top_p=0.9, max_new_tokens=12, seed=3))
    out = dict(greedy=greedy.responses, greedy_lp=greedy.log_probs, sampled=sampled.responses,
               mask=sampled.response_mask, rollout_lp=sampled.log_probs, finish=sampled.finish_reason,
               lengths=sampled.response_length, train_lp=None)
    if with_no_cache:  # megatron's own full forward each step, pipelined the same way
        plain = NativeEngine(model, vocab_size=VOCAB, max_length=128, use_kv_cache=False)
        out["greedy_no_cache"] = plain.generate(PROMPTS, SamplingParams(do_sample=False, max_new_tokens=8)).responses
    batch = sampled.to_batch()
    lp = compute_log_probs(model, batch["input_ids"], batch["attention_mask"], micro_batch_size=4,
                           temperature=0.8, vocab_size=VOCAB)
    if ps.is_pipeline_last_stage():
        out["train_lp"] = lp[0][:, sampled.prompts.shape[1] - 1:]
    else:
        assert lp is None
    return out


def _pp_job(rank, world_size, hf_dirs, tp):
    """Each model unpipelined (TP=tp, PP=1, the rest DP), then pipelined (TP=tp, PP=2)."""
    results = {}
    for arch, hf_dir in hf_dirs.items():
        results[arch] = {"pp1": _outputs(_build(hf_dir, tp, 1)),
                         "pp2": _outputs(_build(hf_dir, tp, 2), with_no_cache=True)}
    return results


def _hf_greedy(hf, max_new_tokens):
    P = max(map(len, PROMPTS))
    ids = torch.zeros(len(PROMPTS), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    return hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                       eos_token_id=None, pad_token_id=0)[:, P:]


def _check(results, hf_models, last_ranks):
    """PP=2 == PP=1 token for token on every rank; greedy == transformers; log-probs == training."""
    stats = {}
    for arch, hf in hf_models.items():
        ref = _hf_greedy(hf, GREEDY_NEW)
        base = results[0][arch]["pp1"]
        assert torch.equal(base["greedy"], ref), arch
        for rank, r in enumerate(results):
            pp1, pp2 = r[arch]["pp1"], r[arch]["pp2"]
            assert torch.equal(pp2["greedy"], ref), f"{arch} rank {rank}: PP=2 greedy != transformers"
            assert torch.equal(pp2["greedy_no_cache"], ref[:, :8]), f"{arch} rank {rank}: no-cache PP=2"
            # sampled: the same tokens, stops and log-probs as the unpipelined model with the same seed
            assert torch.equal(pp2["sampled"], base["sampled"]), f"{arch} rank {rank}: sampled PP=2 != PP=1"
            assert torch.equal(pp2["mask"], base["mask"]) and pp2["finish"] == base["finish"], arch
            assert torch.equal(pp1["sampled"], base["sampled"]), arch  # DP ranks with one seed agree
            for key in ("greedy_lp", "rollout_lp"):  # every rank holds the last stage's values
                assert torch.equal(pp2[key], results[last_ranks[0]][arch]["pp2"][key]), f"{arch} {key} rank {rank}"
            d = (pp2["rollout_lp"] - base["rollout_lp"]).abs().max().item()
            assert d <= 1e-6, f"{arch}: rollout log-probs PP=2 vs PP=1 differ by {d:.2e}"
            stats[f"{arch}/lp_pp2_vs_pp1"] = max(stats.get(f"{arch}/lp_pp2_vs_pp1", 0.0), d)
        assert set(base["finish"]) == {"eos", "length"}, base["finish"]  # both stop paths ran
        for rank in last_ranks:
            m = results[rank][arch]["pp2"]["mask"].bool()
            diff = (results[rank][arch]["pp2"]["rollout_lp"] - results[rank][arch]["pp2"]["train_lp"])[m].abs()
            assert diff.mean() <= 1e-5 and diff.max() <= 1e-4, f"{arch}: mean {diff.mean():.2e} max {diff.max():.2e}"
            stats[f"{arch}/lp_rollout_vs_train_max"] = diff.max().item()
        assert all(results[r][arch]["pp2"]["train_lp"] is None for r in range(len(results)) if r not in last_ranks)
    print(stats)


def test_pp2_matches_pp1_and_transformers(tmp_path):
    hf_models, hf_dirs = {}, {}
    # untied output layer / tied embeddings on the last stage; DeepSeek-V3: each stage's MLA latent cache;
    # Qwen3.5: its Gated DeltaNet layer's state on the first stage, its attention's K / V on the second
    for arch in ("llama", "qwen2", "deepseek_v3", "qwen3_5_text"):
        hf_dirs[arch] = str(tmp_path / arch)
        hf_models[arch] = make_tiny_hf(arch, hf_dirs[arch])
    results = run_gloo(_pp_job, 2, hf_dirs, 1, timeout_s=240)
    _check(results, hf_models, last_ranks=[1])


def test_tp2_pp2_matches_tp2_pp1(tmp_path):
    hf_dir = str(tmp_path / "qwen2")
    hf = make_tiny_hf("qwen2", hf_dir)
    results = run_gloo(_pp_job, 4, {"qwen2": hf_dir}, 2, timeout_s=300)
    # megatron's rank order is tp-cp-ep-dp-pp: ranks 0,1 = stage 0 (TP 0,1), ranks 2,3 = stage 1
    _check(results, {"qwen2": hf}, last_ranks=[2, 3])


def _stalled_peer_job(rank, world_size, hf_dir):
    import time

    model = _build(hf_dir, 1, 2)
    if rank == 0:  # the first stage never generates: stage 1 must give up, not hang
        time.sleep(6)
        return None
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    engine = NativeEngine(model, vocab_size=VOCAB, max_length=128, comm_timeout_s=1.5)
    t0 = time.monotonic()
    try:
        engine.generate(PROMPTS, SamplingParams(do_sample=False, max_new_tokens=4))
    except TimeoutError as err:
        return str(err), time.monotonic() - t0
    return "generate returned", time.monotonic() - t0


def test_stalled_stage_times_out_naming_what_it_waited_for(tmp_path):
    hf_dir = str(tmp_path / "llama")
    make_tiny_hf("llama", hf_dir)
    _, (message, waited) = run_gloo(_stalled_peer_job, 2, hf_dir, timeout_s=120)
    assert "prefill: waiting for the hidden states (9, 4, 64) of pipeline stage 0" in message, message
    assert "pipeline stage 1 of 2" in message and "comm_timeout_s 1.5" in message, message
    assert 1.5 <= waited < 5, waited
