"""Forward helpers: padding masks, per-token log-probs and entropy from vocab-parallel logits, and
a micro-batched, pipeline-aware forward pass.

Log-probs never gather the vocabulary: each TP rank holds logits for its vocab slice (B, S, V/TP);
the max and the sum of exp are all-reduced over the TP group, and the target's logit is taken on
the rank that owns it. Gradients flow through megatron's `reduce_from_tensor_model_parallel_region`
(all-reduce forward, identity backward), which is exact because everything after the reduction is
computed identically on every TP rank. Temperature is applied as logits / T before the softmax.
Vocabulary padding rows (ids >= vocab_size) are excluded from the softmax, like HF's logits.

Padding: `attention_mask_4d` turns a (B, S) 1/0 mask into megatron's (B, 1, S, S) boolean mask
(True = masked) that is both causal and hides padding keys. Megatron's GPTModel applies RoPE by
sequence index and ignores position_ids; with left padding that shifts every real token's position
by the same amount, which leaves attention unchanged because RoPE only sees relative positions.

`forward_microbatches` takes one chunk or a rank's list of virtual-pipeline chunks (models/chunks.py:
megatron's interleaved schedule, one data iterator per chunk) and pads the sequence to a multiple of
TP under sequence parallelism (models/parallel.py); post_fn always sees the unpadded length.

Logits only where needed (issue 15): the output layer (hidden -> vocabulary, the largest matmul of
a small model, and the (tokens x V) fp32 log_softmax after it) runs on the response positions only.
`output_columns` slices the final hidden states (s, b, h) before megatron's output layer with a
forward pre-hook for the duration of one forward, so GPTModel (0.12 and 0.16 call the layer the
same way) and its TP output layer are unchanged. Under sequence parallelism the hidden states are
still split over TP ranks there and the layer gathers them itself: no slicing then (full logits).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region  # noqa: E402

from mindspeed_rl.models.chunks import as_chunks, unwrap  # noqa: E402
from mindspeed_rl.models.moe_replay import columns, replay_routing  # noqa: E402
from mindspeed_rl.models.parallel import pad_for_sequence_parallel, sequence_parallel_multiple  # noqa: E402


def attention_mask_4d(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) with 1 on real tokens -> (B, 1, S, S) bool, True where attention is not allowed."""
    seq = attention_mask.shape[1]
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device), diagonal=1)
    pad_key = ~attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    return causal[None, None] | pad_key


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) positions counted over real tokens only (0 for left padding), as HF generate does."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@contextlib.contextmanager
def output_columns(chunk, start: int) -> Iterator[int]:
    """Within the block, `chunk`'s output layer sees only sequence positions >= start: its logits
    are (b, S - start, V/TP) for columns start.. of the input. Yields the start applied: `start`,
    or 0 where the chunk has no output layer (not the last pipeline stage) or the hidden states
    are split over TP ranks (sequence parallelism; the layer gathers them itself)."""
    model = unwrap(chunk)
    layer = getattr(model, "output_layer", None) if getattr(model, "post_process", False) else None
    if start <= 0 or layer is None or getattr(layer, "sequence_parallel", False):
        yield 0
        return
    # (s, b, h) -> (s - start, b, h); weight / runtime_gather_output are passed as keywords
    handle = layer.register_forward_pre_hook(lambda _module, args: (args[0][start:], *args[1:]))
    try:
        yield start
    finally:
        handle.remove()


_BLOCK_BYTES = {"cpu": 4 << 20}  # logits bytes per block: cache-sized on CPU; one block elsewhere


