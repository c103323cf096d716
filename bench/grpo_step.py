"""One GRPO step, ours (ray_gpt.py) against TRL's GRPOTrainer, phase by phase, on this machine.

    python bench/grpo_step.py                    # tiny, 10m, 50m, 10 steps each (~5 min + ~1 min for TRL's venv once)
    python bench/grpo_step.py --quick            # tiny and 10m, 3 steps (~1.5 min)
    python bench/grpo_step.py --sizes 10m --steps 8 --compare bench/results/grpo_step.json

The same workload on both sides, in one invocation, size by size (the side that goes first
alternates): a random-init Qwen2 saved with transformers (bench/grpo_step_workload.py), the same
character tokenizer, the tiny task's prompts, the same pure-Python reward (bench/grpo_step_reward.py),
fp32 (--dtype bf16: our bf16 model with fp32 main params against TRL's bf16=True, autocast over
fp32 parameters), 8 samples per prompt, 64 new tokens, AdamW (same lr, weight decay, betas, eps; constant lr;
grad clip 1.0), KL k3 with the same beta, clip 0.2/0.2 without dual clip, token-mean loss, one
update per generation (ratio = 1: neither side recomputes old log-probs), threads pinned with
OMP_NUM_THREADS/MKL_NUM_THREADS (and torch.set_num_threads on TRL's side), both at niceness 0
(Ray's workers default to 15: RAY_worker_niceness=0 here). Before any timing is
trusted the script reads back what each side actually runs with and prints the matched settings;
a setting that must match and does not stops the run (exit 1). Two differences are constants in
the code of each side, with no knob: the advantage epsilon (1e-6 vs TRL's 1e-4) and our k3 clamp
(verl's [-10, 10]); neither changes the work done.

Our side runs `ray_gpt.py` as a subprocess on a generated config (colocated actor + reference,
native rollout engine); its phases come from <work-dir>/<size>/ours/metrics.jsonl. TRL runs in its
own venv (bench/_trl_side.py; trl pinned, torch/transformers at our versions). Printed per size:
median step time over steps 2..N (min-max), tokens/s (prompt + response tokens / step time), the
phases, MFU of the update phase and of generation, the first step's mean reward, the machine load.
Step 1 is left out of the timings (first calls allocate and warm up); it is where the rewards of
the two sides are compared, as both start from the same weights. Both read the prompts in file
order (a matched setting), so step k trains on the same prompts on both sides and only the sampling
RNGs differ: expect agreement within sampling noise (about +-0.03 on the parity task); the mean
over all steps is printed beside it.

Legend: gen = generation (ours: the Ray call to the actor, native engine; TRL: `_generate`);
ref = reference log-probs (ours: what is left to wait for after scoring, since they overlap);
old = old log-probs (skipped on-policy by both); update = policy forward + backward + optimizer;
sync = weight sync to the rollout engine (0 on both sides: generation uses the training weights);
other = step minus the phases: for us the advantages (~1 ms) plus driver and Ray time outside the
phase calls; the Ray round trips inside a phase are counted in that phase. MFU = model FLOPs /
phase time / peak, where peak = best `torch.mm` 2048^3 FLOP/s in the run's dtype on the same threads, measured
at the start and end of the run, and model FLOPs are 6 x matmul params x tokens + attention for
the update and 2 x params x tokens + attention for generation (useful tokens only).
With --engine megatron,vllm (run with the .venv-vllm python of .ci/vllm.sh) our side runs twice,
with the native engine and with vLLM (`ours, vLLM`: the weights are streamed into the engine and
checked on the probe every step: `sync` is that, taken out of `gen`), and a `native/vLLM` row
gives the ratios. Results go to --json for later comparison (--compare PREV prints the change). Nothing asserts a
time. The machine is shared: the load columns say how busy it was while each side ran.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform as host
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import _trl_side  # noqa: E402
import grpo_step_workload as wl  # noqa: E402

REWARD_FILE = os.path.join(ROOT, "bench", "grpo_step_reward.py")
ARITH_REWARD_FILE = os.path.join(ROOT, "bench", "grpo_step_reward_arith.py")
TRL_SIDE = os.path.join(ROOT, "bench", "_trl_side.py")
PHASES = ("gen", "reward", "ref", "old_log_prob", "update", "sync", "other")
SIDE = {"megatron": "ours", "vllm": "ours_vllm"}  # our side per rollout engine (--engine)
LABEL = {"ours": "ours", "ours_vllm": "ours, vLLM", "trl": "TRL"}


def workload(args) -> dict:
    """The settings both sides run with. --task arith (the SmolLM2 example's task, --model a chat model)
    takes the example's learning rate and weight decay, its reward, and its prompts through the
    tokenizer's chat template."""
    arith = args.task == "arith"
    return dict(seed=1234, steps=args.steps, prompts_per_step=args.prompts_per_step, n_samples=args.n_samples,
                max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, kl_coef=0.001,
                clip_low=0.2, clip_high=0.2, loss_agg="token-mean", trl_loss_type="dapo", lr=5e-6 if arith else 1e-5,
                weight_decay=0.0 if arith else 0.01, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8, clip_grad=1.0,
                threads=args.threads, vllm_compile=args.vllm_compile, compile=args.compile,
                compile_layers=args.compile_layers, trl_torch_compile=args.trl_torch_compile, rounds=args.rounds, seeds=args.seeds,
                dtype=args.dtype,
                task=args.task, reward_file=ARITH_REWARD_FILE if arith else REWARD_FILE,
                prompt_type="hf" if arith else None, max_prompt_length=128 if arith else 8,
                stochastic_rounding=args.stochastic_rounding, device=args.device,
                micro_batch=args.micro_batch or args.prompts_per_step * args.n_samples)


# ---------------------------------------------------------------------------- machine load
class LoadMonitor:
    """Samples, once a second while one side runs: busy cores of the whole machine (/proc/stat),
    CPU time of the side's process tree, and OMP_NUM_THREADS (environ) and niceness of the side's
    main process and of our Ray workers."""

    def __init__(self, root_pid: int):
        self.root, self.stop_evt = root_pid, threading.Event()
        self.cpu: dict[int, int] = {}
        self.workers: dict[str, dict] = {}  # role -> OMP_NUM_THREADS and niceness of its process
        self.t0, self.stat0, self.load0 = time.perf_counter(), _proc_stat(), os.getloadavg()[0]
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stop_evt.wait(1.0):
            self.sample()

    def sample(self):
        parent, ticks, nice = {}, {}, {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid = int(pid)
            parent[pid], ticks[pid], nice[pid] = int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[16])
        for pid in ticks:
            p = pid
            while p in parent and p != self.root and p > 1:
                p = parent[p]
            if p != self.root:
                continue
            self.cpu[pid] = ticks[pid]
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            role = env.get(b"MINDSPEED_RL_ROLE", b"main" if pid == self.root else b"").decode()
            if role:  # our Ray workers, and the side's main process
                peak = max(_peak_rss_mb(pid), self.workers.get(role, {}).get("peak_rss_mb", 0.0))
                self.workers[role] = {"threads": env.get(b"OMP_NUM_THREADS", b"unset (Ray: 1)").decode(),
                                      "nice": nice[pid], "peak_rss_mb": peak}

    def stop(self) -> dict:
        self.sample()
        self.stop_evt.set()
        wall = time.perf_counter() - self.t0
        busy, total = (a - b for a, b in zip(_proc_stat(), self.stat0))
        ncpu = os.cpu_count() or 1
        own = sum(self.cpu.values()) / os.sysconf("SC_CLK_TCK") / wall
        machine = busy / max(total, 1) * ncpu
        return {"wall_s": round(wall, 1), "machine_busy_cores": round(machine, 2), "own_cores": round(own, 2),
                "others_cores": round(max(machine - own, 0.0), 2), "loadavg_1m": [self.load0, os.getloadavg()[0]],
                "processes": self.workers}


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM) in MB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _proc_stat() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def run_monitored(cmd: list[str], env: dict, log_path: str, timeout: float) -> dict:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        mon = LoadMonitor(proc.pid)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        load = mon.stop()
    if rc != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exited with {rc}; log {log_path}:\n{tail}")
    return load


