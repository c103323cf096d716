"""Generation inside a Ray actor against the same generation in a plain process (issue 15: in
bench/grpo_step.py our generation is slower than the same engine standalone).

    OMP_NUM_THREADS=2 .venv/bin/python bench/in_ray_decode.py                 # 10m, 4 rounds, ~6 min
    .venv/bin/python bench/in_ray_decode.py --size 50m --rounds 3 --repeats 4
    .venv/bin/python bench/in_ray_decode.py --size tiny --rounds 1 --repeats 1  # smoke run, ~1 min

The trainer's generation in bench/grpo_step.py's workload: the random Qwen2 of --size, 2 prompts x 8
samples, 64 tokens sampled at T = 1 with log-probs, the native engine, fp32 (EOS ignored, so every
call does the same work). Each variant and round gets a fresh process. In it, one warm-up call, then
--repeats timed calls. The variants:
  plain       a child process of this script (no Ray);
  ray         one Ray actor (num_cpus = --threads) in a fresh local Ray instance, set up as the trainer's
              workers are: platform.configure_host_threads gives threads = its CPUs and nice 0;
  ray-nodash  the same, without Ray's dashboard (include_dashboard=False).
Every process runs the same code (`decode_times`), with the same threads and nice 0. Rounds alternate
the order of the variants, so load swings hit every variant. Printed: each process's median call
time, each variant's median over its processes, and the ratio to plain. Nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VARIANTS = ("plain", "ray", "ray-nodash")
PROMPTS = [[8, 11, 4, 12], [3, 11, 6, 12]]  # "7x3=", "2x5=" in grpo_step_workload's tokenizer ids
CHILD_TIMEOUT_S = 900


def decode_times(size: str, repeats: int, threads: int, seed: int = 0) -> dict:
    """Build the workload's model in this process and time `repeats` generate calls after a warm-up."""
    sys.path[:0] = [ROOT, HERE]
    import torch

    from mindspeed_rl.platform import get_platform

    plat = get_platform()
    plat.patch()
    setup = plat.configure_host_threads(threads)  # what init_distributed does in the trainer's workers
    from rollout_decode import init_world

    if not torch.distributed.is_initialized():
        init_world()
    import transformers as tf

    from grpo_step_workload import VOCAB_SIZE, qwen2_config
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import DictReader, load_into_model
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    torch.manual_seed(seed)
    config = qwen2_config(size)
    hf = tf.Qwen2ForCausalLM(config).eval()
    margs = model_config_from_hf(config.to_dict())
    init_parallel_state(1, 1, seed=seed)
    model = build_gpt_model(margs).eval()
    load_into_model(model, DictReader(hf.state_dict()), margs, 1, 0)
    del hf
    engine = NativeEngine(model, vocab_size=VOCAB_SIZE, max_length=config.max_position_embeddings)
    sp = SamplingParams(n=8, do_sample=True, temperature=1.0, max_new_tokens=64, ignore_eos=True, seed=seed)
    engine.generate(PROMPTS, sp)  # warm-up: first-call allocations
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(PROMPTS, sp)
        times.append(time.perf_counter() - t0)
    return {"times": times, "tokens": out.num_response_tokens, "pid": os.getpid(), **setup}


def _child(variant: str, size: str, repeats: int, threads: int) -> dict:
    if variant == "plain":
        return decode_times(size, repeats, threads)
    import ray

    ray.init(address="local", num_cpus=threads, include_dashboard=variant == "ray", dashboard_host="127.0.0.1",
             logging_level="ERROR")
    try:
        actor = ray.remote(num_cpus=threads)(_Runner).options(
            runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}}).remote()
        ref = actor.run.remote(size, repeats, threads)
        ready, _ = ray.wait([ref], timeout=CHILD_TIMEOUT_S - 60)
        if not ready:
            raise TimeoutError(f"in_ray_decode: the {variant} actor's generate calls did not return within "
                               f"{CHILD_TIMEOUT_S - 60} s")
        return ray.get(ref)
    finally:
        ray.shutdown()


class _Runner:
    def run(self, size: str, repeats: int, threads: int) -> dict:
        return decode_times(size, repeats, threads)


def _run_variant(variant: str, args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--size", args.size,
           "--repeats", str(args.repeats), "--threads", str(args.threads)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sys.exit(f"in_ray_decode: the {variant} process did not finish within {CHILD_TIMEOUT_S} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"in_ray_decode: the {variant} process failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="10m", help="a bench/grpo_step_workload.py size: tiny, 10m, 50m")
    p.add_argument("--rounds", type=int, default=4, help="fresh processes per variant (order alternates)")
    p.add_argument("--repeats", type=int, default=6, help="timed generate calls per process")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(args.child, args.size, args.repeats, args.threads)), flush=True)
        from mindspeed_rl.distributed.worker_env import destroy_world

        destroy_world()  # a process group left to the interpreter's exit can abort it
        return
    variants = tuple(args.variants.split(","))
    bad = [v for v in variants if v not in VARIANTS]
    if bad or args.rounds < 1 or args.repeats < 1:
        p.error(f"--variants from {','.join(VARIANTS)} (got {','.join(bad)}); --rounds and --repeats >= 1")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            res = _run_variant(v, args)
            runs[v].append(res)
            print(f"round {r + 1} {v:<11} median {statistics.median(res['times']):.3f} s  "
                  f"calls {' '.join(f'{t:.3f}' for t in res['times'])}  (threads {res['threads']}, nice "
                  f"{res['nice']}, load {os.getloadavg()[0]:.1f})", flush=True)
    base = statistics.median(statistics.median(x["times"]) for x in runs[variants[0]])
    print(f"\n# native engine, {args.size}, 16 rows x 64 sampled tokens, {args.threads} threads, "
          f"{args.rounds} processes per variant x {args.repeats} calls; {time.perf_counter() - t0:.0f} s\n")
    print(f"| variant | median of process medians s | fastest call s | process medians s | / {variants[0]} |")
    print("| --- | --- | --- | --- | --- |")
    for v in variants:
        meds = [statistics.median(x["times"]) for x in runs[v]]
        m = statistics.median(meds)
        print(f"| {v} | {m:.3f} | {min(min(x['times']) for x in runs[v]):.3f} | "
              f"{', '.join(f'{x:.3f}' for x in meds)} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