class _TokenLogProbs(torch.autograd.Function):
    """log_softmax(z / T)[target] of (b, S, V) logits, columns first .. first + n (n = targets' width),
    the whole vocabulary on this rank (TP = 1), without the (b, n, V) temporaries of log_softmax.

    Forward: the log-sum-exp per row, computed block by block (a few rows of V logits at a time: on
    CPU the temporaries stay in cache and are recycled by the allocator instead of page-faulting fresh
    memory), and the target's logit gathered. Nothing of size V is saved: backward recomputes the
    softmax from the logits (alive anyway: they are the model's output) and the saved log-sum-exp.
    Backward: d/dz_k = (onehot(target)_k - softmax(z / T)_k) * g / T, written block by block into one
    gradient of the full logits' shape (the columns outside the range are zero), the target's
    column getting + g / T in the same block. Against log_softmax + gather + the column slice, this saves the log_softmax
    output kept for backward, the backward's fresh (b, n, V) tensors (log_softmax's, the gather's
    zeros, the slice's zeros + copy) and their passes (issue 15: ~0.3 s of a SmolLM2 update on CPU).
    Vocabulary padding (ids >= vocab_size) is left out of the softmax and gets zero gradient.
    Each pass reuses one fp32 block buffer and computes the log-sum-exp in place in it (_logsumexp_):
    torch.logsumexp and a fresh `.float()` per block made three block-sized temporaries each, fresh
    page-faulting memory on CPU (SmolLM2's (16, 33, 49152) bf16 logits, forward + backward: median
    77-87 -> 54 ms, page faults 0.55M -> 0.32M over 12 calls).
    """

    @staticmethod
    def forward(ctx, logits, targets, first, temperature, vocab_size):
        b, _, V = logits.shape
        n = targets.shape[-1]
        real = min(V, vocab_size) if vocab_size is not None else V
        lse = torch.empty(b, n, dtype=torch.float32, device=logits.device)
        rows = _block_rows(logits, real)
        buf = torch.empty(min(rows, n), real, dtype=torch.float32, device=logits.device)  # one block, reused
        for i in range(b):
            for j in range(0, n, rows):
                k = min(n, j + rows)
                z = buf[:k - j]
                z.copy_(logits[i, first + j: first + k, :real])
                if temperature != 1.0:
                    z.div_(temperature)
                _logsumexp_(z, lse[i, j:k])
        z_t = logits[:, first: first + n].gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
        if temperature != 1.0:
            z_t = z_t / temperature
        ctx.save_for_backward(logits, targets, lse)
        ctx.first, ctx.temperature, ctx.real = first, temperature, real
        return z_t - lse

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        first, temperature, real = ctx.first, ctx.temperature, ctx.real
        b, S, V = logits.shape
        n = targets.shape[-1]
        g = grad.float() / temperature if temperature != 1.0 else grad.float()  # (b, n)
        out = torch.empty_like(logits)
        out[:, :first].zero_()
        out[:, first + n:].zero_()
        if real < V:
            out[:, first: first + n, real:].zero_()
        rows = _block_rows(logits, real)
        same = logits.dtype == torch.float32
        buf = None if same else torch.empty(min(rows, n), real, dtype=torch.float32, device=logits.device)
        for i in range(b):
            for j in range(0, n, rows):
                k = min(n, j + rows)
                z = logits[i, first + j: first + k, :real]
                dst = out[i, first + j: first + k, :real]
                p = dst if same else buf[:k - j]
                if temperature != 1.0:
                    if same:
                        torch.div(z, temperature, out=p)
                    else:  # z / T in fp32 (a bf16 division would round to bf16 first)
                        p.copy_(z).div_(temperature)
                    p.sub_(lse[i, j:k, None])
                else:
                    torch.sub(z, lse[i, j:k, None], out=p)
                p.exp_().mul_(-g[i, j:k, None])  # -softmax(z / T) * g / T
                p.scatter_add_(-1, targets[i, j:k, None], g[i, j:k, None])  # + onehot(target) * g / T
                if not same:
                    dst.copy_(p)  # rounded once, as the float path's gradient cast back
        return out, None, None, None, None


