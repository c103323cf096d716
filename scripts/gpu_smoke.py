"""The accelerator smoke check (issue 17): one command on one GPU (or NPU) says whether the product
runs there, with the figures the README quotes.

    python scripts/gpu_smoke.py                          # the first GPU/NPU torch sees; exit 3 if none
    python scripts/gpu_smoke.py --json smoke.json        # figures as JSON too
    python scripts/gpu_smoke.py --device cpu --shape tiny --skip-ray   # the script itself, on CPU (a test does this)

Checks, in order (each PASS / FAIL with its figures; the exit code is 0 only when all pass):
  build      a random HF checkpoint (--shape, saved with save_pretrained) built and loaded into the
             megatron model on the device, fp32 and bf16: every parameter/buffer on the device and in
             params_dtype (platform.placement_problems).
  parity     per-token log-probs against transformers on the same weights and tokens.
             fp32: max |d log p| <= 2e-3 (the issue measured 7.8e-5 on an H100 for the logits).
             bf16: both sides in bf16, each compared with transformers fp32: our error (max and mean)
             must stay within 2x transformers' own bf16 error + 0.02. The log-probs must spread
             (std > 0.3 nats), or the comparison would have no power.
  greedy     greedy continuations of --gen-batch prompts, native engine vs transformers generate
             (fp32): at least 75 % of the rows identical (near-ties may flip a token).
  update     one policy update in bf16 through megatron (DDP, fp32 main params, KL loss): finite
             loss and grad norm, grad norm > 0, weights changed, step not skipped; seconds and
             the 6·N·tokens TFLOP/s of that step.
  rounding   bf16 stochastic rounding (bf16_stochastic_rounding) on the device, its noise from
             torch's device generator: every value one of its two bf16 neighbours, exact values
             kept, P(up) for 1 + 0.3 ulp within 5 sigma of 0.3, a shard equal to its slice of the
             whole, NaN bit patterns kept NaN, and (CUDA) no host sync in the copy; then one bf16
             update with it: every bf16 weight the stochastic rounding of its fp32 main param.
  decode     tokens/s of the native engine vs transformers generate, greedy, same prompts, in
             --dtype, and (CUDA) the decode loop's host syncs per token (reported, not judged); MoE
             shapes also with the grouped-GEMM experts (tok/s, syncs, same tokens as sequential).
  compiled   the compiled decode step (enforce_eager: false; torch.compile, one decoder layer
             compiled and reused by all): fp32 greedy rows equal to the eager engine's (at least
             75 %: near-ties may flip a token) with the engine still compiled after (a failed
             compile falls back to eager, which fails this check); then in --dtype the first
             call's seconds (the compile) and decode tokens/s compiled vs eager (reported, not
             judged). Where the platform does not compile the step (Ascend), PASS with the reason.
  train_compiled
             the compiled decoder layers of training (use_torch_compile, models/compiled_layers.py):
             fp32 log-probs before and after one policy update within 1e-4 / 2e-3 of eager's from the
             same weights, grad norm within 1e-3 relative, no fallback to eager; then one bf16 update of
             the speed check's size, compiled vs eager: first call (the compile), median seconds and
             (CUDA) peak memory, reported. MoE layers stay eager: PASS with the reason.
  speed      one bf16 policy update of --speed-rows x --speed-seq tokens (one micro-batch), timed
             (median of --speed-repeat after 2 warm-ups): ours (megatron, fp32 main params, fused Adam)
             against transformers as TRL 1.16 runs it (fp32 weights under bf16 autocast, SDPA,
             logits_to_keep, fused AdamW: bench/update_profile.py's `theirs`, without TRL's fused LM
             head), with 6·N·tokens TFLOP/s, the share of the device's own measured bf16 matmul rate
             and (CUDA) peak memory; for MoE shapes ours also with the grouped-GEMM experts
             (moe_grouped_gemm). Reported, not judged: PASS when both sides ran finite updates.
  ray_gpt    `ray_gpt.py` on the tiny task, colocated, --ray-steps steps on this platform, once per
             --ray-variants entry (fp32, bf16; also compiled: bf16 with the compiled decode and layers,
             moe: the tiny model with 4 experts, top-2): exit 0, every step logged, finite grad norms;
             score, seconds per step and every step's phase timings (scripts/gpu_smoke_ray.py).

Shapes (--shape; random weights): smollm2-135m (default), qwen25-05b, qwen3-moe-small and
qwen2-moe-small (16 experts, top-4, 8 layers; the latter with a gated shared expert), deepseek-v3-small
(multi-latent attention with DeepSeek's 512 + 64 latent, YaRN, grouped sigmoid routing, 6 layers),
gpt-oss-small (attention sinks, biased router and experts, the clamped SwiGLU, 16 experts, 6 layers), tiny
and tiny-moe (the CPU self-test). For MoE shapes the TFLOP/s count the routed experts at topk / num_experts.

Exit codes: 0 all checks passed, 1 a check failed, 2 bad arguments, 3 no accelerator (nothing ran).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# HF config fields of the shapes we check (random weights: no download is possible or needed)
SHAPES = {
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True)),
    "qwen25-05b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                 max_position_embeddings=4096, rope_theta=1000000.0, tie_word_embeddings=True)),
    "tiny": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                           tie_word_embeddings=True)),
    # MoE (random; small enough to build in seconds, wide enough to route): 16 experts, top-4
    "qwen3-moe-small": ("qwen3_moe", dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                                          num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                                          num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                                          head_dim=64, vocab_size=32000, max_position_embeddings=2048,
                                          rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen2-moe-small": ("qwen2_moe", dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                                          num_experts=16, num_experts_per_tok=4, norm_topk_prob=False,
                                          shared_expert_intermediate_size=1024, num_hidden_layers=8,
                                          num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                                          max_position_embeddings=2048, rope_theta=1000000.0,
                                          tie_word_embeddings=False)),
    # DeepSeek-V3's layout (random): multi-latent attention with DeepSeek's 512 + 64 latent (what vLLM's MLA
    # kernels take), YaRN, sigmoid routing in groups with the expert bias, a dense first layer, a shared expert
    "deepseek-v3-small": ("deepseek_v3", dict(hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                                              n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                                              routed_scaling_factor=2.5, n_shared_experts=1, first_k_dense_replace=1,
                                              q_lora_rank=384, kv_lora_rank=512, qk_nope_head_dim=64,
                                              qk_rope_head_dim=64, v_head_dim=64, num_hidden_layers=6,
                                              num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                                              max_position_embeddings=2048, tie_word_embeddings=False,
                                              rope_scaling={"type": "yarn", "factor": 4.0, "mscale": 1.0,
                                                            "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                                                            "original_max_position_embeddings": 512})),
    # gpt-oss's layout (random): attention sinks, biases on the attention, router and experts, the clamped
    # SwiGLU, a 128-token window on every second layer, YaRN without rounding
    "gpt-oss-small": ("gpt_oss", dict(hidden_size=512, intermediate_size=512, num_local_experts=16,
                                      num_experts_per_tok=4, num_hidden_layers=6, num_attention_heads=8,
                                      num_key_value_heads=4, head_dim=64, sliding_window=128, vocab_size=32000,
                                      max_position_embeddings=2048, tie_word_embeddings=False,
                                      rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                       "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                       "original_max_position_embeddings": 512})),
    "tiny-moe": ("qwen3_moe", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                                   num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                   max_position_embeddings=256, tie_word_embeddings=True)),
}
FP32_MAX = 2e-3
BF16_FACTOR, BF16_SLACK = 2.0, 0.02
MIN_SPREAD = 0.3
GREEDY_MIN_FRAC = 0.75
TRAIN_COMPILED_FWD_MAX, TRAIN_COMPILED_GRAD_REL = 1e-4, 1e-3  # fp32, compiled layers vs eager (CPU: 2e-6)
NO_DEVICE = 3


# ---------------------------------------------------------------------------------------------
# set-up


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "npu", "cpu"])
    p.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"], help="dtype of the decode speed check")
    p.add_argument("--batch", type=int, default=8, help="sequences in the parity and update checks")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence in the parity and update checks")
    p.add_argument("--gen-batch", type=int, default=64, help="prompts in the greedy and decode checks")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--speed-rows", type=int, default=16, help="sequences in the speed check's update")
    p.add_argument("--speed-seq", type=int, default=1024,
                   help="tokens per sequence in the speed check (half prompt; capped at the shape's positions)")
    p.add_argument("--speed-repeat", type=int, default=5, help="timed updates per side in the speed check")
    p.add_argument("--ray-steps", type=int, default=5)
    p.add_argument("--ray-variants", default="fp32,bf16",
                   help=f"comma list of the ray_gpt check's runs, of {','.join(RAY_VARIANTS)}")
    p.add_argument("--skip-ray", action="store_true", help="leave out the ray_gpt check (e.g. no ray installed)")
    p.add_argument("--only", default=None,
                   help=f"comma list of the checks to run, of {','.join(n for n, _ in CHECKS)} (default: all)")
    p.add_argument("--log-dir", default=None, help="write each ray_gpt run's stdout and stderr here")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    for key in ("batch", "seq", "gen_batch", "new_tokens", "ray_steps", "speed_rows", "speed_seq", "speed_repeat"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.only is not None:
        names = [n for n, _ in CHECKS]
        args.only = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = [x for x in args.only if x not in names]
        if unknown or not args.only:
            p.error(f"--only takes a comma list of {', '.join(names)}; got {unknown or 'nothing'}")
    args.ray_variants = [x.strip() for x in args.ray_variants.split(",") if x.strip()]
    bad = [x for x in args.ray_variants if x not in RAY_VARIANTS]
    if bad or not args.ray_variants:
        p.error(f"--ray-variants takes a comma list of {', '.join(RAY_VARIANTS)}; got {bad or 'nothing'}")
    if args.seq < 8 or args.seq > SHAPES[args.shape][1]["max_position_embeddings"]:
        p.error(f"--seq must be between 8 and the shape's max_position_embeddings, got {args.seq}")
    return args


def pick_platform(requested: str) -> str | None:
    """The platform name to run on, or None (with the reason printed) when the accelerator asked
    for is absent. --device cpu is the self-test of this script."""
    from mindspeed_rl.platform.base import cuda_available, npu_available, resolve_name

    if requested == "cpu":
        return "cpu"
    found = resolve_name("auto")
    if requested == "auto" and found != "cpu":
        return found
    if requested == "cuda" and cuda_available() or requested == "npu" and npu_available():
        return requested
    what = "GPU or NPU" if requested == "auto" else requested.upper()
    print(f"gpu_smoke: no {what} is visible to torch on this machine, so nothing was checked; run it on a "
          f"machine with one (or pass --device cpu to exercise the script itself).")
    return None


def init_world(platform) -> tuple[torch.device, bool]:
    """A world-size-1 process group on the platform's backend (unless the process has one already)
    and megatron's TP=PP=1 state; (device, whether the group was made here)."""
    from mindspeed_rl.distributed.worker_env import init_local_world
    from mindspeed_rl.models.builder import init_parallel_state

    device = platform.set_device(0)
    made = init_local_world(platform.dist_backend)

    init_parallel_state(1, 1, seed=1234)
    return device, made