def thread_env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false"}


# ---------------------------------------------------------------------------- our side
def our_config(size: str, w: dict, d: dict, engine: str = "megatron") -> str:
    """The experiment yaml of ray_gpt.py for one size (model keys in Megatron names, from SIZES)."""
    s = wl.SIZES[size]
    if "dir" in s:  # --model: a real HF directory, architecture from its config.json (no model yaml)
        return _write_config(_our_cfg(None, w, d, engine, size), d, size, engine)
    model = dict(num_layers=s["num_hidden_layers"], hidden_size=s["hidden_size"],
                 ffn_hidden_size=s["intermediate_size"], num_attention_heads=s["num_attention_heads"],
                 group_query_attention=True, num_query_groups=s["num_key_value_heads"],
                 kv_channels=s["hidden_size"] // s["num_attention_heads"], max_position_embeddings=128,
                 make_vocab_size_divisible_by=128, rotary_base=10000, normalization="RMSNorm", norm_epsilon=1e-6,
                 swiglu=True, add_qkv_bias=True, disable_bias_linear=True,
                 untie_embeddings_and_output_weights=False, position_embedding_type="rope")
    return _write_config(_our_cfg(model, w, d, engine, size), d, size, engine)


def _our_cfg(model, w: dict, d: dict, engine: str, size: str) -> dict:
    seqs = w["prompts_per_step"] * w["n_samples"]
    named = {"model": f"bench_{_slug(size)}"} if model else {}
    # no_shuffle: both sides read the prompts in file order, so step k trains on the same prompts on
    # both (the reward curves are then paired: only the samples differ)
    actor = dict(**named, load=d["model"], data_path=d["prompts"], max_prompt_length=w["max_prompt_length"],
                 no_shuffle=True,
                 **({"prompt_type": w["prompt_type"]} if w.get("prompt_type") else {}),
                 n_samples_per_prompt=w["n_samples"], max_new_tokens=w["max_new_tokens"], do_sample=True,
                 temperature=w["temperature"], top_p=w["top_p"], top_k=w["top_k"], num_samples_per_step=seqs,
                 micro_batch_size=w["micro_batch"], ppo_mini_batch_size=w["prompts_per_step"], ppo_epochs=1,
                 clip_ratio_low=w["clip_low"], clip_ratio_high=w["clip_high"], clip_ratio_c=None,
                 use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=w["kl_coef"],
                 loss_agg_mode=w["loss_agg"], entropy_coeff=0.0, lr=w["lr"], lr_decay_style="constant",
                 lr_warmup_fraction=0.0, weight_decay=w["weight_decay"], adam_beta1=w["adam_beta1"],
                 adam_beta2=w["adam_beta2"], adam_eps=w["adam_eps"], clip_grad=w["clip_grad"],
                 rollout_engine=engine, bf16=_bf16(w),
                 **({"bf16_stochastic_rounding": True} if w.get("stochastic_rounding") else {}),
                 enforce_eager=not (w.get("compile") or (engine == "vllm" and w["vllm_compile"])),
                 **({"use_torch_compile": True} if w.get("compile_layers") else {}))
    cfg = {
        **({"model": {f"bench_{_slug(size)}": model}} if model else {}),
        "training": dict(global_batch_size=w["prompts_per_step"], seq_length=w["max_prompt_length"] + w["max_new_tokens"],
                         train_iters=w["steps"], seed=w["seed"], save_interval=0, test_freq=0, log_interval=1,
                         platform=w.get("device", "cpu"), tokenizer_name_or_path=d["model"],
                         output_dir=d[SIDE[engine]]),
        "actor_rollout_ref": {"actor_rollout": actor,
                              "ref": dict(**named, load=d["model"], micro_batch_size=w["micro_batch"], bf16=_bf16(w),
                                          **({"use_torch_compile": True} if w.get("compile_layers") else {}))},
        "reward": {"verifier": True},
        "algorithm": dict(adv_estimator="group_norm", norm_adv_by_std=True, use_kl_in_reward=False,
                          verifier_function=[f"{w['reward_file']}:compute_score"], verifier_weight=[1.0]),
        "resource_pool": {"actor_rollout": [1], "ref": [], "reward": []},
    }
    return cfg


def _bf16(w: dict) -> bool:
    """--dtype bf16: bf16 parameters and compute on our side (megatron keeps fp32 main params in the
    optimizer), TRL's bf16=True (autocast over its fp32 parameters)."""
    return w.get("dtype", "fp32") == "bf16"