def _logsumexp_(z: torch.Tensor, out: torch.Tensor) -> None:
    """out = logsumexp(z, -1) for a 2-D fp32 block, as torch.logsumexp computes it (the max, with an
    infinite one taken as 0, then log(sum(exp(z - max))) + max), but in place in z: no temporaries of
    z's size (on CPU each would be fresh, page-faulting memory). z is overwritten."""
    m = z.amax(-1, keepdim=True)
    m.masked_fill_(m.abs() == float("inf"), 0.0)
    torch.sum(z.sub_(m).exp_(), -1, out=out)
    out.log_().add_(m[:, 0])


def _block_rows(logits: torch.Tensor, real: int) -> int:
    """Rows of `real` logits per block: ~4 MB on CPU, everything at once elsewhere."""
    limit = _BLOCK_BYTES.get(logits.device.type)
    if limit is None:
        return logits.shape[1]
    return max(1, limit // (4 * max(1, real)))


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                    vocab_size: Optional[int] = None, first: int = 0) -> torch.Tensor:
    """(b, n) log softmax(logits / T)[targets] over the whole vocabulary held here (TP = 1) for the
    columns first .. first + n of (b, S, V) logits; the other columns get zero gradient. Equal to
    log_softmax + gather (tests/unit/models/test_token_log_probs.py), without their (b, n, V)
    temporaries (_TokenLogProbs)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _TokenLogProbs.apply(logits, targets, first, float(temperature), vocab_size)


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    vocab_size: Optional[int] = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """log softmax(logits / T)[target] (and the entropy) over the full, TP-sharded vocabulary.

    Args:
        logits: (..., V/TP) this TP rank's contiguous vocab slice (rank r holds ids [r*V/TP, (r+1)*V/TP)).
        targets: (...) token ids in the full vocabulary.
        temperature: T > 0; logits are divided by it.
        vocab_size: real vocabulary size; ids >= vocab_size (megatron's padding) are left out.
        with_entropy: also return the entropy of softmax(logits / T).

    Returns:
        log_probs (...) float32, entropy (...) float32 or None.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    tp = parallel_state.get_tensor_model_parallel_world_size() if parallel_state.model_parallel_is_initialized() else 1
    if tp == 1 and not with_entropy:
        # the whole vocabulary is here: the log-sum-exp per row and the target's logit, no (..., V)
        # temporaries (token_log_probs; issue 15)
        if logits.dim() == 3:
            return token_log_probs(logits, targets, temperature, vocab_size), None
        flat = logits.reshape(1, -1, logits.shape[-1])
        return token_log_probs(flat, targets.reshape(1, -1), temperature, vocab_size).reshape(targets.shape), None
    local_vocab = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * local_vocab if tp > 1 else 0
    reduce = reduce_from_tensor_model_parallel_region if tp > 1 else (lambda t: t)
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature  # (..., V/TP)
    if vocab_size is not None and start + local_vocab > vocab_size:
        ids = torch.arange(start, start + local_vocab, device=z.device)
        z = z.masked_fill(ids >= vocab_size, float("-inf"))

    z_max = z.detach().max(dim=-1).values  # (...,) a constant shift: no gradient needed
    if tp > 1:
        torch.distributed.all_reduce(z_max, op=torch.distributed.ReduceOp.MAX,
                                     group=parallel_state.get_tensor_model_parallel_group())
    exp = torch.exp(z - z_max.unsqueeze(-1))  # (..., V/TP)
    sum_exp = reduce(exp.sum(dim=-1))  # (...,)

    local_t = targets - start
    owned = (local_t >= 0) & (local_t < local_vocab)
    z_t = z.gather(-1, local_t.clamp(0, local_vocab - 1).unsqueeze(-1)).squeeze(-1)
    z_t = reduce(torch.where(owned, z_t, torch.zeros_like(z_t)))
    log_probs = z_t - z_max - torch.log(sum_exp)

    entropy = None
    if with_entropy:  # H = log sum exp(z) - E_p[z]
        finite_z = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
        expected_z = reduce((exp * finite_z).sum(dim=-1)) / sum_exp
        entropy = torch.log(sum_exp) + z_max - expected_z
    return log_probs, entropy


def forward_microbatches(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    micro_batch_size: int,
    post_fn: Callable[[torch.Tensor, dict], torch.Tensor],
    trim_padding: bool = False,
    routed_experts: Optional[torch.Tensor] = None,
    logits_from: int = 0,
) -> Optional[list[torch.Tensor]]:
    """Forward-only pass over micro-batches through megatron's (pipeline) schedule.

    Args:
        model: this rank's GPTModel chunk, or its list of virtual-pipeline chunks (models/chunks.py).
        input_ids: (B, S) token ids; attention_mask: (B, S) 1 on real tokens. B % micro_batch_size == 0.
        post_fn: (logits (b, S, V/TP), micro-batch dict with input_ids / attention_mask) -> tensor;
            runs on the last pipeline stage, e.g. to turn logits into log-probs.
        trim_padding: run each micro-batch on its `padding_span` only (where `shape_free`); post_fn sees
            the trimmed micro-batch and must return (..., S') along its last dim, which is padded
            back with zeros to (..., S) (compute_log_probs: (2, b, S'-1) -> (2, b, S-1)).
        routed_experts: (B, S, L, k) the rollout's expert choices to replay (models/moe_replay.py),
            cut and padded with each micro-batch's columns; None = the routers choose.
        logits_from: the output layer runs only on columns >= logits_from of input_ids (see
            output_columns); post_fn then gets logits for columns logits_start.. of its micro-batch,
            where micro-batch key "logits_start" says which (0 where nothing was cut).

    Returns:
        post_fn's outputs per micro-batch on the last pipeline stage; None on other stages.
    """
    batch, seq = input_ids.shape
    if batch % micro_batch_size:
        raise ValueError(f"batch size {batch} is not divisible by micro_batch_size {micro_batch_size}")
    chunks = as_chunks(model)
    # sequence parallelism splits the sequence over TP ranks: pad it to a multiple of TP (mask 0,
    # after every real token, so no real token attends to it) and cut the logits back to S
    ids, mask = pad_for_sequence_parallel(input_ids, attention_mask, sequence_parallel_multiple(chunks))
    micro = [{"input_ids": i, "attention_mask": m}
             for i, m in zip(ids.split(micro_batch_size), mask.split(micro_batch_size))]
    if routed_experts is not None:  # MoE routing replay: the same rows and columns as input_ids
        for mb, r in zip(micro, columns(routed_experts, 0, seq, ids.shape[1]).split(micro_batch_size)):
            mb["routed_experts"] = r
    real = len(micro)
    if len(chunks) > 1:  # the interleaved schedule runs micro-batches in groups of PP: repeat the last
        pp = parallel_state.get_pipeline_model_parallel_world_size()
        micro += [micro[-1]] * (-real % pp)

    def step(data_iter, chunk):
        mb = next(data_iter)
        first, end = padding_span(mb["attention_mask"]) if trim else (0, seq)
        inputs = {k: v[:, first:end] for k, v in mb.items()} if trim else mb  # SP-padded under SP
        wanted = min(max(logits_from - first, 0), end - first - 1)  # keep at least one column
        with replay_routing(chunk, inputs.get("routed_experts")), output_columns(chunk, wanted) as start:
            logits = chunk(inputs["input_ids"], position_ids_from_mask(inputs["attention_mask"]),
                           attention_mask_4d(inputs["attention_mask"]))

        def post(out):  # post_fn sees the columns first:end; its result is padded back to S
            cols = {k: v[:, first:end] for k, v in mb.items()}
            cols["logits_start"] = start
            res = post_fn(out[:, :end - first - start], cols)
            if trim:
                res = torch.nn.functional.pad(res, (first, seq - end))
            return torch.zeros((), device=out.device), {"out": res}
        return logits, post

    trim = trim_padding and shape_free(chunks)
    data = [iter(micro) for _ in chunks] if len(chunks) > 1 else iter(micro)
    with torch.no_grad():
        outputs = get_forward_backward_func()(
            forward_step_func=step, data_iterator=data, model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=len(micro), seq_length=ids.shape[1], micro_batch_size=micro_batch_size,
            forward_only=True)
    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return None
    return [o["out"] for o in outputs[:real]]


def compute_log_probs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    micro_batch_size: int,
    temperature: float = 1.0,
    vocab_size: Optional[int] = None,
    with_entropy: bool = False,
    routed_experts: Optional[torch.Tensor] = None,
    from_position: int = 0,
) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """Log-probs of each next token: (B, S-1) for input_ids[:, 1:] (and entropy), on the last PP
    stage; None elsewhere. Positions where attention_mask is 0 hold meaningless values.
    routed_experts (B, S, L, k): the rollout's expert choices to replay (models/moe_replay.py).
    from_position: only positions >= it are computed (the logits too; e.g. P - 1 for the response
    of a prompt of width P); the columns before it hold zeros."""

    def post(logits, mb):  # logits (b, S' - start, V/TP) for columns start.. of the micro-batch
        start = mb["logits_start"]
        lp, ent = vocab_parallel_log_probs(logits[:, :-1], mb["input_ids"][:, start + 1:], temperature,
                                           vocab_size, with_entropy)
        out = torch.stack([lp, ent if ent is not None else torch.zeros_like(lp)])  # (2, b, S'-1-start)
        return torch.nn.functional.pad(out, (start, 0))  # (2, b, S'-1)

    # similar lengths share a micro-batch (each is trimmed to its own real columns); order restored below
    order = None
    if micro_batch_size < input_ids.shape[0]:
        order = torch.argsort(attention_mask.sum(-1), stable=True)
        input_ids, attention_mask = input_ids[order], attention_mask[order]
        routed_experts = routed_experts[order] if routed_experts is not None else None
    out = forward_microbatches(model, input_ids, attention_mask, micro_batch_size, post, trim_padding=True,
                               routed_experts=routed_experts, logits_from=from_position)
    if out is None:
        return None
    stacked = torch.cat(out, dim=1)  # (2, B, S-1)
    if from_position > 0:  # also where the output layer saw every column (sequence parallelism)
        stacked[..., :from_position] = 0
    if order is not None:
        stacked = stacked[:, torch.argsort(order)]
    return stacked[0], (stacked[1] if with_entropy else None)


