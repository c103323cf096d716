"""Verified weight sync: after every weight update of a rollout engine that holds its own copy of
the weights (vLLM, the generation ranks of the train/infer split), the engine generates on a small
fixed probe and the training forward scores the same tokens; the run stops when the two disagree.

    prompts = probe_prompts(vocab_size)                # fixed token ids, the same every step
    ... engine generates on them (rollout settings, top-k/top-p off, fixed length, fixed seed) ...
    ... training forward computes the log-probs of those tokens at the same temperature ...
    metrics = check_sync(train_logp, rollout_logp, mask, tolerance, step)   # raises RolloutSyncError

Why: stale or corrupted rollout weights (sleep/wake cycles that drop a tensor, graph capture that
keeps old pointers, a layout transpose, a fused q/k/v half written) silently turn GRPO off-policy;
the log-probs of a probe catch all of them at the cost of one short generation per step.

Bound: fp32 1e-4 (the same weights in two fp32 implementations agree to ~1e-5 on the random test
models and to 2.2e-5 on the real SmolLM2-135M, whose probe moves by 2.1e-3 when the engine is one
1e-5 update behind: tests/vllm/test_vllm_real_model.py);
bf16 / fp16 0.5 nats: two bf16 implementations (different GEMM and softmax kernels, 8-bit mantissa)
differ by up to a few tenths on a token's log-prob, while stale or corrupted weights differ by
several nats. `sync_check_tolerance` overrides it.

MoE models: routing is discontinuous. Where two experts' router scores nearly tie, the engine and
the training forward may pick different experts for one token with the same weights, and that
token's log-prob then differs by far more than the bound (measured: 0.026 on one of 16 probe tokens,
synced fp32 weights, tiny Qwen3-MoE, 1 step of 8; every other token within 5e-7). So for MoE the
check fires only when more than a quarter of the probe's tokens are beyond the bound: stale or
corrupted weights move every token, a near-tie moves a few.
"""
from __future__ import annotations

import torch

TOLERANCE = {"fp32": 1e-4, "bf16": 0.5, "fp16": 0.5}
# 4 prompts x 4 new tokens: 16 compared log-probs from the prefill and 3 decode steps (KV-cache
# reads). An engine step costs about the same for 2 or 4 rows at these sizes, so this is cheaper
# than 2 prompts x 8 tokens for the same 16 log-probs (bench/rollout_decode.py, 10M model, eager
# vLLM: probe 0.088 s -> 0.053 s, against 1.07 s for the step's 16 x 64 generation).
PROBE_PROMPTS = 4  # prompts of the probe
PROBE_PROMPT_LEN = 8
PROBE_NEW_TOKENS = 4
PROBE_SEED = 20240601
MOE_OUTLIERS = 0.25  # MoE: the fraction of probe tokens that may exceed the bound (near-tie routing)


class RolloutSyncError(RuntimeError):
    """The rollout engine's weights do not reproduce the training forward after a sync."""


def tolerance(params_dtype: str, override: float | None = None) -> float:
    """The largest accepted |log-prob difference| for the actor's dtype ("fp32", "bf16", "fp16")."""
    return float(override) if override is not None else TOLERANCE[params_dtype]


def probe_prompts(vocab_size: int, num: int = PROBE_PROMPTS, length: int = PROBE_PROMPT_LEN) -> list[list[int]]:
    """num fixed prompts of `length` token ids in [0, vocab_size), the same on every call and rank."""
    g = torch.Generator().manual_seed(PROBE_SEED)
    return torch.randint(0, vocab_size, (num, length), generator=g).tolist()


def diff_metrics(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """|training - rollout| log-prob over the masked tokens: rollout/logp_diff_max and _mean ({} if none)."""
    valid = mask.bool()
    if not valid.any():
        return {}
    diff = (train_logp.float() - rollout_logp.float()).abs()[valid]
    return {"rollout/logp_diff_max": float(diff.max()), "rollout/logp_diff_mean": float(diff.mean())}


def check_sync(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, tol: float,
               step: int, where: str = "the rollout engine", moe: bool = False) -> dict[str, float]:
    """The probe's difference metrics; raises RolloutSyncError with one sentence when max > tol
    (MoE: when more than MOE_OUTLIERS of the tokens are beyond tol), or when a difference is not
    finite.

    Args:
        train_logp / rollout_logp / mask: (B, T) on the probe's response tokens.
        step: the GRPO step about to generate with these weights (named in the sentence).
        moe: the model routes tokens to experts (see the module docstring).
    """
    metrics = diff_metrics(train_logp, rollout_logp, mask)
    if not metrics:
        raise RolloutSyncError(f"step {step}: the weight-sync probe produced no response tokens, so the weights "
                               f"of {where} could not be checked.")
    worst, mean = metrics["rollout/logp_diff_max"], metrics["rollout/logp_diff_mean"]
    diff = (train_logp.float() - rollout_logp.float()).abs()[mask.bool()]
    over, total = int((~(diff <= tol)).sum()), diff.numel()  # NaN counts as over
    finite = bool(torch.isfinite(diff).all())
    if moe and finite and over <= MOE_OUTLIERS * total:
        return metrics
    if not worst <= tol:  # NaN fails too
        routed = (f" on {over} of {total} probe tokens (an MoE model may differ on up to a quarter of them, where a "
                  f"near-tie routes a token to other experts)") if moe else ""
        raise RolloutSyncError(
            f"step {step}: after the weight sync, the log-probs of {where} on the probe differ from the training "
            f"forward by up to {worst:.4g} (mean {mean:.4g}; tolerance {tol:g}){routed}, so it is not generating "
            f"with the trained weights; stopping. Check the weight update path (names, layouts, sleep/wake), or raise "
            f"actor_rollout_ref.actor_rollout.sync_check_tolerance if this is a known numeric gap.")
    return metrics


def probe_batch(engine, vocab_size: int, do_sample: bool, temperature: float, seq_length: int) -> dict:
    """The engine's generation on the probe as a trainer batch (RolloutOutput.to_batch): fixed
    prompts, seed and length (EOS ignored, so every rank returns the same shapes), the rollout's
    temperature, top-k / top-p off (their renormalised log-probs are not the trainer's)."""
    from mindspeed_rl.rollout.interface import SamplingParams

    params = SamplingParams(n=1, do_sample=do_sample, temperature=temperature, max_new_tokens=PROBE_NEW_TOKENS,
                            max_total_length=seq_length, ignore_eos=True, seed=PROBE_SEED)
    with torch.no_grad():
        return engine.generate(probe_prompts(vocab_size), params).to_batch()