def _slug(size: str) -> str:
    """A size name usable in file and config names (model:SmolLM2 -> model_SmolLM2)."""
    return "".join(c if c.isalnum() else "_" for c in size)


def _write_config(cfg: dict, d: dict, size: str, engine: str) -> str:
    path = os.path.join(d["config_dir"], f"bench_{_slug(size)}_{engine}.yaml")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)  # JSON is YAML
    return path


def run_ours(size: str, w: dict, d: dict, engine: str = "megatron") -> dict:
    out = d[SIDE[engine]]
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: no old metrics or checkpoints to mix in
    our_config(size, w, d, engine)
    metrics = os.path.join(out, "metrics.jsonl")
    cmd = [sys.executable, os.path.join(ROOT, "ray_gpt.py"), "--config-dir", d["config_dir"],
           "--config-name", f"bench_{_slug(size)}_{engine}"]
    # RAY_ADDRESS: never join someone's `ray start` cluster; Ray runs its workers at niceness 15 by
    # default, which on a shared machine hands our compute to everyone else's: same niceness as TRL
    env = {**thread_env(w["threads"]), "RAY_ADDRESS": "local", "RAY_worker_niceness": "0"}
    load = run_monitored(cmd, env, os.path.join(d["root"], f"{SIDE[engine]}.log"), timeout=1800)
    seqs = w["prompts_per_step"] * w["n_samples"]
    steps = []
    with open(metrics, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            t = {p: r.get(f"timing/{p}", 0.0) for p in ("gen", "reward", "ref", "old_log_prob", "adv")}
            sync = r.get("timing/sync_weights", 0.0)  # vLLM: the sync (and its check) runs inside "gen"
            check = r.get("timing/sync_check", 0.0)  # vLLM: the probe check after the sync (driver's time)
            t["gen"] -= sync + check
            update = r["timing/update_actor"]
            step = r["timing/step"]
            if "timing/update_actor_worker" in r:  # the workers timed themselves: Ray is not in the phases
                sync = r.get("timing/sync_weights_worker", sync)
                # on-policy the trainer asks for no old log-probs (driver's old_log_prob ~0); then the
                # worker's compute_log_prob time is the vLLM probe's training forward, already in sync_check
                t.update(gen=r.get("timing/gen_worker", 0.0), ref=r.get("timing/ref_worker", t["ref"]),
                         old_log_prob=r.get("timing/old_log_prob_worker", 0.0) if t["old_log_prob"] > 1e-3 else 0.0)
                update = r["timing/update_actor_worker"]
            sync += check  # the sync column is the weight sync plus its probe check
            steps.append({"step": r["step"], "step_s": step, **{k: v for k, v in t.items() if k != "adv"},
                          "adv": t["adv"], "update": update, "sync": sync, "sync_check": check,
                          "other": step - sum(t.values()) - sync - update,
                          "prompt_len": r["prompt_length/mean"], "response_len": r["response_length/mean"],
                          "tokens": seqs * (r["prompt_length/mean"] + r["response_length/mean"]),
                          "score": r["grpo/score/mean"],
                          # the workers' CPU seconds (all threads) and minor page faults per phase
                          "worker_cpu": {k[len("timing/"):-len("_worker_cpu")]: v for k, v in r.items()
                                         if k.startswith("timing/") and k.endswith("_worker_cpu")},
                          "worker_faults": {k[len("perf/"):-len("_minor_faults")]: v for k, v in r.items()
                                            if k.startswith("perf/") and k.endswith("_minor_faults")}})
    # the trainer saves a checkpoint at the last step (outside the step timings); the benchmark needs none
    shutil.rmtree(os.path.join(out, "checkpoints"), ignore_errors=True)
    return {"steps": steps, "load": load}


def our_settings(size: str, d: dict, processes: dict) -> dict:
    """What our trainer runs with, read from the validated Config and the code's constants."""
    from mindspeed_rl.algorithms.advantages import GROUP_NORM_EPS
    from mindspeed_rl.config import load_config
    from mindspeed_rl.data.prompt_dataset import build_prompt_dataset
    from mindspeed_rl.data.tokenizer import load_tokenizer
    from mindspeed_rl.platform import get_platform, params_dtype
    from mindspeed_rl.platform.base import fused_adamw
    from mindspeed_rl.data.tokenizer import eos_token_ids

    with open(d["workload"], encoding="utf-8") as f:  # the platform our side ran on (--device)
        get_platform(json.load(f).get("device", "cpu")).patch()
    import megatron.core.optimizer as megatron_optimizer

    cfg = load_config(f"bench_{_slug(size)}_megatron", [], d["config_dir"])  # the "ours" side: the native engine
    a, ppo, o, r = cfg.actor, cfg.actor.ppo, cfg.actor.optim, cfg.actor.rollout
    tok = load_tokenizer(d["model"])
    first = build_prompt_dataset(d["prompts"], tok, cfg.data.max_prompt_length,
                                 prompt_type=cfg.data.prompt_type)[0]["prompt_ids"]
    mini_batches = cfg.run.global_batch_size // ppo.ppo_mini_batch_size
    adam = megatron_optimizer.Adam
    return {
        "n_samples": r.n_samples_per_prompt, "max_new_tokens": r.max_new_tokens, "do_sample": r.do_sample,
        "temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
        "kl_coef": ppo.kl_loss_coef if ppo.use_kl_loss else 0.0,
        "kl_estimator": f"{ppo.kl_loss_type} (k3, clamped to [-10, 10] as in verl)",
        "clip_low": ppo.clip_ratio_low, "clip_high": ppo.clip_ratio_high, "dual_clip": ppo.clip_ratio_c,
        "loss_agg": ppo.loss_agg_mode,
        "adv": f"(r - mean_g) / (std_g + {GROUP_NORM_EPS:g}), std unbiased ({cfg.algorithm.adv_estimator}, "
               f"norm_adv_by_std={cfg.algorithm.norm_adv_by_std})",
        "adv_eps": GROUP_NORM_EPS, "ppo_epochs": ppo.ppo_epochs, "updates_per_generation": mini_batches * ppo.ppo_epochs,
        "optimizer": f"{adam.__module__}.{adam.__name__}", "lr": o.lr, "weight_decay": o.weight_decay,
        "betas": [o.adam_beta1, o.adam_beta2], "adam_eps": o.adam_eps, "lr_schedule": o.lr_decay_style,
        "adam_kernel": "fused" if fused_adamw(cfg.run.platform) else "for-loop",  # models/optimizer.use_fused_adam
        "clip_grad": o.clip_grad,
        "compute_dtype": str(params_dtype(a.params_dtype)).replace("torch.", ""),
        # megatron's mixed-precision optimizer steps fp32 main params for bf16/fp16 models (models/optimizer.py)
        "master_dtype": "float32",
        "params": wl.param_counts(size)["total"], "ref_model": ppo.use_kl_loss,
        "threads": sorted({p["threads"] for role, p in processes.items() if role != "main"}),
        "niceness": sorted({p["nice"] for role, p in processes.items() if role != "main"}),
        "prompt_ids": [int(i) for i in first], "eos_ids": eos_token_ids(tok, d["model"]),
        "sequences_per_update": cfg.run.global_batch_size * r.n_samples_per_prompt,
        "prompt_order": "file order" if cfg.data.no_shuffle else "shuffled (our seed)",
        "micro_batch": a.micro_batch_size, "device": cfg.run.platform,
        "bf16_rounding": ("stochastic" if o.bf16_stochastic_rounding else "to nearest") + " (bf16 model params "
                         "from fp32 main params)" if a.params_dtype == "bf16" else "none (fp32)",
        "generation": "eager" if r.enforce_eager else "decode step compiled (torch.compile; enforce_eager: false)",
        "training_forward": ("decoder layers compiled (torch.compile; use_torch_compile: true)" if a.use_torch_compile
                             else "eager (use_torch_compile: false)"),
    }


# ---------------------------------------------------------------------------- TRL's side
def median_step(steps: list[dict]) -> float:
    """The median step time over steps 2..N (all steps when there is only one), as summarize takes it."""
    return statistics.median(s["step_s"] for s in (steps[1:] or steps))


def quietest(runs: list[dict]) -> dict:
    """Of a side's --rounds runs, the one with the lowest median step (a shared machine only ever adds
    time, as best-of-N in bench/rollout_decode.py); every run's median is kept as rounds_step_s."""
    best = min(runs, key=lambda run: median_step(run["steps"]))
    return {**best, "rounds_step_s": [round(median_step(run["steps"]), 4) for run in runs]}


def run_trl(python: str, w: dict, d: dict) -> dict:
    out = os.path.join(d["root"], "trl.json")
    cmd = [python, TRL_SIDE, "--model", d["model"], "--prompts", d["prompts"], "--workload", d["workload"],
           "--out", out, "--scratch", os.path.join(d["root"], "trl_scratch")]
    load = run_monitored(cmd, thread_env(w["threads"]), os.path.join(d["root"], "trl.log"), timeout=1800)
    with open(out, encoding="utf-8") as f:
        result = json.load(f)
    for s in result["steps"]:
        s["sync"] = 0.0
    result["load"] = load
    return result


# ---------------------------------------------------------------------------- checks and numbers
LEGEND = ("phases in s, medians over steps 2..N; ours/TRL below 1x is ours faster for times, above 1x for tok/s "
          "and MFU.\nours: gen / ref / update are the workers' own times (timing/*_worker: the reference runs inside "
          "the actor worker, right after generating); old = old log-probs (skipped on-policy); sync = weight sync "
          "(0: same weights);\nother = step - phases: ours the Ray calls, transfers and driver outside the workers "
          "(timing/outside_workers + advantages), TRL the advantages + Trainer bookkeeping. busy cores = CPU the "
          "side's processes used / the rest of the machine. peak RSS = the largest resident memory per process "
          "(ours: the actor worker, which holds the reference too / the driver; TRL: its one process).")

MUST_MATCH = ("n_samples", "max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "kl_coef", "clip_low",
              "clip_high", "dual_clip", "loss_agg", "ppo_epochs", "updates_per_generation", "optimizer", "lr",
              "weight_decay", "betas", "adam_eps", "adam_kernel", "lr_schedule", "clip_grad", "compute_dtype", "master_dtype", "params",
              "ref_model", "threads", "niceness", "prompt_ids", "eos_ids", "sequences_per_update", "prompt_order", "device",
              "micro_batch")
SHOWN_ONLY = ("kl_estimator", "adv", "bf16_rounding", "generation", "training_forward", "versions", "decay_params", "no_decay_params")


def check_settings(ours: dict, trl: dict) -> tuple[list[dict], list[str]]:
    """Rows of the matched-settings table and the keys that must match but do not."""
    rows, bad = [], []
    for key in MUST_MATCH:
        a, b = ours.get(key), trl.get(key)
        if key == "threads":  # ours: OMP_NUM_THREADS of every worker process; TRL: torch's intra-op threads
            same = a == [str(b)]
        elif isinstance(a, float) or isinstance(b, float):
            same = a is not None and b is not None and abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1)
        else:
            same = a == b
        rows.append({"setting": key, "ours": a, "trl": b, "match": same})
        if not same:
            bad.append(key)
    for key in SHOWN_ONLY:
        if key in ours or key in trl:
            rows.append({"setting": key, "ours": ours.get(key, "-"), "trl": trl.get(key, "-"), "match": None})
    return rows, bad


