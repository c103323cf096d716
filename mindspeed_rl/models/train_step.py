"""One optimizer step of the clipped policy loss (+ KL loss, entropy bonus) through Megatron.

The mini-batch on this DP rank is split into micro-batches and run through megatron's
forward-backward schedule (pipeline-aware). The loss formula is the pure one from
mindspeed_rl.algorithms; this file only makes the *scale* exact under micro-batching and data
parallelism: each micro-batch divides by the token (or row) count of the WHOLE mini-batch over all
DP ranks, and the loss is multiplied by num_microbatches x DP to undo megatron's averaging over
micro-batches (schedules.py) and DDP's averaging over DP ranks. The gradient is then exactly the
gradient of the mini-batch loss, whatever the micro-batch size and DP size.

The output layer runs on the response positions only (forward.output_columns; all positions under
sequence parallelism, where the padded logits are cut before the loss). Sequence parallelism pads
each micro-batch to a multiple of TP; a list of virtual-pipeline chunks runs megatron's interleaved schedule
(models/parallel.py, models/chunks.py).

Batch layout (data/keys.py): input_ids (b, P + T) = left-padded prompt (P) + right-padded response
(T); the logits at positions P-1 .. P+T-2 predict the response tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from mindspeed_rl import algorithms as alg
from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import finalize_model_grads  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.utils import get_model_config  # noqa: E402

from mindspeed_rl.models import olmo, xielu  # noqa: E402
from mindspeed_rl.models.chunks import as_chunks  # noqa: E402
from mindspeed_rl.models.freeze import tied_sync_of_frozen_skipped  # noqa: E402
from mindspeed_rl.models.moe_replay import columns, replay_routing  # noqa: E402
from mindspeed_rl.models.forward import (  # noqa: E402
    attention_mask_4d, output_columns, padding_span, position_ids_from_mask, shape_free, token_log_probs,
    vocab_parallel_log_probs)
from mindspeed_rl.models.parallel import pad_for_sequence_parallel, sequence_parallel_multiple  # noqa: E402


@dataclass
class PolicyLossSettings:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: Optional[float] = None
    loss_agg_mode: str = "token-mean"
    use_kl_loss: bool = False
    kl_loss_type: str = "low_var_kl"
    kl_loss_coef: float = 0.001
    entropy_coeff: float = 0.0
    temperature: float = 1.0
    vocab_size: Optional[int] = None
    tis_mode: str = "off"  # truncated importance sampling vs the rollout engine's log-probs (algorithms/tis.py)
    tis_cap: float = 2.0


def response_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, prompt_width: int, temperature: float,
                       vocab_size: Optional[int], with_entropy: bool, logits_start: int = 0):
    """(b, T) log-probs (and entropy) of the response tokens from (b, P + T - logits_start, V/TP)
    logits of the columns logits_start.. (forward.output_columns; 0: every column)."""
    T = input_ids.shape[1] - prompt_width
    first = prompt_width - 1 - logits_start
    tp = parallel_state.get_tensor_model_parallel_world_size() if parallel_state.model_parallel_is_initialized() else 1
    if not with_entropy and tp == 1:
        # the whole logits tensor goes in: its gradient is written once, no slice backward (zeros + copy)
        return token_log_probs(logits, input_ids[:, prompt_width:], temperature, vocab_size, first), None
    return vocab_parallel_log_probs(logits[:, first: first + T], input_ids[:, prompt_width:],
                                    temperature, vocab_size, with_entropy)


def by_length(attention_mask: torch.Tensor, micro_batch_size: int) -> torch.Tensor:
    """Row order that puts sequences of similar length in the same micro-batch, so trimming each
    micro-batch to its own real columns saves the most (identity when there is one micro-batch).
    The loss is a sum over micro-batches with a global denominator: the order does not change it."""
    rows = attention_mask.shape[0]
    if micro_batch_size >= rows:
        return torch.arange(rows, device=attention_mask.device)
    return torch.argsort(attention_mask.sum(-1), stable=True)


def global_denominator(response_mask: torch.Tensor, mode: str) -> Optional[torch.Tensor]:
    """Token count (token-mean) or non-empty row count (seq-mean-*) of the mini-batch over all DP ranks."""
    if mode == "seq-mean-token-sum-norm":
        return None  # a constant (T): nothing to count
    local = response_mask.sum() if mode == "token-mean" else (response_mask.sum(-1) > 0).sum()
    count = local.round().long().reshape(1)  # int64: exact, and every backend (hccl too) reduces it
    if parallel_state.get_data_parallel_world_size() > 1:
        torch.distributed.all_reduce(count, group=parallel_state.get_data_parallel_group())
    return count[0].double()


def rows_to_run(batch: dict, s: PolicyLossSettings, chunks: list, micro_batch_size: int, pp: int,
                free: bool) -> Optional[torch.Tensor]:
    """Indices of the rows the update must run, or None for all of them.

    A row whose advantages are 0 on every response token adds exactly 0 to the clipped policy loss
    (-A * ratio, dual clip and TIS weights included) and to its gradient. When that loss is the only
    term (no KL loss, no entropy bonus, a dense model: MoE's load-balancing loss sees every token),
    those rows are left out of the forward and backward; the loss denominator still counts them, so
    the gradient is unchanged (the stats pg_clipfrac / ppo_kl are then means over the rows run).
    free: micro-batches may have any shape (forward.shape_free), so the last one is just smaller;
    otherwise (PP, SP, EP) zero rows fill whole micro-batches (a multiple of PP under the
    interleaved schedule). At least one row runs."""
    if s.use_kl_loss or s.entropy_coeff != 0 or get_model_config(chunks[0]).num_moe_experts:
        return None
    b = batch["advantages"].shape[0]
    matters = ((batch["advantages"] != 0) & (batch["response_mask"] > 0)).any(-1)  # NaN counts: it matters
    step = 1 if free else micro_batch_size * (pp if len(chunks) > 1 else 1)
    n = min(b, max(step, -(-int(matters.sum()) // step) * step))
    if n == b:
        return None
    return torch.cat([matters.nonzero()[:, 0], (~matters).nonzero()[:, 0]])[:n]


def finalize_grads(chunks: list) -> None:
    """megatron's finalize_model_grads (DP reduction, the TP sums of SP and q / k norm gradients, tied
    embeddings) with OLMo 2's / MiniMax-M2's TP-split q / k norm weights kept out of the TP sum
    (models/olmo.kept_from_tp_sum), a frozen tied embedding's stages not synced (models/freeze.py), and the gradients each TP rank holds a part of summed over TP (Apertus's
    xIELU scalars: models/xielu.py)."""
    with olmo.kept_from_tp_sum(chunks), tied_sync_of_frozen_skipped(chunks):
        finalize_model_grads(chunks)
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        for p in xielu.tp_partial_grads(chunks):
            grad = getattr(p, "main_grad", None)
            torch.distributed.all_reduce(grad if grad is not None else p.grad,
                                         group=parallel_state.get_tensor_model_parallel_group())


def policy_update_step(model, optimizer, scheduler, batch: dict, prompt_width: int, micro_batch_size: int,
                       s: PolicyLossSettings) -> dict[str, float]:
    """Forward-backward over the micro-batches of `batch`, then one optimizer step.

    Args:
        model: this rank's DDP-wrapped GPTModel chunk, or its list of virtual-pipeline chunks
            (interleaved schedule; the micro-batch count must then be a multiple of PP).
        batch: input_ids, attention_mask (b, P+T); response_mask, advantages (b, T); optional
            old_log_probs (b, T) (absent = exactly on-policy: the detached current log-probs) and
            ref_log_probs (b, T) (needed when s.use_kl_loss); optional routed_experts (b, P+T, L, k):
            the rollout's expert choices, replayed in the forward (models/moe_replay.py).
    Returns:
        stats on the last pipeline stage (empty elsewhere): actor/pg_loss, actor/kl_loss and
        actor/entropy as this rank's share x DP (their mean over DP ranks is the mini-batch
        value), actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower (micro-batch means),
        actor/grad_norm, actor/lr, actor/update_skipped.
    """
    chunks = as_chunks(model)
    ids = batch["input_ids"]
    b, seq = ids.shape
    if b % micro_batch_size:
        raise ValueError(f"mini-batch of {b} sequences is not divisible by micro_batch_size {micro_batch_size}")
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    if len(chunks) > 1 and (b // micro_batch_size) % pp:
        raise ValueError(f"the interleaved pipeline schedule needs the micro-batches of a mini-batch "
                         f"({b // micro_batch_size}) to be a multiple of pipeline_model_parallel_size {pp}")
    keys = [k for k in ("input_ids", "attention_mask", "response_mask", "advantages", "old_log_probs",
                        "ref_log_probs", "rollout_log_probs", "routed_experts") if k in batch]
    denom = global_denominator(batch["response_mask"], s.loss_agg_mode)  # over every row, run or not
    trim = shape_free(chunks)  # micro-batches of their own width and rows (not under PP, SP or EP)
    run = rows_to_run(batch, s, chunks, micro_batch_size, pp, trim)
    if run is not None:  # zero-advantage rows add nothing: not run
        batch = {k: batch[k][run] for k in keys}
    order = by_length(batch["attention_mask"], micro_batch_size)  # similar lengths share a micro-batch
    micro = [dict(zip(keys, parts)) for parts in zip(*(batch[k][order].split(micro_batch_size) for k in keys))]
    dp = parallel_state.get_data_parallel_world_size()
    if denom is None:  # Dr.GRPO's constant is the full response width, also for a trimmed micro-batch
        denom = float(seq - prompt_width)
    scale = len(micro) * dp
    multiple = sequence_parallel_multiple(chunks)  # SP: the sequence is split over TP ranks

    def step(data_iter, chunk):
        mb, width = next(data_iter), prompt_width
        if trim:  # no compute on columns that are padding in every row of this micro-batch
            first, end = padding_span(mb["attention_mask"])
            first, end = min(first, prompt_width - 1), max(end, prompt_width + 1)
            mb = {k: v[:, first:end] if k in ("input_ids", "attention_mask", "routed_experts")
                  else v[:, :end - prompt_width] for k, v in mb.items()}
            width = prompt_width - first
        ids, mask = pad_for_sequence_parallel(mb["input_ids"], mb["attention_mask"], multiple)
        routed = columns(mb.get("routed_experts"), 0, ids.shape[1], ids.shape[1])  # SP padding: -1
        with replay_routing(chunk, routed), output_columns(chunk, width - 1) as start:  # response logits only
            logits = chunk(ids, position_ids_from_mask(mask), attention_mask_4d(mask))
        return logits, lambda out: _loss(out, mb, width, start)

    def _loss(logits, mb, width, start):
        rmask = mb["response_mask"].float()
        logp, ent = response_log_probs(logits, mb["input_ids"], width, s.temperature, s.vocab_size,
                                       with_entropy=s.entropy_coeff != 0, logits_start=start)
        old = mb.get("old_log_probs", logp.detach())
        adv, tis = mb["advantages"], {}
        if s.tis_mode != "off" and "rollout_log_probs" in mb:
            # weights w >= 0 on the token losses; the clipped loss is positively homogeneous in A,
            # so scaling A by w weights each token's loss (dual clip included) by w
            w = alg.tis_weights(old, mb["rollout_log_probs"], rmask, s.tis_mode, s.tis_cap)
            adv = adv * w
            tis = {f"actor/{k}": v.detach() for k, v in alg.tis_stats(w, rmask, s.tis_cap).items()}
        pg, stats = alg.policy_loss(logp, old, adv, rmask, s.clip_ratio_low, s.clip_ratio_high,
                                    s.clip_ratio_c, s.loss_agg_mode, loss_denominator=denom)
        loss = pg
        out = {"actor/pg_loss": pg.detach() * dp, **{f"actor/{k}": v.detach() for k, v in stats.items()}, **tis}
        if s.use_kl_loss:
            kl = alg.aggregate_loss(alg.kl_penalty(logp, mb["ref_log_probs"], s.kl_loss_type), rmask,
                                    s.loss_agg_mode, denom)
            loss = loss + s.kl_loss_coef * kl
            out["actor/kl_loss"] = kl.detach() * dp
        if ent is not None:
            entropy = alg.aggregate_loss(ent, rmask, s.loss_agg_mode, denom)
            loss = loss - s.entropy_coeff * entropy
            out["actor/entropy"] = entropy.detach() * dp
        return loss * scale, out

    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    data = [iter(micro) for _ in chunks] if len(chunks) > 1 else iter(micro)  # one iterator per chunk
    outputs = get_forward_backward_func()(
        forward_step_func=step, data_iterator=data, model=chunks, num_microbatches=len(micro),
        seq_length=seq + (-seq % multiple), micro_batch_size=micro_batch_size, forward_only=False)
    finalize_grads(chunks)
    lr = float(optimizer.param_groups[0]["lr"])  # the rate this step uses (the scheduler moves it after)
    if _all_finite(chunks, outputs):
        ok, grad_norm, _ = optimizer.step()
    else:  # one bad batch must not poison the weights: skip the step on every rank, the trainer counts it
        ok, grad_norm = False, None
    if ok:
        scheduler.step(1)
    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return {}
    summed = {"actor/pg_loss", "actor/kl_loss", "actor/entropy"}  # shares of the mini-batch loss: add up
    stats = {}
    for key in outputs[0]:
        values = torch.stack([o[key].float() for o in outputs])
        stats[key] = float(values.sum() if key in summed else values.mean())
    stats["actor/grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
    stats["actor/lr"] = lr
    stats["actor/update_skipped"] = float(not ok)
    stats["actor/rows_not_run"] = float(b - sum(m["input_ids"].shape[0] for m in micro))  # rows_to_run
    return stats


def nonfinite_flag(model, outputs: list, exact: bool = False) -> torch.Tensor:
    """(1,) float32 on the model's device, no host sync: 1 when a loss term or a gradient of this rank
    is not finite, else 0. Gradients are read from megatron's main_grad buffers when present (after
    the DP reduction, where a NaN on any rank has reached its owner).

    exact=False checks the gradients through their sum of squares, one BLAS dot per tensor: it is
    finite exactly when every element is, unless finite elements overflow it (|g| above ~1e19 in
    fp32), so a 1 may be a false alarm that exact=True (max |g| per tensor, torch._foreach_norm with
    ord=inf) settles. The fast check is what runs per update (_all_finite): on CPU the max |g| is a
    scalar loop, 194 ms against 10 ms for the 135M gradients of SmolLM2 on 2 cores (issue 15)."""
    params = [p for chunk in as_chunks(model) for p in chunk.parameters()]
    device = params[0].device if params else torch.device("cpu")
    grads = []
    for p in params:
        grad = getattr(p, "main_grad", None)
        grad = p.grad if grad is None else grad
        if grad is not None and grad.numel():
            grads.append(grad)
    checks = [v.detach().float().reshape(-1) for o in outputs if isinstance(o, dict) for v in o.values()]
    if grads and exact:
        checks += [m.float().reshape(1) for m in torch._foreach_norm(grads, float("inf"))]
    elif grads:
        checks.append(torch.stack([torch.dot(g.reshape(-1), g.reshape(-1)).float() for g in grads]).sum().reshape(1))
    if not checks:
        return torch.zeros(1, device=device)
    values = torch.cat([c.to(device) for c in checks])
    return (~torch.isfinite(values)).any().float().reshape(1)


def _all_finite(model, outputs: list) -> bool:
    """True when every rank's loss terms and gradients are finite: nonfinite_flag all-reduced (MAX)
    over the world, on the device (nccl/hccl reduce device tensors only), so all ranks of the actor
    agree to step or to skip. One host sync per update, for the answer; when the fast check flags
    something (a NaN/inf, or squares that overflow), every rank runs the exact check once more."""
    for exact in (False, True):
        flag = nonfinite_flag(model, outputs, exact=exact)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if not bool(flag.item()):
            return True
    return False