def save_random_hf(shape: str, out_dir: str, seed: int = 0):
    """A random HF CausalLM of `shape` with weights that give log-probs a spread: linear weights (and
    experts, stacked or not) N(0, 0.5/sqrt(fan_in)), embeddings N(0, 1/sqrt(hidden)), norms
    1 + N(0, 0.1). Returns it (fp32, CPU)."""
    import transformers as tf

    arch, fields = SHAPES[shape]
    cfg_cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "qwen3_moe": tf.Qwen3MoeConfig,
               "qwen2_moe": tf.Qwen2MoeConfig, "deepseek_v3": getattr(tf, "DeepseekV3Config", None),
               "gpt_oss": getattr(tf, "GptOssConfig", None)}[arch]
    model_cls = {"llama": tf.LlamaForCausalLM, "qwen2": tf.Qwen2ForCausalLM, "qwen3_moe": tf.Qwen3MoeForCausalLM,
                 "qwen2_moe": tf.Qwen2MoeForCausalLM, "deepseek_v3": getattr(tf, "DeepseekV3ForCausalLM", None),
                 "gpt_oss": getattr(tf, "GptOssForCausalLM", None)}[arch]
    if cfg_cls is None:
        raise SystemExit(f"gpu_smoke: transformers {tf.__version__} has no {arch} model; --shape {shape} needs one "
                         f"that does (4.51 or later; gpt-oss: 4.55).")
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**fields)).eval()
    hidden = fields["hidden_size"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed" in name or "lm_head" in name:
                p.normal_(0.0, hidden ** -0.5)
            elif name.endswith("self_attn.sinks"):  # gpt-oss: sink logits that take a share of each softmax
                p.normal_(0.0, 1.0)
            elif arch == "gpt_oss" and name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # (E, in, out)
                p.normal_(0.0, 0.5 * p.shape[-2] ** -0.5)
            elif p.dim() >= 2:  # (out, in), or transformers 5's stacked experts (E, out, in)
                p.normal_(0.0, 0.5 * p.shape[-1] ** -0.5)
            else:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out_dir)
    return model