def summarize(steps: list[dict], size: str, peak: float) -> dict:
    """Medians over steps 2..N (all steps when there is only one) and MFU per phase."""
    use = steps[1:] or steps
    med = lambda key: statistics.median(s[key] for s in use)  # noqa: E731
    flops = [wl.phase_flops(size, s["prompt_len"], s["response_len"], round(s["tokens"] / (s["prompt_len"] +
                            s["response_len"]))) for s in use]
    mfu = lambda phase: statistics.median(f[phase] / max(s[phase], 1e-9) / peak for f, s in zip(flops, use))  # noqa: E731
    return {"steps_used": [s["step"] for s in use], "step_s": med("step_s"),
            "step_min": min(s["step_s"] for s in use), "step_max": max(s["step_s"] for s in use),
            "tokens_per_s": statistics.median(s["tokens"] / s["step_s"] for s in use),
            "tokens_per_step": med("tokens"), "response_len": med("response_len"),
            **{p: med(p) for p in PHASES}, "mfu_update": mfu("update"), "mfu_gen": mfu("gen"),
            "mfu_step": statistics.median((f["update"] + f["ref"] + f["gen"]) / s["step_s"] / peak
                                          for f, s in zip(flops, use)),
            "reward_step1": steps[0].get("score"),
            "reward_mean": statistics.fmean(s["score"] for s in steps if s.get("score") is not None)}


