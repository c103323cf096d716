"""Profile one policy update, ours (megatron, models/train_step.py) against transformers as TRL runs it.

Both sides load the same Hugging Face directory, take the same (rows, prompt + response) random
token batch as one micro-batch, and do what one GRPO update does: forward, per-token log-probs of
the response, the clipped loss + k3 KL, backward, grad clipping and one AdamW step. The transformers
side follows TRL 1.16's `_get_per_token_logps_and_entropies` (logits only for the response via
`logits_to_keep`, SDPA attention, fp32). torch.profiler's top operators of each side are printed
(self CPU time), then the wall time per update (best of --repeat), so the gap can be attributed.

    python bench/update_profile.py --model DIR [--rows 16 --prompt 8 --response 64 --repeat 3 --top 25]
    python bench/update_profile.py --size 10m      # the bench's random 10M Qwen2 (built in a temp dir)
    python bench/update_profile.py --size 10m --dtype bf16 --levers --variants ours,bf16-attn,transformers
                                                   # bf16 (transformers under autocast, as TRL's bf16=True)
    python bench/update_profile.py --size 10m --dtype bf16 --levers --variants ours,compiled-layers --prompt 4 --repeat 5
                                                   # use_torch_compile (the warm-up call compiles)
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspeed_rl.platform.placement import PARAMS_DTYPES  # noqa: E402


def batch_of(rows: int, prompt: int, response: int, vocab: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, prompt + response), generator=g)
    rmask = torch.ones(rows, response)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": rmask,
            "advantages": torch.randn(rows, 1, generator=g).expand(rows, response).contiguous(),
            "old_log_probs": torch.full((rows, response), -7.0),
            "ref_log_probs": torch.full((rows, response), -7.0)}


# ---------------------------------------------------------------------------- ours
def ours(model_dir: str, batch: dict, prompt: int, full_logits: bool = False, local_attention: bool = False,
         megatron_rope: bool = False, unfused_wgrad: bool = False, unfused_embedding: bool = False,
         loop_adam: bool = False, all_rows: bool = False, kl: bool = True, megatron_swiglu: bool = False,
         log_softmax: bool = False, dtype: str = "fp32", bf16_attention: bool = False,
         stochastic_rounding: bool = False, repeat_kv: bool = False, compile_layers: bool = False):
    """One policy_update_step of a fresh model; full_logits / local_attention / megatron_rope /
    megatron_swiglu / unfused_wgrad / unfused_embedding turn a lever off (the output layer on every
    position; megatron's DotProductAttention; megatron's unfused RoPE instead of models/rotary.py;
    megatron's unfused chunk + silu * mul instead of models/swiglu.py; the linear layers' weight
    gradients through param.grad and DDP's add_ instead of into main_grad, platform/wgrad_fusion.py;
    the word embedding's the same way, a (V, H) gradient instead of its rows into main_grad; torch's
    per-parameter Adam instead of its fused kernel; every row run, also those with zero advantages;
    log_softmax + gather for the log-probs and the exact finite check, _with_log_softmax; bf16 inputs
    attending in bf16 instead of fp32, bf16_attention; GQA's K/V repeated for their heads instead of
    SDPA's enable_gqa, repeat_kv) to measure it alone; compile_layers turns a lever on: the decoder
    layers through torch.compile (`use_torch_compile`, models/compiled_layers.py); stochastic_rounding turns
    the bf16 main-to-model copy's stochastic rounding on (its cost). kl=False: the policy loss
    alone (no reference log-probs), where zero-advantage rows are left out."""
    import contextlib

    from mindspeed_rl.models import builder, train_step

    sdpa = builder.sdpa_core_attention
    builder.sdpa_core_attention = (lambda name: False) if local_attention else sdpa
    try:
        update = _ours(model_dir, batch, prompt, unfused_wgrad=unfused_wgrad, unfused_embedding=unfused_embedding,
                       loop_adam=loop_adam, kl=kl, megatron_swiglu=megatron_swiglu, dtype=dtype,
                       stochastic_rounding=stochastic_rounding, compile_layers=compile_layers)
    finally:
        builder.sdpa_core_attention = sdpa
    if megatron_rope:
        update = _with_megatron_rope(update)
    if all_rows:
        update = _with_all_rows(update)
    if log_softmax:
        update = _with_log_softmax(update)
    if bf16_attention:
        update = _with_core_attention_choice_off(update, "sdpa_in_fp32_for_bf16")
    if repeat_kv:
        update = _with_core_attention_choice_off(update, "sdpa_native_gqa")
    if not full_logits:
        return update
    @contextlib.contextmanager
    def every_column(chunk, start):
        yield 0

    def step():
        columns = train_step.output_columns
        train_step.output_columns = every_column
        try:
            return update()
        finally:
            train_step.output_columns = columns
    return step


def _with_megatron_rope(update):
    """update, run with megatron's own apply_rotary_pos_emb in its attention (the patch is global:
    swapped in and back around each call, so the other variants keep ours)."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer import attention

    def step():
        ours_ = attention.apply_rotary_pos_emb
        attention.apply_rotary_pos_emb = rope_utils.apply_rotary_pos_emb
        try:
            return update()
        finally:
            attention.apply_rotary_pos_emb = ours_
    return step


