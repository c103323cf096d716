"""TRL's side of bench/grpo_step.py: its virtual environment, and the run inside it.

Imported by bench/grpo_step.py (our venv) for `ensure_venv`, which creates `.bench_venv/trl-<ver>/`
with TRL pinned and torch/transformers at the versions our venv has, and reuses it when present.
Run as a script inside that venv, it trains TRL's GRPOTrainer on the shared workload and writes
one JSON file: the settings TRL actually used (read back from the trainer) and per-step records.

    <trl venv>/bin/python bench/_trl_side.py --model DIR --prompts FILE --workload JSON --out FILE

Phase timings: TRL 1.16 logs only `step_time` (training_step, optimizer step excluded); its
profiling_context timings go to wandb/mlflow/trackio only. So a subclass times TRL's own methods:
gen = `_generate` (prompt tokenisation + `model.generate` + decoding), reward = `_calculate_rewards`,
ref = `_get_per_token_logps_and_entropies` on the reference model, old_log_prob = the same on the
policy inside generation (skipped by TRL when on-policy, as by us), step = on_step_begin ->
on_step_end (generation, loss, backward, clip, optimizer step); update = step - `_prepare_inputs`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib import metadata

VENV_LOCK_TIMEOUT_S = 1800  # another process's venv build (about a minute here; pip on a slow index far longer)
TRL_VERSION = "1.16.0"  # pinned: the knob names below are this version's (trl/trainer/grpo_config.py)


# ---------------------------------------------------------------------------- the venv (runs in our venv)
def ensure_venv(root: str, log=print) -> str:
    """Python of a venv with trl==TRL_VERSION and our torch/transformers versions; created once.

    A venv whose recorded versions differ is rebuilt. torch comes from the same wheel source as ours
    (on this project's machines a local wheel, so creation takes about a minute). Two processes asking
    at once (CI builds it in the background while its tests run: .ci/run) take turns on a lock file
    beside it, so the second finds the first one's venv instead of clearing it mid-install.
    """
    from filelock import FileLock, Timeout  # released also if this process dies (flock)

    os.makedirs(root, exist_ok=True)
    lock = os.path.join(root, f"trl-{TRL_VERSION}.lock")
    try:
        with FileLock(lock, timeout=VENV_LOCK_TIMEOUT_S):
            return _ensure_venv_locked(root, log)
    except Timeout:
        raise RuntimeError(f"waited {VENV_LOCK_TIMEOUT_S} s for another process building the TRL venv in {root} "
                           f"(it holds {lock}); let it finish or stop it, then retry.") from None


def _ensure_venv_locked(root: str, log) -> str:
    pins = {"trl": TRL_VERSION, "torch": metadata.version("torch").split("+")[0],
            "transformers": metadata.version("transformers")}
    venv = os.path.join(root, f"trl-{TRL_VERSION}")
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, "bench_pins.json")
    if os.path.isfile(stamp) and os.path.isfile(python):
        with open(stamp, encoding="utf-8") as f:
            if json.load(f) == pins:
                return python
    log(f"creating the TRL venv {venv} ({', '.join(f'{k}=={v}' for k, v in pins.items())}) ...")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    proc = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           *(f"{k}=={v}" for k, v in pins.items())], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"pip install into {venv} failed:\n{proc.stderr[-3000:]}")
    with open(stamp, "w", encoding="utf-8") as f:
        json.dump(pins, f)
    log(f"TRL venv ready in {time.perf_counter() - t0:.0f} s")
    return python


# ---------------------------------------------------------------------------- the run (inside the TRL venv)
def _load_reward(path: str):
    """compute_score(response, label) of the workload's reward file (the one our side is given too)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("grpo_step_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def grpo_config(w: dict, out_dir: str):
    """GRPOConfig of the workload `w` (the dict bench/grpo_step.py writes); one generation = one update."""
    from trl import GRPOConfig

    sequences = w["prompts_per_step"] * w["n_samples"]
    micro = w["micro_batch"]  # one generation of `sequences`, accumulated over micro-batches
    return GRPOConfig(
        output_dir=out_dir, max_steps=w["steps"], seed=w["seed"], use_cpu=w.get("device", "cpu") == "cpu", bf16=w.get("dtype", "fp32") == "bf16", fp16=False,
        per_device_train_batch_size=micro, gradient_accumulation_steps=sequences // micro,
        steps_per_generation=sequences // micro,
        num_generations=w["n_samples"], num_iterations=1, max_completion_length=w["max_new_tokens"],
        temperature=w["temperature"], top_p=w["top_p"], top_k=w["top_k"], repetition_penalty=1.0,
        beta=w["kl_coef"], epsilon=w["clip_low"], epsilon_high=w["clip_high"], delta=None,
        loss_type=w["trl_loss_type"], scale_rewards="group", mask_truncated_completions=False,
        learning_rate=w["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=w["weight_decay"],
        adam_beta1=w["adam_beta1"], adam_beta2=w["adam_beta2"], adam_epsilon=w["adam_eps"],
        max_grad_norm=w["clip_grad"], optim="adamw_torch_fused", use_vllm=False, gradient_checkpointing=False,
        disable_dropout=True, logging_steps=1, save_strategy="no", report_to="none", log_completions=False,
        dataloader_num_workers=0, remove_unused_columns=False, shuffle_dataset=False,  # file order, as ours
        torch_compile=bool(w.get("trl_torch_compile")), model_init_kwargs={"dtype": "float32"})


def run(args) -> None:
    import torch

    with open(args.workload, encoding="utf-8") as f:
        w = json.load(f)
    torch.set_num_threads(w["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    score = _load_reward(w.get("reward_file") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                              "grpo_step_reward.py"))
    chat = w.get("prompt_type") == "hf"  # our prompt_type hf = the tokenizer's chat template = TRL's conversational

    def reward(completions, answer, **_):
        # conversational prompts give completions as [{"role": "assistant", "content": text}]
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [score(t, a) for t, a in zip(texts, answer)]

    rows = [json.loads(line) for line in open(args.prompts, encoding="utf-8")]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}] if chat else r["prompt"],
                                  "answer": r["labels"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    timings: dict[str, float] = {}
    # on a GPU the kernels run asynchronously: each timer waits for them (TRL's own code syncs no more
    # than it does; the waits only move time between phases, to where the work was queued)
    sync = torch.cuda.synchronize if w.get("device", "cpu") == "cuda" else (lambda: None)

    def add(name: str, seconds: float) -> None:
        timings[name] = timings.get(name, 0.0) + seconds

    def now() -> float:
        sync()
        return time.perf_counter()

    class TimedGRPOTrainer(GRPOTrainer):
        """Adds wall-clock timers around TRL's own phase methods; changes nothing else."""

        def _prepare_inputs(self, batch):
            t0 = now()
            out = super()._prepare_inputs(batch)
            add("prepare", now() - t0)
            return out

        def _generate(self, prompts):
            t0 = now()
            out = super()._generate(prompts)
            add("gen", now() - t0)
            return out

        def _calculate_rewards(self, *a, **k):
            t0 = now()
            out = super()._calculate_rewards(*a, **k)
            add("reward", now() - t0)
            return out

        def _get_per_token_logps_and_entropies(self, model, *a, **k):
            t0 = now()
            out = super()._get_per_token_logps_and_entropies(model, *a, **k)
            if model is self.ref_model:
                add("ref", now() - t0)
            elif not torch.is_grad_enabled():  # the policy under no_grad: old log-probs
                add("old_log_prob", now() - t0)
            return out

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            timings["tokens"] = float(out["prompt_mask"].sum() + out["completion_mask"].sum())
            timings["response_len"] = float(out["completion_mask"].sum(-1).float().mean())
            timings["prompt_len"] = float(out["prompt_mask"].sum(-1).float().mean())
            return out

    records: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            timings.clear()
            timings["t0"] = now()

        def on_step_end(self, *_, **__):
            step = now() - timings.pop("t0")
            phases = {k: timings.get(k, 0.0) for k in ("gen", "reward", "ref", "old_log_prob")}
            records.append({"step": len(records) + 1, "step_s": step, **phases,
                            "update": step - timings.get("prepare", 0.0),
                            "other": timings.get("prepare", 0.0) - sum(phases.values()),
                            "tokens": timings.get("tokens"), "response_len": timings.get("response_len"),
                            "prompt_len": timings.get("prompt_len")})

    trainer = TimedGRPOTrainer(model=model, reward_funcs=reward, args=grpo_config(w, args.scratch),
                               train_dataset=dataset, processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    for rec, log in zip(records, logs):
        rec.update(score=log.get("reward"), trl_step_time=log.get("step_time"), kl=log.get("kl"),
                   entropy=log.get("entropy"))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"settings": used_settings(trainer, tokenizer, dataset[0]["prompt"]), "steps": records}, f)


def prompt_ids(tokenizer, prompt) -> list[int]:
    """The ids TRL generates from for one dataset prompt: a conversation through the chat template
    (as GRPOTrainer._tokenize_prompts), plain text through the tokenizer without special tokens."""
    if isinstance(prompt, list):
        out = tokenizer.apply_chat_template([prompt], add_generation_prompt=True, tokenize=True, return_dict=True)
        return [int(i) for i in out["input_ids"][0]]
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def used_settings(trainer, tokenizer, first_prompt) -> dict:
    """What the trainer actually runs with, read back from its objects (not from our inputs)."""
    import torch

    opt = trainer.optimizer
    opt = getattr(opt, "optimizer", opt)  # accelerate's wrapper
    groups = opt.param_groups
    g = trainer.generation_config
    decay = [p for grp in groups if grp["weight_decay"] > 0 for p in grp["params"]]
    model = trainer.model
    return {
        "n_samples": trainer.num_generations, "max_new_tokens": trainer.max_completion_length,
        "do_sample": g.do_sample, "temperature": g.temperature, "top_p": g.top_p, "top_k": g.top_k,
        "kl_coef": trainer.beta, "kl_estimator": "k3 (TRL's only KL: exp(ref-logp)-(ref-logp)-1, no clamp)",
        "clip_low": trainer.epsilon_low, "clip_high": trainer.epsilon_high, "dual_clip": None,
        "loss_agg": {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}.get(
            trainer.loss_type, trainer.loss_type),
        "adv": f"(r - mean_g) / (std_g + 1e-4), std unbiased, scale_rewards={trainer.scale_rewards}",
        "adv_eps": 1e-4,
        "ppo_epochs": trainer.num_iterations,
        # optimizer steps per generation batch: its micro-batches (steps_per_generation) over the ones
        # accumulated into one step, times the passes over it
        "updates_per_generation": trainer.num_iterations * trainer.args.steps_per_generation
        // trainer.args.gradient_accumulation_steps,
        "micro_batch": trainer.args.per_device_train_batch_size,
        "optimizer": f"{type(opt).__module__}.{type(opt).__name__}",
        "lr": groups[0]["lr"], "weight_decay": max(grp["weight_decay"] for grp in groups),
        "betas": list(groups[0]["betas"]), "adam_eps": groups[0]["eps"],
        "adam_kernel": "fused" if groups[0].get("fused") else "foreach" if groups[0].get("foreach") else "for-loop",
        "decay_params": len(decay), "no_decay_params": sum(len(grp["params"]) for grp in groups) - len(decay),
        "lr_schedule": trainer.args.lr_scheduler_type.value if hasattr(trainer.args.lr_scheduler_type, "value")
        else str(trainer.args.lr_scheduler_type),
        "clip_grad": trainer.args.max_grad_norm,
        # bf16=True: accelerate runs forward (generation, reference, loss) under autocast to bf16
        "compute_dtype": "bfloat16" if trainer.args.bf16 else str(next(model.parameters()).dtype).replace("torch.", ""),
        "master_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "params": sum(p.numel() for p in model.parameters()),
        "ref_model": trainer.ref_model is not None,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "device": str(next(model.parameters()).device.type),
        "prompt_ids": prompt_ids(tokenizer, first_prompt),
        "prompt_order": "shuffled (TRL's seed)" if trainer.args.shuffle_dataset else "file order",
        "bf16_rounding": "none (fp32 parameters; bf16=True is autocast)" if trainer.args.bf16 else "none (fp32)",
        # GRPOTrainer builds GenerationConfig(..., disable_compile=True): transformers never compiles its generate
        "generation": "eager (GenerationConfig disable_compile=True)" if getattr(g, "disable_compile", False)
        else "transformers generate (may compile)",
        "training_forward": "model compiled (torch_compile=True)" if trainer.args.torch_compile
        else "eager (torch_compile=False)",
        "eos_ids": list(trainer.eos_token_ids),
        "versions": {k: metadata.version(k) for k in ("trl", "transformers", "accelerate", "torch")},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--workload", required=True, help="JSON written by bench/grpo_step.py")
    p.add_argument("--out", required=True)
    p.add_argument("--scratch", required=True, help="TRL's output_dir (nothing is saved there)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