def build_loaded(hf_dir: str, dtype: torch.dtype, device: torch.device, **extra):
    """Our model of the checkpoint in hf_dir, on `device` in `dtype`, and its Megatron args (+ `extra`,
    e.g. moe_grouped_gemm=True)."""
    from mindspeed_rl.models.builder import build_gpt_model, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    margs = {**model_config_from_hf(read_hf_config(hf_dir)), **extra}
    model = build_gpt_model(margs, params_dtype=dtype, device=device)
    load_hf_checkpoint(model, hf_dir, margs)
    return model, margs


def active_params(model, margs) -> int:
    """Parameters one token passes through, the N of 6·N·tokens: all of a dense model; of an MoE model
    the routed experts count topk / num_experts (shared experts count in full)."""
    from mindspeed_rl.models.hf_bridge.sharding import is_moe

    share = int(margs["moe_router_topk"]) / int(margs["num_experts"]) if is_moe(margs) else 1.0
    return int(sum(p.numel() * (share if ".experts." in f".{name}" else 1.0) for name, p in model.named_parameters()))


def trainer(model, lr: float = 1e-4, **kw):
    """(DDP, optimizer, scheduler) of a bf16 / fp32 model, one rank, fp32 main params."""
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp

    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    kw.setdefault("train_iters", 10)
    optimizer, scheduler = build_optimizer([ddp], lr=lr, use_distributed_optimizer=False,
                                           params_dtype=next(model.parameters()).dtype, **kw)
    return ddp, optimizer, scheduler