def _with_log_softmax(update):
    """update, with the response log-probs as log_softmax + gather of the column slice (what the
    update did before forward.token_log_probs) and the finite check's exact max |g| per tensor."""
    from mindspeed_rl.models import train_step

    def old_log_probs(logits, targets, temperature, vocab_size, first):
        z = logits[:, first: first + targets.shape[1]].float() / temperature
        if vocab_size is not None and vocab_size < z.shape[-1]:
            z = z.masked_fill(torch.arange(z.shape[-1]) >= vocab_size, float("-inf"))
        return torch.log_softmax(z, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def step():
        saved = train_step.token_log_probs, train_step.nonfinite_flag
        train_step.token_log_probs = old_log_probs
        train_step.nonfinite_flag = lambda model, outputs, exact=False: saved[1](model, outputs, exact=True)
        try:
            return update()
        finally:
            train_step.token_log_probs, train_step.nonfinite_flag = saved
    return step


def _with_core_attention_choice_off(update, choice: str):
    """update, with the fused core attention's platform choice `choice` (a function of the platform
    name in models/core_attention.py) answering False, swapped back after each call:
    sdpa_in_fp32_for_bf16 (bf16 inputs attend in bf16, not fp32) or sdpa_native_gqa (GQA's K/V
    repeated for their query heads, not handed to SDPA as groups with enable_gqa)."""
    from mindspeed_rl.models import core_attention

    def step():
        saved = getattr(core_attention, choice)
        setattr(core_attention, choice, lambda name: False)
        try:
            return update()
        finally:
            setattr(core_attention, choice, saved)
    return step


def _with_all_rows(update):
    """update, run with every row through the forward/backward (train_step.rows_to_run off)."""
    from mindspeed_rl.models import train_step

    def step():
        rows_to_run = train_step.rows_to_run
        train_step.rows_to_run = lambda *args: None
        try:
            return update()
        finally:
            train_step.rows_to_run = rows_to_run
    return step


def _ours(model_dir: str, batch: dict, prompt: int, unfused_wgrad: bool = False, unfused_embedding: bool = False,
          loop_adam: bool = False, kl: bool = True, megatron_swiglu: bool = False, dtype: str = "fp32",
          stochastic_rounding: bool = False, compile_layers: bool = False):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.hf_bridge.loader import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.hf_config import model_config_from_hf
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29871")
        torch.distributed.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():  # several variants share one state
        init_parallel_state(1, 1, seed=1)
    args = model_config_from_hf(read_hf_config(model_dir))
    params_dtype = PARAMS_DTYPES[dtype]
    model = build_gpt_model(args, params_dtype=params_dtype)  # bf16: megatron's bf16 model, fp32 main params
    load_hf_checkpoint(model, model_dir, args)
    if compile_layers:
        from mindspeed_rl.models import compiled_layers

        compiled_layers.install(model)
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    if megatron_swiglu:  # the flag is per config (MoE experts keep a copy): megatron's unfused glu
        for module in ddp.module.modules():
            if getattr(module, "config", None) is not None:
                module.config.bias_activation_fusion = False
    if unfused_wgrad:
        for module in ddp.module.modules():
            if hasattr(module, "gradient_accumulation_fusion"):
                module.gradient_accumulation_fusion = False
    if unfused_embedding:
        from mindspeed_rl.platform import wgrad_fusion

        wgrad_fusion.unfuse_embeddings(ddp.module)
    opt, sched = build_optimizer([ddp], lr=1e-5, train_iters=100, weight_decay=0.01, clip_grad=1.0,
                                 use_distributed_optimizer=False, params_dtype=params_dtype,
                                 stochastic_rounding=stochastic_rounding, seed=1)
    if loop_adam:
        for group in opt.optimizer.param_groups:
            group["fused"] = False  # what torch picks on CPU by itself
    s = PolicyLossSettings(use_kl_loss=kl, kl_loss_type="low_var_kl", kl_loss_coef=0.001,
                           vocab_size=int(args.get("vocab_size") or args["padded_vocab_size"]))
    return lambda: policy_update_step(ddp, opt, sched, batch, prompt, batch["input_ids"].shape[0], s)


# ---------------------------------------------------------------------------- transformers (TRL's way)
def theirs(model_dir: str, batch: dict, prompt: int, kl: bool = True, dtype: str = "fp32"):
    """TRL's update; dtype bf16 = TRL's bf16=True on CPU: accelerate's autocast to bf16 around the
    forward of the fp32 model (the loss maths after it in fp32, as TRL's)."""
    from transformers import AutoModelForCausalLM

    ids, mask, response = batch["input_ids"], batch["attention_mask"], batch["response_mask"].shape[1]
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="sdpa")
    model.to(ids.device).train()  # on the batch's device (scripts/gpu_smoke.py's speed check runs this on a GPU)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01, fused=True)  # transformers' default optim

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=response + 1).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, prompt:, None]).squeeze(-1)  # (B, T)
        ratio = torch.exp(logp - logp.detach())
        adv = batch["advantages"]
        pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        loss_t = pg
        if kl:  # TRL computes the KL only when beta != 0
            d = batch["ref_log_probs"] - logp
            loss_t = pg + 0.001 * (torch.exp(d) - d - 1)
        loss = (loss_t * batch["response_mask"]).sum() / batch["response_mask"].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def profile(name: str, step, repeat: int, top: int) -> float:
    step()  # warm-up (optimizer state, allocator)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    from torch.profiler import ProfilerActivity, profile as prof

    with prof(activities=[ProfilerActivity.CPU]) as p:
        step()
    print(f"\n=== {name}: best {min(times):.3f} s of {repeat} updates ({', '.join(f'{t:.3f}' for t in times)}); "
          f"load {os.getloadavg()[0]:.2f}")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=48))
    return min(times)


