"""Where a vLLM decode step goes at small models: the engine as our trainer drives it
(rollout/vllm_engine.py), timed per part, beside the native engine on the same weights.

    OMP_NUM_THREADS=2 .venv-vllm/bin/python bench/vllm_step_profile.py --size 10m            # eager and compiled
    OMP_NUM_THREADS=1 .venv-vllm/bin/python bench/vllm_step_profile.py --size 10m --no-eager  # compiled only

The workload is bench/grpo_step.py's generation: its Qwen2 shape (--size), 2 prompts of 4 tokens x
8 samples, 64 sampled tokens each at T = 1 with log-probs, EOS ignored. vLLM's own methods are
wrapped (class attributes, this process only) with timers that add up wall seconds and the calling
thread's CPU seconds: the CPU column is the work of the Python thread, which a loaded machine does
not inflate the way it inflates wall time (other processes take the cores, OpenMP barriers wait).
With OMP_NUM_THREADS=1 every kernel runs on that thread, so CPU ms are the work itself.

Parts (ms per engine step; an engine step schedules and decodes every running row once):
  schedule / update      the scheduler: pick rows, allocate KV blocks / take the sampled tokens
  input prep             GPUModelRunner._prepare_inputs: positions, slot mapping, attention metadata
  model forward          _model_forward: the decoder layers (compiled: the inductor graph)
  logits + runner rest   execute_model minus the two above (lm_head, bookkeeping)
  sampler + logprobs     sample_tokens: log_softmax over the vocabulary, Gumbel draw, the sampled
                         token's log-prob, lists for the output
  output processor       OutputProcessor.process_outputs: per-row Logprob objects, finished rows
  engine rest            LLMEngine.step minus the parts above
  outside steps          LLM.generate minus its steps: request validation, adding requests
  ours                   VLLMEngine.generate minus LLM.generate: SamplingParams, RolloutOutput
A benchmark, not a test: nothing asserts a time.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS, NEW_TOKENS, PROMPTS = 16, 64, [[1, 2, 11, 3], [4, 5, 11, 6]]  # grpo_step: 2 prompts x 8, 64 tokens
WALL, CPU = collections.defaultdict(float), collections.defaultdict(float)


def timed(name: str, fn):
    """fn with its wall and thread-CPU seconds added to WALL[name] / CPU[name]."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            WALL[name] += time.perf_counter() - w
            CPU[name] += time.thread_time() - c
    return call


def instrument() -> None:
    """Wrap the vLLM 0.32 methods of one in-process decode step (names checked: a missing one raises)."""
    from vllm.entrypoints.llm import LLM
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    for cls, method, name in ((VLLMEngine, "generate", "ours_total"), (LLM, "generate", "llm_generate"),
                              (LLMEngine, "step", "step"), (Scheduler, "schedule", "schedule"),
                              (Scheduler, "update_from_output", "update"),
                              (GPUModelRunner, "execute_model", "execute_model"),
                              (GPUModelRunner, "_prepare_inputs", "input_prep"),
                              (GPUModelRunner, "_model_forward", "model_forward"),
                              (GPUModelRunner, "sample_tokens", "sampler"),
                              (OutputProcessor, "process_outputs", "output_processor")):
        setattr(cls, method, timed(name, getattr(cls, method)))


