"""Rollout throughput: the megatron-native engine (rollout/native.py) against transformers
`generate` on the same random weights and the same left-padded batch.

    OMP_NUM_THREADS=2 python bench/rollout_decode.py                  # batch 64, 128 new tokens, ~10M params
    python bench/rollout_decode.py --batch 8 --new-tokens 16 --repeats 1   # smoke run

With --engine vllm a vLLM row follows (run with the .venv-vllm python; its tokens/s are generated
tokens over the whole generate call, prefill included). Prints prefill tokens/s (real prompt tokens / prefill time), decode tokens/s (generated tokens /
decode time), the KV cache's peak size (bf16 on CPU: the native rows' decode matmuls read prepacked
weights; --plain adds the same engines without), and, with --stop-frac, decode time when sequences finish
at different lengths with finished rows compacted out of the cache at once, at 25 %, or never.
EOS is ignored in the throughput rows so both engines generate exactly --new-tokens per sequence.
A benchmark, not a test: nothing asserts a time. Runs on the platform get_platform() picks.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspeed_rl.distributed.worker_env import destroy_world  # noqa: E402
from mindspeed_rl.platform import get_platform  # noqa: E402

PLATFORM = get_platform()
PLATFORM.patch()


def init_world() -> None:
    """A one-process torch.distributed world (megatron needs one); also used by
    bench/moe_routing_replay.py, in_ray_decode.py and vllm_step_profile.py."""
    from mindspeed_rl.distributed.worker_env import init_local_world

    init_local_world(PLATFORM.dist_backend, timeout=datetime.timedelta(seconds=60))


def _hf_model(args, device, dtype):
    import transformers as tf

    config = tf.LlamaConfig(hidden_size=args.hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
                            num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                            vocab_size=args.vocab, max_position_embeddings=1024, tie_word_embeddings=False)
    config._attn_implementation = args.hf_attn
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.05)
            if name.endswith("norm.weight"):
                p.add_(1.0)
    return model.to(device=device, dtype=dtype), config


def _batch(args):
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(args.prompt_len // 2, args.prompt_len + 1, (args.batch,), generator=g)
    return [torch.randint(0, args.vocab, (int(n),), generator=g).tolist() for n in lens]


def _timed(fn):
    PLATFORM.synchronize()
    t0 = time.perf_counter()
    out = fn()
    PLATFORM.synchronize()
    return out, time.perf_counter() - t0


def _vllm_engines(args, config, hf) -> dict:
    """vLLM engines (rollout/vllm_engine.py, in-process) on the same weights: eager, and compiled
    (torch.compile, enforce_eager=False) with --vllm-compile. Weights go in through update_weights,
    the trainer's path (the layer-wise reload), so the compiled row is the trainer's setting too."""
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    engines = {}
    for eager in (True,) + ((False,) if args.vllm_compile else ()):
        engine = VLLMEngine(config.to_dict(), vocab_size=args.vocab, max_length=1024, dtype=args.dtype,
                            max_num_seqs=args.batch, kv_cache_gb=2, enforce_eager=eager)
        engine.update_weights((k, v.detach().cpu()) for k, v in hf.state_dict().items())
        engines["vllm (eager)" if eager else "vllm (compiled)"] = engine
    return engines


def _runs(times: list) -> str:
    """Every repeat's seconds, for the spread on a shared machine."""
    return " ".join(f"{t:.2f}" for t in times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=64, help="longest prompt; lengths vary from half of it")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"])
    p.add_argument("--repeats", type=int, default=2, help="best of N runs per engine")
    p.add_argument("--engine", default="native", choices=["native", "vllm"],
                   help="vllm: add a vLLM row (rollout/vllm_engine.py, in-process; run with the .venv-vllm python)")
    p.add_argument("--vllm-compile", action="store_true", help="also a compiled vLLM row (torch.compile, "
                   "enforce_eager=False; the engine starts in minutes on a busy machine the first time)")
    p.add_argument("--compile", action="store_true", help="also a compiled native row (enforce_eager: false: "
                   "the decode step through torch.compile; it compiles before the timed runs)")
    p.add_argument("--plain", action="store_true", help="also rows whose decode matmuls read the weights as "
                   "they are (bf16 on CPU: not prepacked, platform/packed_linear.py), to measure that lever alone")
    p.add_argument("--sample", action="store_true", help="our engines sample at T = 1 with log-probs (the "
                   "trainer's setting) instead of greedy; transformers stays greedy")
    p.add_argument("--stop-frac", type=float, default=0.01,
                   help="fraction of the vocabulary used as stop ids in the compaction rows (0 = skip them)")
    args = p.parse_args()

    device = PLATFORM.set_device(0)  # first: nccl communicators bind to the current device
    init_world()
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import DictReader, load_into_model
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine
    from mindspeed_rl.rollout.sync_check import probe_batch

    # one device, one dtype for both engines (issue 17: the norms used to stay fp32 on the CPU)
    dtype = getattr(torch, args.dtype)
    hf, config = _hf_model(args, device, dtype)
    margs = model_config_from_hf(config.to_dict())
    init_parallel_state(1, 1, seed=0)
    model = build_gpt_model(margs, params_dtype=dtype, device=device).eval()
    load_into_model(model, DictReader(hf.state_dict()), margs, 1, 0)
    n_params = sum(p.numel() for p in model.parameters())
    prompts = _batch(args)
    P = max(map(len, prompts))
    prompt_tokens = sum(map(len, prompts))
    ids = torch.zeros(args.batch, P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, pr in enumerate(prompts):
        ids[i, P - len(pr):], mask[i, P - len(pr):] = torch.tensor(pr), 1
    ids, mask = ids.to(device), mask.to(device)
    new_tokens = args.batch * args.new_tokens

    print(f"# {PLATFORM.name}, torch threads {torch.get_num_threads()}, {n_params / 1e6:.1f}M params, "
          f"{args.dtype}, batch {args.batch}, prompts {min(map(len, prompts))}-{P} tokens, "
          f"{args.new_tokens} new tokens, HF attention {args.hf_attn}")

    # ---- transformers: prefill = one forward with use_cache; decode = generate minus that
    def hf_prefill():
        with torch.no_grad():
            return hf(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                      use_cache=True)

    def hf_generate():
        with torch.no_grad():
            return hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=args.new_tokens,
                               min_new_tokens=args.new_tokens, eos_token_id=None, pad_token_id=0)

    engine = NativeEngine(model, vocab_size=args.vocab, max_length=1024)
    sp = SamplingParams(do_sample=False, max_new_tokens=args.new_tokens, ignore_eos=True)
    # --sample: the trainer's setting (T = 1 with log-probs) for our engines; transformers stays greedy
    ours_sp = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=args.new_tokens, ignore_eos=True,
                             seed=3) if args.sample else sp
    vllm = _vllm_engines(args, config, hf) if args.engine == "vllm" else {}
    compiled = NativeEngine(model, vocab_size=args.vocab, max_length=1024, compile_decode=True) if args.compile else None
    # --plain: the same engines with their decode matmuls on the weights as they are (not prepacked)
    plain = {}
    if args.plain:
        for label, eng in (("native, plain matmuls", engine), ("compiled, plain matmuls", compiled)):
            if eng is not None and eng.packs_weights:
                plain[label] = NativeEngine(model, vocab_size=args.vocab, max_length=1024,
                                            compile_decode=eng.compiled)
                plain[label].packs_weights = False
    hf_prefill(), hf_generate(), engine.generate(prompts, ours_sp)  # warm-up (first-call allocations)
    compile_s = _timed(lambda: compiled.generate(prompts, ours_sp))[1] if compiled else 0.0  # compiles
    for e in plain.values():
        e.generate(prompts, ours_sp)
    plain_s = {k: [] for k in plain}
    for e in vllm.values():
        e.generate(prompts, ours_sp)
    # interleaved repeats, best of each: the CPU may be shared, so load swings hit every engine
    hf_pre, hf_gen, pre, dec, vllm_s = [], [], [], [], {k: [] for k in vllm}
    cpre, cdec = [], []
    for _ in range(args.repeats):
        hf_pre.append(_timed(hf_prefill)[1])
        hf_gen.append(_timed(hf_generate)[1])
        out = engine.generate(prompts, ours_sp)
        pre.append(out.stats["rollout/prefill_s"])
        dec.append(out.stats["rollout/decode_s"])
        if compiled:
            cout = compiled.generate(prompts, ours_sp)
            cpre.append(cout.stats["rollout/prefill_s"])
            cdec.append(cout.stats["rollout/decode_s"])
        for k, e in plain.items():
            r = e.generate(prompts, ours_sp)
            plain_s[k].append((r.stats["rollout/prefill_s"], r.stats["rollout/decode_s"]))
        for k, e in vllm.items():
            vllm_s[k].append(_timed(lambda: e.generate(prompts, ours_sp))[1])
    spread = {"native (megatron)": [p + d for p, d in zip(pre, dec)], **vllm_s}
    hf_pre, hf_gen, pre, dec = min(hf_pre), min(hf_gen), min(pre), min(dec)
    hf_dec = hf_gen - hf_pre
    hf_cache = 2 * args.layers * args.batch * args.kv_heads * (P + args.new_tokens) * (args.hidden // args.heads) \
        * torch.finfo(dtype).bits // 8
    same = torch.equal(out.responses.to(device), hf_generate()[:, P:]) \
        if args.dtype == "float32" and not args.sample else None

    print(f"{'engine':<22}{'prefill tok/s':>14}{'decode tok/s':>14}{'total s':>9}{'KV cache MiB':>14}{'total s, all runs':>22}")
    print(f"{'transformers generate':<22}{prompt_tokens / hf_pre:>14.0f}{new_tokens / hf_dec:>14.0f}"
          f"{hf_gen:>9.2f}{hf_cache / 2**20:>14.1f}")
    print(f"{'native (megatron)':<22}{prompt_tokens / pre:>14.0f}{new_tokens / dec:>14.0f}"
          f"{pre + dec:>9.2f}{engine.kv_cache_bytes / 2**20:>14.1f}{_runs(spread['native (megatron)']):>22}")
    if compiled:
        print(f"{'native, compiled':<22}{prompt_tokens / min(cpre):>14.0f}{new_tokens / min(cdec):>14.0f}"
              f"{min(cpre) + min(cdec):>9.2f}{compiled.kv_cache_bytes / 2**20:>14.1f}"
              f"{_runs([p + d for p, d in zip(cpre, cdec)]):>22}   first call (compiles) {compile_s:.1f} s; "
              f"decode eager/compiled {dec / min(cdec):.2f}x")
        if not args.sample:
            print(f"  native, compiled: greedy tokens identical to eager native: "
                  f"{torch.equal(cout.responses, out.responses)}")
    packed = {"native (megatron)": (out, dec), "native, compiled": (cout if compiled else None, min(cdec or [0]))}
    for k, runs in plain_s.items():
        ppre, pdec = min(r[0] for r in runs), min(r[1] for r in runs)
        twin, twin_dec = packed["native, compiled" if k.startswith("compiled") else "native (megatron)"]
        print(f"{k:<22}{prompt_tokens / ppre:>14.0f}{new_tokens / pdec:>14.0f}{ppre + pdec:>9.2f}{'':>14}"
              f"{_runs([a + b for a, b in runs]):>22}   decode plain/packed {pdec / twin_dec:.2f}x "
              f"(packing {twin.stats['rollout/pack_s']:.3f} s, {twin.stats['rollout/packed_weights_gb'] * 1024:.0f} MiB)")
    # vLLM interleaves prefill and decode in its scheduler: total time only; its tokens/s column is
    # generated tokens over the whole call, prefill included
    for k, e in vllm.items():
        best = min(vllm_s[k])
        print(f"{k:<22}{'-':>14}{new_tokens / best:>14.0f}{best:>9.2f}{'(paged)':>14}{_runs(vllm_s[k]):>22}"
              f"   start {e.start_s:.1f} s; native/vLLM total {(pre + dec) / best:.2f}x")
        # the trainer's per-step extras with vLLM: the weight stream and the probe's generation (the
        # check's training forward on 2 x 16 tokens is not timed here)
        sync_s = min(_timed(lambda: e.update_weights((n, v.detach().cpu()) for n, v in hf.state_dict().items()))[1]
                     for _ in range(args.repeats))
        probe_s = min(_timed(lambda: probe_batch(e, args.vocab, True, 1.0, 1024))[1] for _ in range(args.repeats))
        print(f"  {k}: weight sync {sync_s:.3f} s, sync-check probe generation {probe_s:.3f} s (best of "
              f"{args.repeats}) = {(sync_s + probe_s) / best:.0%} of this generation")
        if not args.sample:
            print(f"  {k}: greedy tokens identical to the native engine's: "
                  f"{torch.equal(e.generate(prompts, sp).responses, out.responses.cpu())}")
    print(f"greedy tokens identical to transformers: {same}; memory {PLATFORM.memory_stats()}; "
          f"load average {os.getloadavg()[0]:.1f}")

    # ---- sequences of different lengths: compaction of finished rows
    if args.stop_frac > 0:
        stops = tuple(range(0, args.vocab, max(1, int(1 / args.stop_frac))))
        sp = SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=args.new_tokens,
                            stop_token_ids=stops, seed=3)
        print(f"\n# sampling, {len(stops)} stop ids ({args.stop_frac:.1%} of the vocabulary)")
        print(f"{'compaction':<22}{'decode tok/s':>14}{'decode s':>9}{'mean length':>13}{'steps':>7}")
        modes = (("at once", 0.0), ("at 25 % finished", 0.25), ("never (mask only)", 2.0))
        best = {}
        for _ in range(args.repeats):
            for label, frac in modes:
                engine.compact_fraction = frac
                r = engine.generate(prompts, sp)
                if label not in best or r.stats["rollout/decode_s"] < best[label].stats["rollout/decode_s"]:
                    best[label] = r
        for label, _ in modes:
            r = best[label]
            toks = r.num_response_tokens
            print(f"{label:<22}{toks / r.stats['rollout/decode_s']:>14.0f}{r.stats['rollout/decode_s']:>9.2f}"
                  f"{toks / args.batch:>13.1f}{r.stats['rollout/decode_steps']:>7}")
    destroy_world()  # the native engine's world (vLLM's shutdown destroys its own)


if __name__ == "__main__":
    main()