def _fmt(x) -> str:
    """Seconds (or a reward) for the table: 3 decimals below 10, 1 above."""
    if x is None:
        return "-"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _x(ratio) -> str:
    """A ratio for the table, '-' when one side's value was too small (or missing) to divide by: on a
    heavily loaded machine a phase can round to 0 on one side."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def table(results: dict, peak: float) -> str:
    head = ("| size | side | step s, median (min-max) | tok/s | gen | reward | ref | old | update | sync | other "
            "| MFU update | MFU gen | reward @1 | busy cores: side / others | peak RSS MB |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for size, r in results.items():
        p = wl.param_counts(size)["total"] / 1e6
        label = f"{size} ({p:.2f}M)"
        for side in ("ours", "ours_vllm", "trl"):
            if side not in r:
                continue
            s, load = r[side]["summary"], r[side]["load"]
            lines.append(f"| {label} | {LABEL[side]} | {s['step_s']:.3f} ({s['step_min']:.3f}-"
                         f"{s['step_max']:.3f}) | {s['tokens_per_s']:.0f} | "
                         + " | ".join(_fmt(s[ph]) for ph in PHASES)
                         + f" | {_pct(s['mfu_update'])} | {_pct(s['mfu_gen'])} | {_fmt(s['reward_step1'])} | "
                         f"{load['own_cores']:.2f} / {load['others_cores']:.2f} | {_memory(load)} |")
        for key, name in (("ratio", "ours/TRL"), ("ratio_vllm", "native/vLLM")):
            if key not in r:
                continue
            q = r[key]
            lines.append(f"| {label} | {name} | {_x(q.get('step_s'))} (fastest steps {_x(q.get('step_min'))}) | "
                         f"{_x(q.get('tokens_per_s'))} | " + " | ".join(_x(q.get(ph)) for ph in PHASES)
                         + f" | {_x(q.get('mfu_update'))} | {_x(q.get('mfu_gen'))} | | | |")
    return "\n".join(lines)


def _memory(load: dict) -> str:
    """Peak RSS per process of a side: workers first, then the main process (driver / TRL)."""
    procs = load.get("processes", {})
    order = sorted(procs, key=lambda role: role == "main")
    return " / ".join(f"{role} {procs[role].get('peak_rss_mb', 0.0):.0f}" for role in order)


def reward_curves(ours: list[dict], trl: list[dict]) -> dict:
    """Per-step mean reward of both sides over the same steps: mean absolute difference, and that
    relative to TRL's mean reward (the issue's bound: within 4 %)."""
    pairs = [(a["score"], b["score"]) for a, b in zip(ours, trl) if a.get("score") is not None
             and b.get("score") is not None]
    if not pairs:
        return {}
    mae = statistics.fmean(abs(a - b) for a, b in pairs)
    level = statistics.fmean(b for _, b in pairs)
    k = max(1, min(3, len(pairs) // 3))  # the learning: mean reward of the first k steps -> the last k
    ends = {f"{side}_{end}": statistics.fmean(p[i] for p in (pairs[:k] if end == "first" else pairs[-k:]))
            for i, side in enumerate(("ours", "trl")) for end in ("first", "last")}
    return {"steps": len(pairs), "mae": mae, "relative_mae": mae / level if level else None,
            "ours_mean": statistics.fmean(a for a, _ in pairs), "trl_mean": level, "ends_steps": k, **ends,
            # wall time of those steps (the sum of step times: the time to the reward reached)
            "ours_seconds": sum(s.get("step_s", 0.0) for s in ours[:len(pairs)]),
            "trl_seconds": sum(s.get("step_s", 0.0) for s in trl[:len(pairs)])}


def seed_curves(ours_runs: list[dict], trl_runs: list[dict]) -> dict:
    """reward_curves of each side's per-step mean reward over its runs (one per seed), and the
    difference that sampling noise alone would leave between two such means: per step, the standard
    error of each side's mean (stdev over seeds / sqrt(seeds)); two sides that learn alike differ by
    sqrt(2/pi) x sqrt(se_ours^2 + se_trl^2) in expectation (a normal difference's mean absolute value).
    The step times are each side's first run's."""
    def mean_run(runs: list[dict]) -> tuple[list[dict], list[float]]:
        n = min(len(run["steps"]) for run in runs)
        steps, errors = [], []
        for k in range(n):
            scores = [run["steps"][k].get("score") for run in runs]
            if any(x is None for x in scores):
                break
            steps.append({**runs[0]["steps"][k], "score": statistics.fmean(scores)})
            errors.append(statistics.stdev(scores) / math.sqrt(len(scores)) if len(scores) > 1 else 0.0)
        return steps, errors

    ours, ours_se = mean_run(ours_runs)
    trl, trl_se = mean_run(trl_runs)
    c = reward_curves(ours, trl)
    if not c:
        return c
    noise = statistics.fmean(math.sqrt(2 / math.pi) * math.hypot(a, b) for a, b in zip(ours_se, trl_se))
    level = c["trl_mean"]
    per_seed = [reward_curves(a["steps"], b["steps"]).get("relative_mae") for a, b in zip(ours_runs, trl_runs)]
    return {**c, "seeds": min(len(ours_runs), len(trl_runs)), "noise_mae": noise,
            "relative_noise_mae": noise / level if level else None, "relative_mae_per_seed": per_seed}


def scaling_table(points: dict) -> str:
    """Step time against samples per prompt x new tokens (one size), both sides."""
    lines = ["| size | n_samples x new tokens | tokens/step | ours step s | TRL step s | ours/TRL | "
             "ours gen / ref / update | TRL gen / ref / update | ours peak RSS MB |", "|" + " --- |" * 9]
    for (size, point), r in points.items():
        o, t = r.get("ours", {}).get("summary"), r.get("trl", {}).get("summary")
        if not o:
            continue
        ratio = r.get("ratio", {}).get("step_s")
        phases = lambda x: " / ".join(_fmt(x[p]) for p in ("gen", "ref", "update")) if x else "-"  # noqa: E731
        lines.append(f"| {size} | {point} | {o['tokens_per_step']:.0f} | {o['step_s']:.3f} | "
                     f"{t['step_s']:.3f} | {_x(ratio)} | {phases(o)} | {phases(t)} | "
                     f"{_memory(r['ours']['load'])} |" if t else
                     f"| {size} | {point} | {o['tokens_per_step']:.0f} | {o['step_s']:.3f} | - | - | {phases(o)} | - | "
                     f"{_memory(r['ours']['load'])} |")
    return "\n".join(lines)


def ratios(ours: dict, trl: dict) -> dict:
    keys = ("step_s", "step_min", "tokens_per_s", *PHASES, "mfu_update", "mfu_gen", "mfu_step")
    return {k: (ours[k] / trl[k] if trl.get(k) and ours.get(k) and trl[k] > 1e-4 and ours[k] > 1e-4 else None)
            for k in keys}


def compare(prev_path: str, results: dict) -> None:
    with open(prev_path, encoding="utf-8") as f:
        prev = json.load(f)["sizes"]
    print(f"\nchange against {prev_path} (median step s, then / now):")
    for size, r in results.items():
        for side in ("ours", "ours_vllm", "trl"):
            if side in r and side in prev.get(size, {}):
                a, b = prev[size][side]["summary"]["step_s"], r[side]["summary"]["step_s"]
                print(f"  {size:5s} {side:4s} {a:.3f} -> {b:.3f} s ({b / a - 1:+.0%})")


# ---------------------------------------------------------------------------- main
def run_size(i: int, size: str, w: dict, work: str, tok_dir: str, prompts: str, python: str | None,
             engines: tuple = ("megatron",)) -> dict:
    """Both sides on one size (the side that goes first alternates with i); the settings check."""
    root = os.path.join(work, _slug(size) + w.get("point_suffix", ""))
    model_dir = wl.SIZES[size].get("dir") or os.path.join(work, _slug(size), "model")
    d = {"root": root, "model": model_dir, "prompts": prompts, "ours": os.path.join(root, "ours"),
         "ours_vllm": os.path.join(root, "ours_vllm"),
         "config_dir": os.path.join(root, "config"), "workload": os.path.join(root, "workload.json")}
    os.makedirs(d["config_dir"], exist_ok=True)
    with open(d["workload"], "w", encoding="utf-8") as f:  # TRL's side reads the point's workload
        json.dump(w, f, indent=1)
    if "dir" not in wl.SIZES[size] and not os.path.isfile(os.path.join(model_dir, "config.json")):
        wl.build_model(size, d["model"], tok_dir, w["seed"])
    runs = {}
    sides = [SIDE[e] for e in engines] + ["trl"]
    seeds = w.get("seeds", 1)
    rounds = max(w.get("rounds", 1), seeds)  # --seeds N: N runs per side, the k-th sampling with seed + k
    for rnd in range(rounds):  # the side that goes first alternates with the size and with the round
        wr = dict(w, seed=w["seed"] + rnd) if seeds > 1 else w  # the model stays the one built from w["seed"]
        if seeds > 1:
            with open(d["workload"], "w", encoding="utf-8") as f:
                json.dump(wr, f, indent=1)
        for side in (sides if (i + rnd) % 2 == 0 else sides[::-1]):
            if side == "trl" and python is None:
                continue
            what = f", seed {wr['seed']}" if seeds > 1 else f", round {rnd + 1}/{rounds}" if rounds > 1 else ""
            print(f"[{size}] {side}: {w['steps']} steps{what} ...", flush=True)
            engine = {v: k for k, v in SIDE.items()}.get(side)
            runs.setdefault(side, []).append(run_ours(size, wr, d, engine) if engine else run_trl(python, wr, d))
    r = {side: quietest(done) for side, done in runs.items()}
    if "trl" in r and "ours" in r:
        ours_set = our_settings(size, d, r["ours"]["load"]["processes"])
        trl_set = {**r["trl"]["settings"], "niceness": [r["trl"]["load"]["processes"]["main"]["nice"]],
                   "sequences_per_update": w["prompts_per_step"] * w["n_samples"]}
        r["matched"], r["differs"] = check_settings(ours_set, trl_set)
        r["reward_curves"] = (seed_curves(runs["ours"], runs["trl"]) if seeds > 1
                              else reward_curves(r["ours"]["steps"], r["trl"]["steps"]))
    return r


def print_settings(results: dict) -> None:
    """The matched-settings table of the first size in full; for the others only what differs."""
    shown = False
    for size, r in results.items():
        if "matched" not in r:
            continue
        if not shown:
            print(f"\nmatched settings ({size}; read back from each trainer, not from our inputs):")
            for row in r["matched"]:
                mark = {True: "same", False: "DIFFERS", None: "info"}[row["match"]]
                print(f"  {row['setting']:22s} {mark:8s} ours={row['ours']}  TRL={row['trl']}")
            shown = True
        else:
            same = sum(1 for row in r["matched"] if row["match"])
            print(f"matched settings ({size}): {same} the same" + (f", DIFFERS: {', '.join(r['differs'])}"
                                                                  if r["differs"] else ""))


def device_name(args) -> str:
    """What the sides compute on: the CPU and its threads, or the GPU (with the CPU threads beside it)."""
    if args.device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)}; {cpu_name()}, {args.threads} threads"
    return f"{cpu_name()}, {args.threads} threads"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return host.machine()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=None, help=f"comma list of {', '.join(wl.SIZES)} (default: all; --quick: tiny,10m)")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per side (default 10; --quick: 3)")
    p.add_argument("--quick", action="store_true", help="tiny and 10m, 3 steps")
    p.add_argument("--prompts-per-step", type=int, default=2, help="prompts per step (x 8 samples)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--n-samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--model", action="append", default=[], help="a Hugging Face model directory to run as one more "
                   "size (architecture and tokenizer from it; repeatable), e.g. the SmolLM2-135M fixture")
    p.add_argument("--scaling", default=None, help="comma list of n_samples x new_tokens points, e.g. 8x64,16x64,8x128: "
                   "step time of both sides at each, on the first size")
    p.add_argument("--rounds", type=int, default=1, help="run each side this many times (the order alternating) "
                   "and keep each side's run with the lowest median step: on a shared machine one noisy run "
                   "otherwise decides the ratio (each run's median is printed and kept in the JSON)")
    p.add_argument("--seeds", type=int, default=1, help="run each side this many times, the k-th with sampling seed "
                   "+ k (same model, same prompts), and compare the per-step mean rewards averaged over the runs, "
                   "with the difference sampling noise alone would leave (timings: each side's quietest run)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads of both sides")
    p.add_argument("--work-dir", default=os.path.join(ROOT, "outputs", "bench_grpo_step"))
    p.add_argument("--venv-dir", default=os.path.join(ROOT, ".bench_venv"), help="where TRL's venv is kept")
    p.add_argument("--json", default=None, help="results file (default bench/results/grpo_step.json; "
                                                "--quick: <work-dir>/grpo_step_quick.json)")
    p.add_argument("--compare", default=None, help="a previous results JSON to compare step times with")
    p.add_argument("--skip-trl", action="store_true", help="our side only")
    p.add_argument("--engine", default="megatron", help="our rollout engine(s), comma list of megatron, vllm "
                   "(vllm: run this script with the .venv-vllm python; 'megatron,vllm' puts them side by side)")
    p.add_argument("--vllm-compile", action="store_true", help="the vLLM side compiles its model (enforce_eager: "
                   "false; the engine starts in minutes the first time, then from vLLM's compile cache)")
    p.add_argument("--compile", action="store_true", help="our side compiles its generation (enforce_eager: false: "
                   "the native engine's decode step, or vLLM's model); TRL 1.16 has no such switch (its GRPOTrainer "
                   "builds its GenerationConfig with disable_compile=True), so its generation stays eager")
    p.add_argument("--compile-layers", action="store_true", help="our actor and reference run their decoder layers "
                   "through torch.compile (use_torch_compile: true, models/compiled_layers.py)")
    p.add_argument("--trl-torch-compile", action="store_true", help="TRL's side with TrainingArguments.torch_compile="
                   "True (its model compiled by accelerate; the default is off)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"),
                   help="compute precision of both sides: bf16 = our bf16 model with fp32 main params in the "
                        "optimizer, TRL's bf16=True (autocast over fp32 parameters); MFU against the bf16 matmul peak")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where both sides compute: cpu, or cuda (one GPU: ours at training.platform cuda, TRL with "
                        "use_cpu=False; the MFU is against the GPU's own measured matmul rate)")
    p.add_argument("--trl-python", default=None,
                   help="run TRL's side with this Python instead of the venv the bench makes (it must import trl "
                        f"{_trl_side.TRL_VERSION})")
    p.add_argument("--trl-optional", action="store_true", help="go on with our side only if TRL's venv cannot be made")
    p.add_argument("--task", default="parity", choices=("parity", "arith"),
                   help="parity: the benchmark's own reward on the tiny task's prompts (any size); arith: the SmolLM2 "
                        "example's task (its questions through the chat template, its reward, lr 5e-6, no weight "
                        "decay), which a real chat model learns: give it with --model, and use --steps 20 "
                        "--prompts-per-step 8 --max-new-tokens 32 for the example's run")
    p.add_argument("--stochastic-rounding", action="store_true",
                   help="with --dtype bf16: our side rounds its fp32 main params into the bf16 model stochastically "
                        "(bf16_stochastic_rounding); TRL's autocast keeps fp32 parameters and needs no rounding")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per forward/backward micro-batch of the update and the reference forward on "
                        "both sides (TRL: per_device_train_batch_size, with gradient accumulation over the step's "
                        "sequences); default: all of a step's sequences at once")
    args = p.parse_args(argv)
    seqs = args.prompts_per_step * args.n_samples
    if args.micro_batch is not None and (args.micro_batch < 1 or seqs % args.micro_batch):
        p.error(f"--micro-batch {args.micro_batch}: use a divisor of the {seqs} sequences a step has "
                f"(--prompts-per-step x --n-samples)")
    if args.scaling and args.micro_batch:
        p.error("--micro-batch with --scaling: the points change the sequences per step; run them apart")
    if args.stochastic_rounding and args.dtype != "bf16":
        p.error("--stochastic-rounding rounds into bf16 weights: add --dtype bf16")
    if args.task == "arith" and (not args.model or args.sizes):
        p.error("--task arith needs a chat model and only that: pass --model DIR (e.g. the SmolLM2-135M-Instruct "
                "fixture) and no --sizes")
    args.sizes = (args.sizes or ("tiny,10m" if args.quick else ",".join(wl.SIZES))).split(",")
    if args.model and args.sizes == (["tiny", "10m"] if args.quick else list(wl.SIZES)):
        args.sizes = []  # --model alone: just the model(s)
    for model_dir in args.model:
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            p.error(f"--model {model_dir}: no config.json there; pass a Hugging Face model directory")
        args.sizes.append(wl.add_model_dir(model_dir))
    points = []
    for point in (args.scaling.split(",") if args.scaling else []):
        try:
            n, t = (int(x) for x in point.lower().split("x"))
        except ValueError:
            p.error(f"--scaling {point!r}: write points as N_SAMPLESxNEW_TOKENS, e.g. 8x64")
        points.append((n, t))
    args.scaling = points
    args.steps = args.steps or (3 if args.quick else 10)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: use 1 or more")
    if args.seeds < 1 or args.seeds > 1 and args.rounds > 1:
        p.error(f"--seeds {args.seeds}: use 1 or more, and not with --rounds (each seed is a round already)")
    args.engine = tuple(args.engine.split(","))
    if any(e not in SIDE for e in args.engine):
        p.error(f"--engine {','.join(args.engine)}: use megatron, vllm or megatron,vllm")
    unknown = [s for s in args.sizes if s not in wl.SIZES and not s.startswith("model:")]
    if unknown:
        p.error(f"unknown size {unknown[0]!r}; valid: {', '.join(wl.SIZES)}")
    args.json = args.json or (os.path.join(args.work_dir, "grpo_step_quick.json") if args.quick
                              else os.path.join(ROOT, "bench", "results", "grpo_step.json"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("grpo_step.py: --device cuda, but torch sees no GPU on this machine; run it where one is, or "
              "use --device cpu.", file=sys.stderr)
        return 2
    started = time.perf_counter()
    w = workload(args)
    work = os.path.abspath(args.work_dir)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "workload.json"), "w", encoding="utf-8") as f:
        json.dump(w, f, indent=1)
    python = None
    if args.trl_python:
        python = args.trl_python  # e.g. a machine without a package index, TRL on its PYTHONPATH
    elif not args.skip_trl:
        try:
            python = _trl_side.ensure_venv(os.path.abspath(args.venv_dir))
        except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
            if not args.trl_optional:
                print(f"grpo_step.py: could not create TRL's venv: {err}", file=sys.stderr)
                return 3
            print(f"TRL's venv could not be created; our side only. ({str(err).splitlines()[0]})")

    peak0 = wl.matmul_peak(args.threads, dtype=args.dtype, device=args.device)
    print(f"{args.dtype} matmul peak on {device_name(args)}: {peak0 / 1e9:.1f} GFLOP/s")
    tok_dir = wl.build_tokenizer(os.path.join(work, "tokenizer"))
    prompts = (wl.write_arith_prompts(os.path.join(work, "prompts_arith.jsonl")) if args.task == "arith"
               else wl.write_prompts(os.path.join(work, "prompts.jsonl")))
    scaling = {}
    try:
        results = {size: run_size(i, size, w, work, tok_dir, prompts, python, args.engine)
                   for i, size in enumerate(args.sizes)}
        for j, (n, t) in enumerate(args.scaling):  # the first size at each point
            wp = dict(w, n_samples=n, max_new_tokens=t, point_suffix=f"_{n}x{t}",
                      micro_batch=w["prompts_per_step"] * n)  # all of the point's sequences (--micro-batch is refused)
            scaling[(args.sizes[0], f"{n}x{t}")] = run_size(j, args.sizes[0], wp, work, tok_dir, prompts, python,
                                                            ("megatron",))
    except RuntimeError as err:
        print(f"grpo_step.py: {err}", file=sys.stderr)
        return 1
    peak = max(peak0, wl.matmul_peak(args.threads, dtype=args.dtype, device=args.device))  # the best of start and end: the machine is shared
    for (size, _), r in [((size, None), r) for size, r in results.items()] + list(scaling.items()):
        for side in ("ours", "ours_vllm", "trl"):
            if side in r:
                r[side]["summary"] = summarize(r[side]["steps"], size, peak)
        if "trl" in r and "ours" in r:
            r["ratio"] = ratios(r["ours"]["summary"], r["trl"]["summary"])
        if "ours" in r and "ours_vllm" in r:
            r["ratio_vllm"] = ratios(r["ours"]["summary"], r["ours_vllm"]["summary"])

    print_settings(results)
    print(f"\nGRPO step on this machine ({device_name(args)}, {args.dtype}), {w['prompts_per_step']} "
          f"prompts x {w['n_samples']} samples, {w['max_new_tokens']} new tokens, steps 2..{w['steps']}; "
          f"peak {peak / 1e9:.1f} GFLOP/s\n")
    print(table(results, peak))
    print(LEGEND)
    print("\nmean reward of step 1 from the same initial weights (and over all steps): " + ", ".join(
        f"{s}: " + " / ".join(f"{LABEL[k]} {_fmt(r[k]['summary']['reward_step1'])} "
                              f"({_fmt(r[k]['summary']['reward_mean'])})" for k in ("ours", "ours_vllm") if k in r)
        + (f" / TRL {_fmt(r['trl']['summary']['reward_step1'])} ({_fmt(r['trl']['summary']['reward_mean'])})"
           if "trl" in r else "") for s, r in results.items()))
    for size, r in results.items():
        rounds = {LABEL[k]: r[k]["rounds_step_s"] for k in ("ours", "ours_vllm", "trl") if len(r.get(k, {}).get("rounds_step_s", [])) > 1}
        if rounds:
            print(f"rounds ({size}; median step s of each run, the lowest kept): " + "; ".join(
                f"{side} " + ", ".join(f"{x:.3f}" for x in xs) for side, xs in rounds.items()))
    for size, r in results.items():
        c = r.get("reward_curves")
        if c:
            print(f"reward curves ({size}, {c['steps']} steps, mean reward per step): ours {c['ours_mean']:.3f}, "
                  f"TRL {c['trl_mean']:.3f}, mean absolute difference {c['mae']:.4f} "
                  f"({_pct(c['relative_mae'])} of TRL's mean; the bound is 4 %)"
                  + (f"; averaged over {c['seeds']} seeds per side (single seeds: "
                     f"{', '.join(_pct(x) for x in c['relative_mae_per_seed'])}), where sampling noise alone would "
                     f"leave {c['noise_mae']:.4f} ({_pct(c['relative_noise_mae'])})" if "seeds" in c else ""))
            if "ours_first" in c:
                print(f"  learning (mean reward of the first {c['ends_steps']} steps -> the last {c['ends_steps']}): "
                      f"ours {c['ours_first']:.3f} -> {c['ours_last']:.3f} in {c['ours_seconds']:.0f} s of steps, "
                      f"TRL {c['trl_first']:.3f} -> {c['trl_last']:.3f} in {c['trl_seconds']:.0f} s")
    if scaling:
        print(f"\nscaling ({args.sizes[0]}; {w['prompts_per_step']} prompts per step):\n" + scaling_table(scaling))
    wall = time.perf_counter() - started
    print(f"total wall time {wall:.0f} s")
    report = {"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"), "command": " ".join(sys.argv),
                       "wall_s": round(wall, 1), "cpu": cpu_name(), "threads": args.threads, "cpus": os.cpu_count(),
                       "device": device_name(args),
                       "peak_flops": peak, "peak_flops_start": peak0, "python": host.python_version(),
                       "trl_venv": python},
              "workload": w, "sizes": results,
              "scaling": {f"{size} {point}": r for (size, point), r in scaling.items()}}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"results: {args.json}")
    if args.compare:
        compare(args.compare, results)
    differs = {s: r["differs"] for s, r in results.items() if r.get("differs")}
    if differs:
        print("grpo_step.py: settings differ between the sides: " + "; ".join(
            f"{s}: {', '.join(b)}" for s, b in differs.items()), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