def parts(d: dict, steps: int) -> dict[str, float]:
    """ms per engine step of each part, from the accumulated seconds."""
    ms = {
        "schedule / update": d["schedule"] + d["update"],
        "input prep": d["input_prep"],
        "model forward": d["model_forward"],
        "logits + runner rest": d["execute_model"] - d["input_prep"] - d["model_forward"],
        "sampler + logprobs": d["sampler"],
        "output processor": d["output_processor"],
    }
    ms["engine rest"] = d["step"] - sum(ms.values())
    ms["outside steps"] = d["llm_generate"] - d["step"]
    ms["ours"] = d["ours_total"] - d["llm_generate"]
    ms["total"] = d["ours_total"]
    return {k: v * 1e3 / steps for k, v in ms.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="10m", help="a bench/grpo_step_workload.py SIZES name")
    p.add_argument("--repeats", type=int, default=5, help="timed generate calls per engine (after 2 warm-ups)")
    p.add_argument("--no-eager", action="store_true", help="only the compiled engine")
    p.add_argument("--no-compile", action="store_true", help="only the eager engine")
    p.add_argument("--no-native", action="store_true", help="skip the native engine's row")
    args = p.parse_args()

    from bench.grpo_step_workload import VOCAB_SIZE, qwen2_config
    from transformers import Qwen2ForCausalLM

    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    torch.manual_seed(0)
    config = qwen2_config(args.size)
    hf = Qwen2ForCausalLM(config).eval()
    sp = SamplingParams(n=ROWS // len(PROMPTS), do_sample=True, temperature=1.0, max_new_tokens=NEW_TOKENS,
                        ignore_eos=True, seed=5)
    print(f"# {args.size}: {sum(t.numel() for t in hf.parameters()) / 1e6:.1f}M params, {ROWS} rows x "
          f"{NEW_TOKENS} sampled tokens, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"torch threads {torch.get_num_threads()}")
    instrument()
    rows, totals, engines = {}, {}, []  # engines stay alive: closing one tears down vLLM's process-wide groups
    modes = [m for m, skip in (("eager", args.no_eager), ("compiled", args.no_compile)) if not skip]
    for mode in modes:
        engine = VLLMEngine(config.to_dict(), vocab_size=VOCAB_SIZE, max_length=128, eos_token_ids=[0],
                            max_num_seqs=ROWS, kv_cache_gb=1, enforce_eager=mode == "eager")
        engines.append(engine)
        engine.update_weights((k, v.detach()) for k, v in hf.state_dict().items())
        for _ in range(2):
            engine.generate(PROMPTS, sp)
        walls = []
        for table in (WALL, CPU):
            table.clear()
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            engine.generate(PROMPTS, sp)
            walls.append(time.perf_counter() - t0)
        steps = args.repeats * NEW_TOKENS  # one prefill step + 63 decode steps per call
        rows[mode] = (parts(WALL, steps), parts(CPU, steps))
        totals[mode] = walls
    if not args.no_native:
        totals["native"] = native_times(hf, config, sp, args.repeats)

    print(f"\n{'part (ms / step)':<22}" + "".join(f"{m + ' wall':>16}{m + ' cpu':>16}" for m in rows))
    for part in next(iter(rows.values()))[0]:
        print(f"{part:<22}" + "".join(f"{w[part]:>16.2f}{c[part]:>16.2f}" for w, c in rows.values()))
    print("\nwhole generate call, s (best, median, all):")
    for mode, walls in totals.items():
        print(f"  {mode:<10}{min(walls):>8.3f}{statistics.median(walls):>8.3f}   "
              + " ".join(f"{t:.3f}" for t in walls))
    print(f"load average {os.getloadavg()[0]:.1f}")
    from mindspeed_rl.distributed.worker_env import destroy_world

    destroy_world()  # the native engine's world; a process group left to the interpreter's exit can abort it


def native_times(hf, config, sp, repeats: int) -> list[float]:
    """The native engine (rollout/native.py) on the same weights and sampling: wall s per call."""
    from bench.rollout_decode import init_world
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import DictReader, load_into_model
    from mindspeed_rl.rollout.native import NativeEngine

    if not torch.distributed.is_initialized():
        init_world()
    margs = model_config_from_hf(config.to_dict())
    init_parallel_state(1, 1, seed=0)
    model = build_gpt_model(margs, params_dtype=torch.float32).eval()
    load_into_model(model, DictReader(hf.state_dict()), margs, 1, 0)
    engine = NativeEngine(model, vocab_size=config.vocab_size, max_length=128)
    for _ in range(2):
        engine.generate(PROMPTS, sp)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.generate(PROMPTS, sp)
        walls.append(time.perf_counter() - t0)
    return walls


if __name__ == "__main__":
    main()