def token_batch(vocab: int, batch: int, seq: int, device: torch.device, seed: int = 1):
    """(B, S) random ids and a mask with a left-padded first row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, : seq // 4] = 0
    return ids.to(device), mask.to(device)


def hf_log_probs(hf, ids, mask) -> torch.Tensor:
    """(B, S-1) float32 log-probs of ids[:, 1:] under transformers (positions counted over real tokens)."""
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    return torch.log_softmax(logits.float()[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def our_log_probs(model, ids, mask, vocab: int) -> torch.Tensor:
    from mindspeed_rl.models.forward import compute_log_probs

    model.eval()
    return compute_log_probs(model, ids, mask, micro_batch_size=ids.shape[0], vocab_size=vocab)[0]


# ---------------------------------------------------------------------------------------------
# checks: each returns (passed, figures)


def check_build(ctx) -> tuple[bool, dict]:
    from mindspeed_rl.platform import placement_problems

    figures, ok = {}, True
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model, _ = build_loaded(ctx["hf_dir"], dtype, ctx["device"])
        problems = placement_problems(model, ctx["device"], dtype)
        figures[f"{name}_misplaced"] = problems[:5]
        figures[f"{name}_params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
        ok = ok and not problems
        ctx[f"model_{name}"] = model
    return ok, figures


def bf16_bound(ref_err: float) -> float:
    return BF16_FACTOR * ref_err + BF16_SLACK


def check_parity(ctx) -> tuple[bool, dict]:
    hf32, vocab, device = ctx["hf"], ctx["vocab"], ctx["device"]
    ids, mask = token_batch(vocab, ctx["args"].batch, ctx["args"].seq, device)
    valid = mask[:, 1:].bool() & mask[:, :-1].bool()
    ref = hf_log_probs(hf32, ids, mask)[valid]
    ours32 = our_log_probs(ctx["model_fp32"], ids, mask, vocab)[valid]
    hf16 = hf_log_probs(ctx["hf_bf16"], ids, mask)[valid]
    ours16 = our_log_probs(ctx["model_bf16"], ids, mask, vocab)[valid]
    d32, d16, dref = (ours32 - ref).abs(), (ours16 - ref).abs(), (hf16 - ref).abs()
    f = {"spread_std": float(ref.std()), "fp32_max": float(d32.max()), "fp32_mean": float(d32.mean()),
         "bf16_max": float(d16.max()), "bf16_mean": float(d16.mean()),
         "hf_bf16_max": float(dref.max()), "hf_bf16_mean": float(dref.mean())}
    f["bf16_max_bound"], f["bf16_mean_bound"] = bf16_bound(f["hf_bf16_max"]), bf16_bound(f["hf_bf16_mean"])
    ok = (f["spread_std"] > MIN_SPREAD and f["fp32_max"] <= FP32_MAX and f["bf16_max"] <= f["bf16_max_bound"]
          and f["bf16_mean"] <= f["bf16_mean_bound"])
    return ok, f


def prompts_for(vocab: int, n: int, seed: int = 2) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(8, 17, (n,), generator=g)
    return [torch.randint(0, vocab, (int(k),), generator=g).tolist() for k in lens]


def hf_greedy(hf, prompts, new_tokens: int, device) -> tuple[torch.Tensor, float]:
    """Left-padded transformers generate (greedy, exactly new_tokens each); (B, new_tokens), seconds."""
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    ids, mask = ids.to(device), mask.to(device)
    sync = ctx_sync()
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    sync()
    return out[:, P:].cpu(), time.perf_counter() - t0


def native_greedy(model, vocab: int, prompts, new_tokens: int, engine=None) -> tuple[torch.Tensor, float]:
    """The native engine's greedy continuations (a fresh eager engine, or `engine`); (B, new_tokens),
    seconds."""
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    if engine is None:
        engine = NativeEngine(model, vocab_size=vocab, max_length=max(map(len, prompts)) + new_tokens)
    sync = ctx_sync()
    sync()
    t0 = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(do_sample=False, max_new_tokens=new_tokens, ignore_eos=True))
    sync()
    return out.responses.cpu(), time.perf_counter() - t0


def ctx_sync() -> Callable[[], None]:
    from mindspeed_rl.platform import get_platform

    return get_platform().synchronize


def check_greedy(ctx) -> tuple[bool, dict]:
    a = ctx["args"]
    prompts = prompts_for(ctx["vocab"], min(a.gen_batch, 16))
    ref, _ = hf_greedy(ctx["hf"], prompts, min(a.new_tokens, 16), ctx["device"])
    ours, _ = native_greedy(ctx["model_fp32"], ctx["vocab"], prompts, min(a.new_tokens, 16))
    same = int(sum(torch.equal(x, y) for x, y in zip(ours, ref)))
    return same >= math.ceil(GREEDY_MIN_FRAC * len(prompts)), {"rows_identical": same, "rows": len(prompts)}


def update_batch(a, vocab: int, device: torch.device) -> tuple[int, dict]:
    """(prompt length, a policy-update batch): --batch rows of --seq tokens, the first half prompt
    (row 0's left-padded), random advantages, uniform old / reference log-probs."""
    P, T = a.seq // 2, a.seq - a.seq // 2
    ids, mask = token_batch(vocab, a.batch, a.seq, device, seed=5)
    g = torch.Generator().manual_seed(6)
    return P, {"input_ids": ids, "attention_mask": mask, "response_mask": torch.ones(a.batch, T, device=device),
               "advantages": torch.randn(a.batch, T, generator=g).to(device),
               "old_log_probs": torch.full((a.batch, T), -math.log(vocab), device=device),
               "ref_log_probs": torch.full((a.batch, T), -math.log(vocab), device=device)}


def check_update(ctx) -> tuple[bool, dict]:
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    a, device, vocab = ctx["args"], ctx["device"], ctx["vocab"]
    model, margs = build_loaded(ctx["hf_dir"], torch.bfloat16, device)
    ddp, optimizer, scheduler = trainer(model)
    P, batch = update_batch(a, vocab, device)
    before = [p.detach().float().clone() for p in model.parameters()]
    s = PolicyLossSettings(use_kl_loss=True, kl_loss_coef=0.01, vocab_size=vocab)
    model.train()
    sync = ctx_sync()
    sync()
    t0 = time.perf_counter()
    stats = policy_update_step(ddp, optimizer, scheduler, batch, P, max(1, a.batch // 2), s)
    sync()
    seconds = time.perf_counter() - t0
    changed = sum(not torch.equal(b, p.detach().float()) for b, p in zip(before, model.parameters()))
    n = active_params(model, margs)
    f = {"pg_loss": stats["actor/pg_loss"], "kl_loss": stats["actor/kl_loss"], "grad_norm": stats["actor/grad_norm"],
         "skipped": stats["actor/update_skipped"], "params_changed": changed, "params": len(before),
         "seconds": seconds, "tflops_6nt": 6 * n * a.batch * a.seq / seconds / 1e12}
    ok = (all(math.isfinite(f[k]) for k in ("pg_loss", "kl_loss", "grad_norm")) and f["grad_norm"] > 0
          and f["skipped"] == 0 and changed > 0)
    return ok, f


def check_rounding(ctx) -> tuple[bool, dict]:
    from mindspeed_rl.models import stochastic_rounding as sr
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    a, device, vocab = ctx["args"], ctx["device"], ctx["vocab"]
    n, ulp, frac = sr.BLOCK + 4096, 2.0 ** -7, 0.3

    def rounded(x, key, start=0):
        return sr.stochastic_round_(torch.empty(x.numel(), dtype=torch.bfloat16, device=device), x, key, start)

    out = rounded(torch.full((n,), 1.0 + frac * ulp, device=device), (1, 2)).float()
    p_up, sigma = ((out - 1.0) / ulp).mean().item(), (frac * (1 - frac) / n) ** 0.5
    v = (torch.randn(n, generator=torch.Generator().manual_seed(3)) * 0.05).to(device)
    whole, start = rounded(v, (4,)), sr.BLOCK - 100
    exact = v.to(torch.bfloat16).float()
    f = {"noise": "host" if sr.noise_on_host(device) else "device generator", "p_up": p_up, "sigma": sigma,
         "neighbours": bool(((out == 1.0) | (out == 1.0 + ulp)).all()),
         "exact_kept": torch.equal(rounded(exact, (5,)).float(), exact),
         "shard_equals_slice": torch.equal(rounded(v[start:start + 1000], (4,), start), whole[start:start + 1000])}
    # NaN bit patterns that the noise would carry into the sign or truncation would make inf stay NaN
    nans = torch.tensor([0x7FFFFFFF, -1, 0x7F800001] * 100, dtype=torch.int32).view(torch.float32).to(device)
    f["nan_kept"] = bool(torch.isnan(rounded(nans, (6,))).all())
    if device.type == "cuda":  # the copy queues its kernels with no host sync (one per parameter would stall)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            rounded(v, (7,))
            f["host_syncs"] = "none"
        except RuntimeError as e:
            f["host_syncs"] = str(e).splitlines()[0][:200]
        finally:
            torch.cuda.set_sync_debug_mode(0)
    model, _ = build_loaded(ctx["hf_dir"], torch.bfloat16, device)
    ddp, optimizer, scheduler = trainer(model, stochastic_rounding=True, seed=9)
    P, batch = update_batch(a, vocab, device)
    model.train()
    policy_update_step(ddp, optimizer, scheduler, batch, P, max(1, a.batch // 2),
                       PolicyLossSettings(use_kl_loss=True, kl_loss_coef=0.01, vocab_size=vocab))
    keys = sr.param_keys([ddp])
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    pairs = [(m, w) for o in inner for mg, wg in zip(o.float16_groups, o.fp32_from_float16_groups) for m, w in zip(mg, wg)]
    f["update_weights"] = len(pairs)
    f["update_rounded_as_expected"] = all(
        torch.equal(m.detach(), sr.stochastic_round_(torch.empty_like(m), w.detach(), (9, 0) + keys[id(m)]))
        for m, w in pairs)
    ok = (f["neighbours"] and f["exact_kept"] and f["shard_equals_slice"] and abs(p_up - frac) < 5 * sigma
          and f["nan_kept"] and f.get("host_syncs", "none") == "none"
          and len(pairs) > 0 and f["update_rounded_as_expected"])
    return ok, f


def check_decode(ctx) -> tuple[bool, dict]:
    a = ctx["args"]
    name = a.dtype
    model, hf = (ctx["model_fp32"], ctx["hf"]) if name == "fp32" else (ctx["model_bf16"], ctx["hf_bf16"])
    prompts = prompts_for(ctx["vocab"], a.gen_batch, seed=3)
    hf_greedy(hf, prompts[:2], 2, ctx["device"])  # warm-up: first-call allocations and kernels
    native_greedy(model, ctx["vocab"], prompts[:2], 2)
    _, hf_s = hf_greedy(hf, prompts, a.new_tokens, ctx["device"])
    _, ours_s = native_greedy(model, ctx["vocab"], prompts, a.new_tokens)
    tokens = len(prompts) * a.new_tokens
    f = {"dtype": name, "batch": len(prompts), "new_tokens": a.new_tokens, "native_tok_s": tokens / ours_s,
         "transformers_tok_s": tokens / hf_s}
    f["ratio"] = f["native_tok_s"] / f["transformers_tok_s"]
    if ctx["device"].type == "cuda":  # the decode loop's host syncs per token (the launch queue stalls at each)
        f["host_syncs_per_token"] = host_syncs(lambda: native_greedy(model, ctx["vocab"], prompts[:8], 16)) / 16
    if SHAPES[a.shape][0].endswith("_moe"):  # grouped experts: with the static dispatch, no sync in a MoE layer
        grouped, _ = build_loaded(ctx["hf_dir"], model.embedding.word_embeddings.weight.dtype, ctx["device"],
                                  moe_grouped_gemm=True)
        native_greedy(grouped, ctx["vocab"], prompts[:2], 2)
        f["grouped_same_tokens"] = bool(torch.equal(native_greedy(grouped, ctx["vocab"], prompts[:8], 16)[0],
                                                    native_greedy(model, ctx["vocab"], prompts[:8], 16)[0]))
        f["grouped_native_tok_s"] = tokens / native_greedy(grouped, ctx["vocab"], prompts, a.new_tokens)[1]
        if ctx["device"].type == "cuda":
            f["grouped_host_syncs_per_token"] = host_syncs(
                lambda: native_greedy(grouped, ctx["vocab"], prompts[:8], 16)) / 16
        del grouped
    return True, f


def check_compiled(ctx) -> tuple[bool, dict]:
    from mindspeed_rl.rollout.kv_cache import compile_unsupported
    from mindspeed_rl.rollout.native import NativeEngine

    a = ctx["args"]
    why = compile_unsupported(ctx["model_fp32"], ctx["platform"])
    if why is not None:
        return True, {"not_compiled_here": why}
    vocab = ctx["vocab"]

    def compiled_engine(model, prompts, new_tokens):
        return NativeEngine(model, vocab_size=vocab, max_length=max(map(len, prompts)) + new_tokens,
                            compile_decode=True)

    prompts, n = prompts_for(vocab, min(a.gen_batch, 16)), min(a.new_tokens, 16)
    eager, _ = native_greedy(ctx["model_fp32"], vocab, prompts, n)
    engine = compiled_engine(ctx["model_fp32"], prompts, n)
    ours, fp32_first_s = native_greedy(None, vocab, prompts, n, engine)
    same = int(sum(torch.equal(x, y) for x, y in zip(ours, eager)))
    f = {"fp32_rows_identical": same, "rows": len(prompts), "fp32_first_call_s": fp32_first_s,
         "still_compiled": engine.compiled}
    model = ctx["model_fp32"] if a.dtype == "fp32" else ctx["model_bf16"]
    prompts = prompts_for(vocab, a.gen_batch, seed=3)
    engine = compiled_engine(model, prompts, a.new_tokens)
    _, f["first_call_s"] = native_greedy(None, vocab, prompts, a.new_tokens, engine)  # compiles (bf16: again)
    _, compiled_s = native_greedy(None, vocab, prompts, a.new_tokens, engine)
    native_greedy(model, vocab, prompts[:2], 2)  # warm-up of the eager engine
    _, eager_s = native_greedy(model, vocab, prompts, a.new_tokens)
    tokens = len(prompts) * a.new_tokens
    f.update(dtype=a.dtype, batch=len(prompts), new_tokens=a.new_tokens, compiled_tok_s=tokens / compiled_s,
             eager_tok_s=tokens / eager_s, speedup=eager_s / compiled_s)
    f["still_compiled"] = f["still_compiled"] and engine.compiled
    # judged on the fp32 rows (`prompts` is the speed part's batch by now)
    return same >= math.ceil(GREEDY_MIN_FRAC * f["rows"]) and f["still_compiled"], f


def check_train_compiled(ctx) -> tuple[bool, dict]:
    """use_torch_compile on the device (models/compiled_layers.py): fp32 log-probs before and after one
    policy update, and the update's loss and grad norm, compiled against eager from the same weights;
    then one bf16 update of the speed check's size, compiled against eager (first call, median, memory)."""
    from mindspeed_rl.models import compiled_layers
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from mindspeed_rl.platform.base import compiled_layers as platform_compiles_layers

    if not platform_compiles_layers(ctx["platform"]):
        return True, {"not_compiled_here": f"the {ctx['platform']} platform runs its decoder layers eagerly"}
    a, device, vocab = ctx["args"], ctx["device"], ctx["vocab"]
    P, batch = update_batch(a, vocab, device)
    s = PolicyLossSettings(use_kl_loss=True, kl_loss_coef=0.01, vocab_size=vocab)

    def fp32_side(compiled: bool):
        model, _ = build_loaded(ctx["hf_dir"], torch.float32, device)
        layers = compiled_layers.install(model) if compiled else 0
        before = our_log_probs(model, batch["input_ids"], batch["attention_mask"], vocab)
        ddp, optimizer, scheduler = trainer(model)
        model.train()
        stats = policy_update_step(ddp, optimizer, scheduler, batch, P, max(1, a.batch // 2), s)
        after = our_log_probs(model, batch["input_ids"], batch["attention_mask"], vocab)
        return layers, before, after, stats

    _, eager_before, eager_after, eager_stats = fp32_side(False)
    layers, before, after, stats = fp32_side(True)
    f: dict[str, Any] = {"layers_compiled": layers, "fp32_forward_max": float((before - eager_before).abs().max()),
                         "fp32_after_update_max": float((after - eager_after).abs().max()),
                         "fp32_grad_norm_rel": abs(stats["actor/grad_norm"] / eager_stats["actor/grad_norm"] - 1),
                         "fp32_pg_loss_diff": abs(stats["actor/pg_loss"] - eager_stats["actor/pg_loss"])}
    if layers == 0:  # MoE layers stay eager: nothing is compiled, the rest is moot
        f["not_compiled_here"] = "no dense decoder layer (MoE layers stay eager)"
        return compiled_layers.failed() is None, f

    rows, seq, P2, big = speed_batch(ctx)
    for label, prepare in (("eager", None), ("compiled", compiled_layers.install)):  # the first call compiles
        u = timed_update(ctx, big, P2, rows, s, prepare)
        f[f"bf16_{label}_first_s"], f[f"bf16_{label}_s"] = u["first_s"], statistics.median(u["times"])
        f[f"bf16_{label}_peak_mib"] = u["peak_mib"]
    f.update(rows=rows, seq=seq, bf16_speedup=f["bf16_eager_s"] / f["bf16_compiled_s"],
             still_compiled=compiled_layers.failed() is None)
    ok = (f["still_compiled"] and f["fp32_forward_max"] <= TRAIN_COMPILED_FWD_MAX
          and f["fp32_after_update_max"] <= FP32_MAX and f["fp32_grad_norm_rel"] <= TRAIN_COMPILED_GRAD_REL)
    return ok, f


def host_syncs(fn) -> int:
    """How many synchronizing CUDA calls fn makes (torch's sync debug mode, one warning each)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in seen)


def _timed(step, repeat: int, sync) -> list[float]:
    """Seconds of `repeat` calls of step() after 2 warm-ups, each between device syncs."""
    for _ in range(2):
        step()
    times = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _module(folder: str, name: str):
    """<folder>/<name>.py as a module (bench/ and scripts/ are not packages)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def speed_batch(ctx) -> tuple[int, int, int, dict]:
    """(rows, seq, prompt length, batch on the device): the speed checks' one micro-batch of
    --speed-rows x --speed-seq tokens (capped at the shape's positions), the first half prompt."""
    a = ctx["args"]
    rows, seq = a.speed_rows, min(a.speed_seq, SHAPES[a.shape][1]["max_position_embeddings"])
    batch = _module("bench", "update_profile").batch_of(rows, seq // 2, seq - seq // 2, ctx["vocab"])
    return rows, seq, seq // 2, {k: v.to(ctx["device"]) for k, v in batch.items()}


def timed_update(ctx, batch: dict, P: int, rows: int, s, prepare: Optional[Callable] = None, **extra) -> dict:
    """Our bf16 policy update of `batch` (one micro-batch), timed on a fresh model of the checkpoint
    (`extra`: more Megatron args; `prepare(model)` before the optimizer, e.g. compiling its layers):
    first_s (the first call, a compile's included), times (--speed-repeat after 2 warm-ups),
    peak_mib (CUDA), n (active parameters) and every call's pg loss."""
    from mindspeed_rl.models.train_step import policy_update_step

    device, sync = ctx["device"], ctx_sync()
    _reset_peak(device)
    model, margs = build_loaded(ctx["hf_dir"], torch.bfloat16, device, **extra)
    if prepare is not None:
        prepare(model)
    ddp, optimizer, scheduler = trainer(model, lr=1e-5, train_iters=100, weight_decay=0.01, clip_grad=1.0)
    model.train()
    losses = []

    def step():
        losses.append(policy_update_step(ddp, optimizer, scheduler, batch, P, rows, s)["actor/pg_loss"])

    sync()
    t0 = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - t0
    times = _timed(step, ctx["args"].speed_repeat, sync)
    return {"first_s": first_s, "times": times, "peak_mib": _peak_mib(device), "n": active_params(model, margs),
            "losses": losses}


def check_speed(ctx) -> tuple[bool, dict]:
    from mindspeed_rl.models.train_step import PolicyLossSettings

    update_profile = _module("bench", "update_profile")
    a, device, vocab = ctx["args"], ctx["device"], ctx["vocab"]
    rows, seq, P, batch = speed_batch(ctx)
    sync = ctx_sync()
    f: dict[str, Any] = {"rows": rows, "seq": seq, "tokens": rows * seq}

    s = PolicyLossSettings(use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.001, vocab_size=vocab)
    u = timed_update(ctx, batch, P, rows, s)
    ours, n, losses = u["times"], u["n"], u["losses"]
    f["ours_peak_mib"] = u["peak_mib"]
    if SHAPES[a.shape][0].endswith("_moe"):  # the experts as grouped GEMMs (moe_grouped_gemm), side by side
        g = timed_update(ctx, batch, P, rows, s, moe_grouped_gemm=True)
        f["ours_grouped_s"], f["ours_grouped_peak_mib"] = statistics.median(g["times"]), g["peak_mib"]
        losses += g["losses"]

    _reset_peak(device)
    step = update_profile.theirs(ctx["hf_dir"], batch, P, kl=True, dtype="bf16")
    theirs = _timed(step, a.speed_repeat, sync)
    f["transformers_peak_mib"] = _peak_mib(device)
    del step
    _reset_peak(device)

    wl = _module("bench", "grpo_step_workload")  # the bench's roofline: best bf16 mm, 8192^3 on a device
    peak = wl.matmul_peak(torch.get_num_threads(), n=1024, repeats=10, dtype="bf16", device=device.type) / 1e12
    for side, times in (("ours", ours), ("transformers", theirs)):
        t = statistics.median(times)
        f[f"{side}_s"] = t
        f[f"{side}_tflops_6nt"] = 6 * n * rows * seq / t / 1e12
        f[f"{side}_of_matmul_peak"] = f[f"{side}_tflops_6nt"] / peak
    f["matmul_tflops_bf16"] = peak
    f["ours_over_transformers"] = f["ours_s"] / f["transformers_s"]
    if "ours_grouped_s" in f:
        f["ours_grouped_over_transformers"] = f["ours_grouped_s"] / f["transformers_s"]
        f["ours_grouped_tflops_6nt"] = 6 * n * rows * seq / f["ours_grouped_s"] / 1e12
    return all(math.isfinite(x) for x in losses) and min(ours + theirs) > 0, f


_RAY = _module("scripts", "gpu_smoke_ray")  # the ray_gpt check lives beside this script
RAY_VARIANTS, ray_gpt_command, summarize_run, startup_of, check_ray_gpt = (
    _RAY.RAY_VARIANTS, _RAY.ray_gpt_command, _RAY.summarize_run, _RAY.startup_of, _RAY.check_ray_gpt)

CHECKS: list[tuple[str, Callable]] = [("build", check_build), ("parity", check_parity), ("greedy", check_greedy),
                                      ("update", check_update), ("rounding", check_rounding), ("decode", check_decode),
                                      ("compiled", check_compiled), ("train_compiled", check_train_compiled),
                                      ("speed", check_speed), ("ray_gpt", check_ray_gpt)]


# ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, platform_name: str) -> dict[str, Any]:
    from mindspeed_rl.platform import get_platform

    platform = get_platform(platform_name)
    platform.patch()
    device, made_world = init_world(platform)
    results: dict[str, Any] = {"device": f"{platform.device_name(device.index or 0)}, torch {torch.__version__}",
                               "torch": torch.__version__,
                               "shape": args.shape, "checks": {}}
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        hf_dir = os.path.join(tmp, "hf")
        hf = save_random_hf(args.shape, hf_dir)
        ctx = {"args": args, "platform": platform.name, "device": device, "tmp": tmp, "hf_dir": hf_dir,
               "vocab": SHAPES[args.shape][1]["vocab_size"], "hf": hf.to(device),
               "hf_bf16": copy.deepcopy(hf).to(device, torch.bfloat16)}
        for name, check in CHECKS:
            if name == "ray_gpt" and args.skip_ray or args.only is not None and name not in args.only:
                reason = "--skip-ray" if name == "ray_gpt" and args.skip_ray else "not in --only"
                results["checks"][name] = {"status": "SKIP", "figures": {"reason": reason}}
                continue
            t0 = time.perf_counter()
            try:
                ok, figures = check(ctx)
                status = "PASS" if ok else "FAIL"
            except Exception as err:  # one check's crash is its FAIL; the others still run
                status, figures = "FAIL", {"error": f"{type(err).__name__}: {err}",
                                           "traceback": traceback.format_exc()[-3000:]}
            results["checks"][name] = {"status": status, "seconds": round(time.perf_counter() - t0, 2),
                                       "figures": figures}
            print(f"{name:<8} {status:<5} {json.dumps(figures, default=_short)}", flush=True)
            if args.json:  # after every check: a run stopped by a time limit still leaves what it measured
                write_results(results, args.json, complete=False)
    if made_world:  # a caller's own process group (a test session's, say) stays up
        torch.distributed.destroy_process_group()
    return results


def _short(x):
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def write_results(results: dict, path: str, complete: bool) -> list[str]:
    """Write the results JSON (atomically: a kill mid-write leaves the last whole file), with
    `passed` over the checks so far and `complete` false until every check has run. Returns the
    names of the failed checks."""
    failed = [k for k, v in results["checks"].items() if v["status"] == "FAIL"]
    results.update(passed=not failed, complete=complete)
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, default=_short)
    os.replace(tmp, path)
    return failed


def main(argv=None) -> int:
    args = parse_args(argv)
    name = pick_platform(args.device)
    if name is None:
        return NO_DEVICE
    results = run(args, name)
    failed = [k for k, v in results["checks"].items() if v["status"] == "FAIL"]
    results["passed"] = not failed
    if args.json:
        write_results(results, args.json, complete=True)
    print(f"gpu_smoke on {results['device']}: " + ("all checks passed" if not failed else f"FAILED: {', '.join(failed)}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