def shape_free(model) -> bool:
    """Whether micro-batches may each have their own width (see padding_span): not when PP sends
    activations of one shape between stages, SP splits the sequence over TP ranks (padded to a
    multiple), or EP gathers every rank's tokens (gloo has no uneven all_gather)."""
    return (parallel_state.get_pipeline_model_parallel_world_size() == 1
            and sequence_parallel_multiple(model) == 1
            and parallel_state.get_expert_model_parallel_world_size() == 1)


def padding_span(attention_mask: torch.Tensor) -> tuple[int, int]:
    """(first, end): the columns [first, end) of a (b, S) 1/0 mask that hold a real token in some row.

    Columns outside are padding in every row: left of the longest prompt and right of the longest
    response. Dropping them changes no real token's result (causal attention never looks right;
    RoPE sees relative positions only, so a uniform left shift leaves attention as it was), only
    the work: a micro-batch costs its own longest sequence, not the batch's (issue 15: no compute
    on padding; TRL pads to the batch's longest)."""
    real = attention_mask.bool().any(dim=0)  # (S,)
    idx = real.nonzero()
    if idx.numel() == 0:
        return 0, attention_mask.shape[1]
    return int(idx[0]), int(idx[-1]) + 1


def micro_batch_divisor(rows: int, wanted: int) -> int:
    """The largest micro-batch size <= wanted that divides rows (shards may be smaller than a micro-batch)."""
    wanted = max(1, min(wanted, rows))
    while rows % wanted:
        wanted -= 1
    return wanted