def interleaved(steps: dict, rounds: int) -> dict:
    """Run each variant once per round, in turn (so a change in the machine's load hits all of them),
    after two warm-ups each (a compiled variant compiles there, and Dynamo's second look at a shape
    may recompile); returns {name: [(wall s, process CPU s) per round]}. On a shared machine
    the CPU seconds (all threads of this process) say more than the wall time."""
    for name, step in steps.items():
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        step()
        print(f"warm-up {name}: {t1 - t0:.2f} s, {time.perf_counter() - t1:.2f} s (a compiled variant compiles in "
              f"the first)", flush=True)
    times = {name: [] for name in steps}
    for r in range(rounds):
        for name, step in steps.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
        print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1][0]:.3f} s / {t[-1][1]:.3f} cpu-s" for n, t in times.items())
              + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a Hugging Face directory (Llama / Qwen2 / Qwen3 dense)")
    ap.add_argument("--size", choices=["tiny", "10m", "50m"], help="the bench's random Qwen2 of this size")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: our bf16 model (fp32 main params) against transformers under CPU autocast to bf16 "
                         "(TRL's bf16=True)")
    ap.add_argument("--side", choices=["both", "ours", "theirs"], default="both")
    ap.add_argument("--levers", action="store_true",
                    help="no profile: time ours, ours with each lever off, and transformers, interleaved")
    ap.add_argument("--variants", default="ours,full-logits,local-attn,megatron-rope,megatron-swiglu,unfused-wgrad,"
                                          "unfused-embedding,loop-adam,transformers",
                    help="with --levers: which of ours, full-logits, local-attn, megatron-rope, megatron-swiglu, "
                         "unfused-wgrad, unfused-embedding, loop-adam, log-softmax, bf16-attn (with --dtype bf16: "
                         "attention in bf16 instead of fp32), repeat-kv (GQA's K/V repeated for their heads, not enable_gqa), stochastic-rounding (with --dtype bf16: the bf16 copy "
                         "rounds stochastically, bf16_stochastic_rounding), "
                         "all-rows, transformers (memory: one model each)")
    ap.add_argument("--zero-rows", type=float, default=0.0,
                    help="fraction of the rows with advantage 0 (a group that scored alike); > 0 also drops the KL "
                         "term on both sides, the case where ours does not run those rows (variant all-rows runs them)")
    a = ap.parse_args()
    if bool(a.model) == bool(a.size):
        print("give exactly one of --model DIR and --size NAME", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    tmp = None
    model_dir = a.model
    if a.size:
        from bench import grpo_step_workload as wl

        tmp = tempfile.TemporaryDirectory()
        model_dir = wl.build_model(a.size, tmp.name, wl.build_tokenizer(os.path.join(tmp.name, "tok")), seed=0)
    import json

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        vocab = json.load(f)["vocab_size"]
    batch = batch_of(a.rows, a.prompt, a.response, vocab)
    kl = a.zero_rows == 0
    batch["advantages"][: round(a.zero_rows * a.rows)] = 0.0
    if a.levers:
        levers = {"ours": {}, "full-logits": {"full_logits": True}, "local-attn": {"local_attention": True},
                  "megatron-rope": {"megatron_rope": True}, "megatron-swiglu": {"megatron_swiglu": True},
                  "unfused-wgrad": {"unfused_wgrad": True}, "unfused-embedding": {"unfused_embedding": True},
                  "loop-adam": {"loop_adam": True}, "all-rows": {"all_rows": True},
                  "log-softmax": {"log_softmax": True}, "bf16-attn": {"bf16_attention": True},
                  "repeat-kv": {"repeat_kv": True}, "compiled-layers": {"compile_layers": True},
                  "stochastic-rounding": {"stochastic_rounding": True}}
        make = {name: (lambda off=off: ours(model_dir, batch, a.prompt, kl=kl, dtype=a.dtype, **off))
                for name, off in levers.items()}
        make["transformers"] = lambda: theirs(model_dir, batch, a.prompt, kl=kl, dtype=a.dtype)
        names = a.variants.split(",")
        if "ours" not in names or set(names) - set(make):
            print(f"--variants: a comma list of {', '.join(make)} that includes ours", file=sys.stderr)
            return 2
        times = interleaved({name: make[name]() for name in names}, a.repeat)
        import statistics

        best = {name: (min(w for w, _ in t), min(c for _, c in t)) for name, t in times.items()}
        median = {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
                  for name, t in times.items()}
        print("\nvariant           best wall s  best cpu-s  cpu / ours  median wall s  median cpu-s")
        for name, (wall, cpu) in best.items():
            print(f"{name:<17} {wall:10.3f}  {cpu:10.3f}  {cpu / best['ours'][1]:9.2f}x  {median[name][0]:12.3f}  "
                  f"{median[name][1]:12.3f}")
        return 0
    results = {}
    if a.side in ("both", "theirs"):
        results["transformers"] = profile("transformers (TRL's update)", theirs(model_dir, batch, a.prompt, kl, dtype=a.dtype), a.repeat, a.top)
    if a.side in ("both", "ours"):
        results["ours"] = profile("ours (policy_update_step)", ours(model_dir, batch, a.prompt, kl=kl, dtype=a.dtype), a.repeat, a.top)
    if len(results) == 2:
        print(f"\nours/transformers update: {results['ours'] / results['transformers']:.2f}x "
              f"({results['ours']:.3f} s vs {results['transformers']:.3f} s)")
    from mindspeed_rl.distributed.worker_env import destroy_world

    destroy_world()  # a process group left to the interpreter's exit can abort it
    return 0


if __name__ == "__main__":
    sys.exit(main())
