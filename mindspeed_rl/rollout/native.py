"""The megatron-native rollout engine: generation with the actor's own GPTModel and a KV cache.

    engine = NativeEngine(model, vocab_size=tok.vocab_size, max_length=args["max_position_embeddings"],
                          eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)
    out = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=256, seed=step))

How one batch is generated (every TP and PP rank of a model replica runs the same loop on the
same prompts):
  1. prefill: the prompts, left-padded to P, go through the model once with an explicit
     causal + key-padding mask (B, 1, P, P); the KV cache (kv_cache.py: our own, through one
     scoped hook on megatron's core attention; why not megatron's static inference path is
     written there) stores post-RoPE K/V for all P positions; only the last position's logits
     are computed.
  2. decode: one token per running sequence per step, mask (b, 1, 1, P + t) hiding pad keys.
     RoPE is applied by sequence index, as GPTModel does in training, so a left-padded row is
     shifted uniformly in prefill and decode alike; attention only sees relative positions, so
     outputs equal those of HF with positions counted over real tokens (tested token for token).
     use_kv_cache=False instead runs megatron's own full forward over the whole sequence each
     step (slow; the reference the cache is tested against).
  3. logits (b, V/TP) are all-gathered over TP to (b, V) for sampling; the tokens chosen on TP
     rank 0 are broadcast so every rank agrees whatever the device's reduction order.
  3b. pipeline parallelism (PP > 1; as megatron.core.inference runs a small batch, except that
     megatron broadcasts the logits (b, V) and we the chosen tokens): each stage runs its own
     layers with its own KV cache for the prefill and for every decode step;
     the first stage embeds the tokens, every other stage receives the previous stage's hidden
     states (s, b, h) by p2p on megatron's pipeline group and hands them to its layers through
     `model.set_input_tensor`; the last stage computes the logits and chooses the tokens, and
     broadcasts (token, log-prob) over the pipeline group, so every stage appends the same
     tokens, stops the same rows and compacts its cache in step (finished flags follow from the
     tokens and the budgets every stage holds; no further message). All ranks of a replica return
     the same RolloutOutput. The stages run one after the other within a step (no micro-batch
     interleaving): PP splits the weights and the KV cache over devices, not the decode time.
  4. finished sequences (EOS / stop token / length) leave the running batch: their rows are
     dropped from the KV cache ("compaction", a gather of the filled cache along the batch dim)
     once at least `compact_fraction` of the cached rows are finished; until then they are
     computed and ignored. bench/rollout_decode.py measures the policies.

MoE routing replay (record_routing): a forward hook on every router writes each token's top-k
experts at its (row, position) of a (B, P + T, L, k) tensor as prefill and decode steps run
(models/moe_replay.RoutingRecorder; the stages' layers are joined under PP); the training forwards
replay it. The last response token never runs through the model: it stays -1 (routes by itself).

Sampling and log-probs: rollout/sampling.py (log_softmax(logits / T) over the full vocabulary,
before top-k/top-p, on fp32 logits: the quantity the trainer computes).

Every wait for another rank that this file issues (a stage's hidden states, the broadcast
tokens) has a timeout (`comm_timeout_s`) and a message naming what it waited for; the TP
collectives inside megatron's layers use the process group's timeout.

Sequence parallelism: a training model built with SP generates with SP switched off for the call
(models/parallel.sequence_parallel_off: same weights, same math). A decode step is one token, which
cannot be split over the TP ranks, and without autograd there are no saved activations for SP to
shard; each TP rank holds the (b, s, h) activations of the prefill instead of 1/TP of them.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from typing import Iterable, Optional, Sequence

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region  # noqa: E402

from mindspeed_rl.models.chunks import as_chunks, unwrap  # noqa: E402
from mindspeed_rl.models.forward import attention_mask_4d  # noqa: E402
from mindspeed_rl.models.moe_replay import RoutingRecorder  # noqa: E402
from mindspeed_rl.models.parallel import sequence_parallel_off  # noqa: E402
from mindspeed_rl.platform import packed_linear  # noqa: E402
from mindspeed_rl.platform.base import compile_failed, compile_error_summary, compile_fix  # noqa: E402
from mindspeed_rl.rollout.kv_cache import (KVCache, cached_attention, compile_unsupported, compiled_decode_step,  # noqa: E402
                                           decode_weights, forward_stage, lean_supported, new_cache)
from mindspeed_rl.rollout.interface import check_prompts, FINISH_EOS, FINISH_LENGTH, RolloutOutput, SamplingParams  # noqa: E402
from mindspeed_rl.rollout.sampling import choose_tokens, make_generator, token_log_probs  # noqa: E402
from mindspeed_rl.utils.errors import UserInputError  # noqa: E402

log = logging.getLogger(__name__)

# torch.compile's failures to compile (inductor's, e.g. no C++ compiler, wrapped by Dynamo, or
# Dynamo's own), raised at a compiled step's first call or a recompile, before its graph runs


def _tp_size() -> int:
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_tensor_model_parallel_world_size()


def _pp_size() -> int:
    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_pipeline_model_parallel_world_size()


def _expert_group():
    """The ranks whose MoE layers exchange tokens (megatron's EP x ETP group), or None without
    expert parallelism. They hold different prompts (EP ranks are data-parallel ranks) but every
    MoE layer all-gathers equal-shaped tokens over them, so they must decode in lock-step: same
    batch shape, no compaction, the same number of steps (`_agree`)."""
    if not parallel_state.model_parallel_is_initialized() or parallel_state.get_expert_model_parallel_world_size() == 1:
        return None
    return parallel_state.get_expert_tensor_and_model_parallel_group()


def engine_options(rollout) -> dict:
    """NativeEngine keyword arguments from the rollout config keys (RolloutConfig), the same for the
    colocated actor and the split's generation ranks."""
    return {"use_kv_cache": rollout.use_kv_cache, "max_batch_size": rollout.num_samples_per_step,
            "compile_decode": not rollout.enforce_eager}


class NativeEngine:
    """RolloutEngine over this rank's megatron GPTModel chunk (its TP shard of its pipeline stage).

    Args:
        model: the GPTModel (the training model itself when colocated: same weights, no copy);
            megatron's DDP / Float16Module wrappers are unwrapped (`.module`).
        vocab_size: real vocabulary size; ids >= vocab_size (megatron's padding) are never sampled.
        max_length: the longest prompt + response the model supports (max_position_embeddings).
        eos_token_ids: ids that end a response (e.g. the tokenizer's eos; chat models have several).
        pad_token_id: fills the padding of prompts and responses.
        use_kv_cache: False recomputes the whole sequence every step (ray_gpt use_kv_cache; slow,
            the reference the cache is tested against).
        max_batch_size: sequences per generation batch (ray_gpt num_samples_per_step); None = all.
        compact_fraction: drop finished rows from the cache once this fraction of it is finished
            (0 = as soon as one finishes, > 1 = never).
        model_args: Megatron-named architecture args, needed by update_weights when the engine
            does not share the training model.
        shares_training_weights: the model is the training model itself: update_weights is a no-op.
        comm_timeout_s: how long a rank waits for another pipeline stage's hidden states or for the
            chosen tokens before it raises, naming what it waited for.
        record_routing: MoE: return every token's top-k experts per layer (RolloutOutput.routed_experts)
            for routing replay in the training forwards (models/moe_replay.py).
        compile_decode: run the decode steps through torch.compile (ray_gpt `enforce_eager: false`):
            kv_cache.static_decode_step, one graph for every step and batch; TP 1, PP 1 dense models
            with the KV cache, not on Ascend (elsewhere the engine says once why it stays eager).
            The prefill stays eager.

    bf16 on the CPU, the lean path's matmuls (prefill and decode, eager or compiled) read copies of
    the weights prepacked once per generate() (`packs_weights`; platform/packed_linear.py): the same
    bits, 1.3x faster decoding at 50M.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, max_length: int,
                 eos_token_ids: Sequence[int] = (), pad_token_id: int = 0, use_kv_cache: bool = True,
                 max_batch_size: Optional[int] = None, compact_fraction: float = 0.25,
                 model_args: Optional[dict] = None, shares_training_weights: bool = True,
                 comm_timeout_s: float = 600.0, record_routing: bool = False, compile_decode: bool = False):
        # this rank's chunks: one, or one per virtual pipeline stage (models/chunks.py); DDP and
        # Float16Module wrappers are unwrapped
        self.chunks = [unwrap(chunk) for chunk in as_chunks(model)]
        model = self.chunks[0]
        if max_batch_size is not None and max_batch_size < 1:
            raise UserInputError(f"num_samples_per_step is {max_batch_size}; set it to >= 1.")
        self.model = model
        self.vocab_size = int(vocab_size)
        self.max_length = int(max_length)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.use_kv_cache = use_kv_cache
        self.max_batch_size = max_batch_size
        self.compact_fraction = compact_fraction
        self.model_args = model_args
        self.shares_training_weights = shares_training_weights
        self.comm_timeout_s = float(comm_timeout_s)
        self.record_routing = record_routing
        self.kv_cache_bytes = 0  # peak KV-cache size of the last generate() on this rank
        self.lean = lean_supported(model)  # kv_cache.lean_forward: megatron's maths without its modules
        # the lean path's matmuls on weights prepacked once per generate() (bf16 on the CPU; same bits)
        self.packs_weights = self.lean and use_kv_cache and packed_linear.available(
            get_platform().name, next(model.parameters()).dtype)
        self._pack_skip_logged = False  # the "not prepacked: too big" warning is said once
        self.last_stats: dict = {}  # the stats of the last generate() (RolloutOutput.stats)
        self._decode_step = None  # compiled kv_cache.static_decode_step (enforce_eager: false)
        if compile_decode:
            why = compile_unsupported(model, get_platform().name)
            if why is None and not use_kv_cache:
                why = "use_kv_cache is false"
            if why is None:
                self._decode_step = compiled_decode_step()
                log.info("native rollout engine: decode steps compiled with torch.compile (enforce_eager: false); "
                         "the first generation compiles them")
            else:
                log.warning("native rollout engine: enforce_eager is false but the decode steps run eagerly: %s.", why)
        self._timing = {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0}
        self._closed = False

    # ------------------------------------------------------------------------------------------
    # RolloutEngine

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> RolloutOutput:
        """sampling.n responses per prompt (token-id lists without padding); see RolloutOutput."""
        if self._closed:
            raise RuntimeError("NativeEngine.generate called after close()")
        max_total = min(self.max_length, sampling.max_total_length or self.max_length)
        rows = self._check_prompts(prompts, max_total)
        rows = [p for p in rows for _ in range(sampling.n)]  # the n samples of a prompt adjacent
        device = next(self.model.parameters()).device
        generator = make_generator(sampling.seed, device)
        per_batch = self.max_batch_size or len(rows)
        was_training = self.model.training
        for chunk in self.chunks:
            chunk.eval()
        self.kv_cache_bytes = 0
        self._timing = {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0, "pack_s": 0.0}
        packed_bytes = 0
        t0 = time.perf_counter()
        weights = decode_weights(self.model) if self.packs_weights and self._packing_pays(sampling, max_total) else []
        if weights and (why := packed_linear.too_big(sum(w.numel() * w.element_size() for w in weights))):
            if not self._pack_skip_logged:
                log.warning("native rollout engine: decoding on the weights as they are (not prepacked): %s.", why)
                self._pack_skip_logged = True
            weights = []
        try:
            with torch.no_grad(), sequence_parallel_off(self.chunks), contextlib.ExitStack() as stack:
                if weights:
                    tp = time.perf_counter()
                    packed_bytes = stack.enter_context(packed_linear.packed_weights(weights, min(per_batch, len(rows))))
                    self._timing["pack_s"] = time.perf_counter() - tp
                parts = [self._generate_batch(rows[i:i + per_batch], sampling, max_total, device, generator,
                                              bool(weights))
                         for i in range(0, len(rows), per_batch)]
        finally:
            for chunk in self.chunks:
                chunk.train(was_training)
                if _pp_size() > 1:
                    chunk.set_input_tensor(None)  # drop the last received hidden states
        out = _concat(parts, self.pad_token_id, sampling.logprob_temperature)
        out.stats = {"rollout/time_s": time.perf_counter() - t0, "rollout/prefill_s": self._timing["prefill_s"],
                     "rollout/decode_s": self._timing["decode_s"], "rollout/decode_steps": self._timing["decode_steps"],
                     "rollout/kv_cache_gb": self.kv_cache_bytes / 2 ** 30,
                     "rollout/compiled_decode": float(self.compiled), "rollout/pack_s": self._timing["pack_s"],
                     "rollout/packed_weights_gb": packed_bytes / 2 ** 30}
        self.last_stats = out.stats
        return out

    @staticmethod
    def _packing_pays(sampling: SamplingParams, max_total: int) -> bool:
        """Packing the weights costs about 5 plain decode steps' matmuls and saves 30-40 % of each later
        step's from 50M parameters (5-7 % at 10M; platform/packed_linear.py): worth it from 16 planned
        decode steps."""
        return min(sampling.max_new_tokens or max_total, max_total) >= 16

    def _stop_compiling(self, err: Exception) -> None:
        """torch.compile failed on the decode step (e.g. inductor found no C++ compiler): say so once,
        with the fix, and decode eagerly from this step on (the zero-filled cache and its length are
        the eager steps' too, so the generation goes on where it is)."""
        self._decode_step = None
        summary = compile_error_summary(err)
        log.warning("native rollout engine: torch.compile failed on the decode step (%s); decoding eagerly from "
                    "here on. %s", summary, compile_fix(summary, "actor_rollout_ref.actor_rollout.enforce_eager: true"))

    @property
    def compiled(self) -> bool:
        """Whether the decode steps run compiled (compile_decode asked for and possible here)."""
        return self._decode_step is not None

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """HF-named full tensors -> this rank's shards; a no-op when sharing the training model."""
        if self.shares_training_weights:
            return
        if self.model_args is None:
            raise ValueError("NativeEngine.update_weights needs model_args when it does not share the "
                             "training model")
        from mindspeed_rl.rollout.weights import load_hf_tensors

        load_hf_tensors(self.model, named_tensors, self.model_args)  # generation ranks: PP 1, one chunk

    def sleep(self) -> None:
        """The KV cache lives only inside generate(), so there is nothing held between calls;
        return the allocator's cached blocks to the device for the training step."""
        get_platform().empty_cache()

    def wake_up(self) -> None:
        """Nothing to re-take: generate() allocates its cache."""

    def close(self) -> None:
        self._closed = True
        self.model, self.chunks = None, []

    # ------------------------------------------------------------------------------------------
    # one batch

    def _check_prompts(self, prompts: Sequence[Sequence[int]], max_total: int) -> list[list[int]]:
        return check_prompts(prompts, max_total, self.vocab_size)

    def _logits(self, ids: torch.Tensor, key_mask: torch.Tensor, caches: list[Optional[KVCache]],
                step: Optional[int]) -> Optional[torch.Tensor]:
        """Next-token logits (b, V) of the last position, on the last pipeline stage; None on the
        other stages, which send their hidden states on. ids (b, s): the new tokens (the whole
        sequence without cache); key_mask (b, k) 1 on real keys, k = tokens seen so far;
        caches: one per chunk (None: no cache); step: index of the response token these logits
        choose (None: the prefill), for messages.

        With a virtual pipeline each rank runs its chunks in order, and the hidden states go round
        the pipeline ring once per chunk: chunk v of rank r receives from rank r-1 (from the last
        rank's chunk v-1 when r = 0) and sends to rank r+1 (to rank 0's chunk v+1 from the last)."""
        s, k = ids.shape[1], key_mask.shape[1]
        if s == k:  # prefill / no cache: causal + padding
            mask = attention_mask_4d(key_mask)  # (b, 1, s, s)
        else:  # decode: one query row that may see every real key
            mask = ~key_mask.bool()[:, None, None, :]  # (b, 1, 1, k)
        pos = (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, k - s:]  # (b, s); unused by RoPE
        pp = _pp_size()
        pp_rank = parallel_state.get_pipeline_model_parallel_rank() if pp > 1 else 0
        out = None
        for v, (chunk, cache) in enumerate(zip(self.chunks, caches)):
            stage = v * pp + pp_rank  # the virtual stage this chunk is
            if stage > 0:
                chunk.set_input_tensor(self._recv_hidden((s, ids.shape[0], chunk.config.hidden_size), step, stage))
            if cache is None:  # megatron's own full forward: the reference the cache is tested against
                out = chunk(ids, pos, mask)  # last stage (b, s, V/TP), other stages (s, b, h)
                out = out[:, -1] if chunk.post_process else out
            else:
                out = forward_stage(chunk, ids, pos, mask, cache)  # (b, V/TP) or (s, b, h)
            if stage < pp * len(self.chunks) - 1:
                self._send_hidden(out, step, stage)
                out = None
        if out is None:
            return None
        if _tp_size() > 1:
            out = gather_from_tensor_model_parallel_region(out)  # (b, V_pad)
        return out[:, :self.vocab_size]

    # ------------------------------------------------------------------------------------------
    # talking to the other ranks of the replica

    @property
    def _hidden_dtype(self) -> torch.dtype:
        """The dtype of the hidden states between stages: megatron's pipeline_dtype, as in training."""
        return self.model.config.pipeline_dtype or next(self.model.parameters()).dtype

    def _recv_hidden(self, shape: tuple, step: Optional[int], stage: int) -> torch.Tensor:
        """The previous (virtual) pipeline stage's output (s, b, h) for this step; megatron's
        prev rank wraps round the ring (rank 0's later chunks receive from the last rank)."""
        buf = torch.empty(shape, dtype=self._hidden_dtype, device=next(self.model.parameters()).device)
        src = parallel_state.get_pipeline_model_parallel_prev_rank()
        work = torch.distributed.irecv(buf, src=src, group=parallel_state.get_pipeline_model_parallel_group())
        self._wait(work, f"the hidden states {tuple(shape)} of pipeline stage {stage - 1} (global rank {src})", step)
        return buf

    def _send_hidden(self, hidden: torch.Tensor, step: Optional[int], stage: int) -> None:
        """This (virtual) stage's output (s, b, h) to the next one (round the ring)."""
        hidden = hidden.to(self._hidden_dtype).contiguous()
        dst = parallel_state.get_pipeline_model_parallel_next_rank()
        work = torch.distributed.isend(hidden, dst=dst, group=parallel_state.get_pipeline_model_parallel_group())
        self._wait(work, f"pipeline stage {stage + 1} (global rank {dst}) to take this stage's hidden states "
                         f"{tuple(hidden.shape)}", step)

    def _choose(self, logits: Optional[torch.Tensor], sp: SamplingParams, uniforms: Optional[torch.Tensor],
                rows: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (b,) and their log-probs (b,) fp32, the same on every rank of the replica: chosen
        on TP rank 0 of the last pipeline stage (which alone has logits when PP > 1) and broadcast."""
        tok = lp = None
        if logits is not None:
            tok = choose_tokens(logits, sp.do_sample, sp.logprob_temperature, sp.top_k, sp.top_p, uniforms=uniforms)
            if _tp_size() > 1:
                self._broadcast(tok, parallel_state.get_tensor_model_parallel_src_rank(),
                                parallel_state.get_tensor_model_parallel_group(), "the tokens of TP rank 0", step)
            lp = token_log_probs(logits, tok, sp.logprob_temperature)
        if _pp_size() == 1:
            return tok, lp
        # one int64 message: the tokens and the fp32 bit patterns of their log-probs (exact)
        if logits is not None:
            msg = torch.stack([tok, lp.view(torch.int32).long()])  # (2, b)
        else:
            msg = torch.empty(2, rows, dtype=torch.long, device=next(self.model.parameters()).device)
        self._broadcast(msg, parallel_state.get_pipeline_model_parallel_last_rank(),
                        parallel_state.get_pipeline_model_parallel_group(),
                        "the tokens chosen on the last pipeline stage", step)
        return msg[0], msg[1].int().view(torch.float32)

    def _agree(self, value: int, how: str, group, device: torch.device) -> int:
        """max / min of an int over the EP group (lock-step decoding; see _expert_group)."""
        t = torch.tensor([value], dtype=torch.long, device=device)
        op = torch.distributed.ReduceOp.MAX if how == "max" else torch.distributed.ReduceOp.MIN
        self._wait(torch.distributed.all_reduce(t, op=op, group=group, async_op=True),
                   f"the expert-parallel ranks' batch shape ({how})", None)
        return int(t.item())

    def _broadcast(self, tensor: torch.Tensor, src: int, group, what: str, step: Optional[int]) -> None:
        work = torch.distributed.broadcast(tensor, src=src, group=group, async_op=True)
        self._wait(work, f"{what} (global rank {src})", step)

    def _wait(self, work, what: str, step: Optional[int]) -> None:
        """work.wait() bounded by comm_timeout_s; a timeout or a dead peer names what was awaited."""
        try:
            ok = work.wait(timeout=datetime.timedelta(seconds=self.comm_timeout_s))
        except RuntimeError as err:
            raise TimeoutError(self._wait_message(what, step, f"failed: {err}")) from err
        if ok is False:
            raise TimeoutError(self._wait_message(what, step, f"timed out after {self.comm_timeout_s:g} s"))

    def _wait_message(self, what: str, step: Optional[int], how: str) -> str:
        where = "prefill" if step is None else f"response token {step}"
        me = (f"pipeline stage {parallel_state.get_pipeline_model_parallel_rank()} of {_pp_size()}, "
              f"TP rank {parallel_state.get_tensor_model_parallel_rank()} of {_tp_size()}, "
              f"global rank {torch.distributed.get_rank()}")
        return (f"rollout ({me}), {where}: waiting for {what} {how} (comm_timeout_s {self.comm_timeout_s:g}); "
                f"that rank failed, hung or never called generate: see its log.")

    def _generate_batch(self, prompts: list[list[int]], sp: SamplingParams, max_total: int,
                        device: torch.device, generator, packed: bool = False) -> RolloutOutput:
        B = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=device)  # (B,)
        group = _expert_group()
        P = int(lens.max())
        if group is not None:
            if self._agree(B, "max", group, device) != self._agree(B, "min", group, device):
                raise UserInputError("expert parallelism: the data-parallel ranks of an EP group got different numbers "
                                     "of rollouts; make global_batch_size x n_samples_per_prompt divisible by the DP size.")
            P = self._agree(P, "max", group, device)  # left-pad to the longest prompt of the EP group
        ids = torch.full((B, P), self.pad_token_id, dtype=torch.long, device=device)
        prompt_mask = torch.zeros(B, P, dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            ids[i, P - len(p):] = torch.tensor(p, device=device)
            prompt_mask[i, P - len(p):] = 1
        budget = max_total - lens  # (B,) tokens each row may generate
        if sp.max_new_tokens is not None:
            budget = budget.clamp(max=sp.max_new_tokens)
        T = int(budget.max())
        if group is not None:
            T = self._agree(T, "max", group, device)
        stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(self.eos_token_ids))
        stop_ids = torch.tensor(sorted(stops), dtype=torch.long, device=device)

        seq = torch.cat([ids, torch.full((B, T), self.pad_token_id, dtype=torch.long, device=device)], 1)  # (B, P+T)
        key_mask = torch.cat([prompt_mask, torch.zeros(B, T, dtype=torch.long, device=device)], 1)  # (B, P+T)
        log_probs = torch.zeros(B, T, dtype=torch.float32, device=device)
        resp_len = torch.zeros(B, dtype=torch.long, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        stopped_by_token = torch.zeros(B, dtype=torch.bool, device=device)  # finish reason "stop" (else "length")

        compiled = self.compiled and group is None
        caches = [new_cache(c, B, P + T, zeroed=compiled) if self.use_kv_cache else None
                  for c in self.chunks]  # one per chunk
        if self.use_kv_cache:  # allocated in full here; compaction only shrinks it
            self.kv_cache_bytes = max(self.kv_cache_bytes, sum(c.nbytes for c in caches))
            for cache in caches:
                cache.lean, cache.packed = self.lean, packed
        rows = torch.arange(B, device=device)  # original index of each row in the running batch
        # MoE routing replay: each router's top-k per token, written at (rows, positions) of each forward
        recorder = RoutingRecorder(self.chunks, B, P + T) if self.record_routing else None
        with contextlib.ExitStack() as hooks:
            for chunk, cache in zip(self.chunks, caches):
                if cache is not None:
                    hooks.enter_context(cached_attention(chunk, cache))
            if recorder is not None:
                hooks.enter_context(recorder)
                recorder.at(rows, 0)
            t0 = time.perf_counter()
            logits = self._logits(ids, prompt_mask, caches, None)  # (B, V) prefill; None before the last stage
            get_platform().synchronize()
            t1 = time.perf_counter()
            self._timing["prefill_s"] += t1 - t0
            for t in range(T):
                # one uniform per sequence of the batch per step, running or not: a sequence's draws
                # do not depend on which others still run (compaction policy, cache or none)
                u = torch.rand(B, generator=generator, device=device)[rows] if sp.do_sample else None
                tok, lp = self._choose(logits, sp, u, len(rows), t)  # (b,) each, the same on every rank
                # finished rows not compacted out yet are computed and ignored. Written through the
                # running rows' indices with `where`, never a boolean mask: a mask's result size is
                # a host sync on an accelerator; one `.item()` a step is the loop's only one
                live = ~done[rows]
                seq[rows, P + t] = torch.where(live, tok, self.pad_token_id)
                key_mask[rows, P + t] = live.long()
                log_probs[rows, t] = torch.where(live, lp, 0.0)
                resp_len[rows] += live.long()
                stopped = torch.isin(tok, stop_ids) & live
                at_limit = (resp_len[rows] >= budget[rows]) & live & ~stopped
                stopped_by_token[rows] |= stopped
                running = ~(done[rows] | stopped | at_limit)
                done[rows] = ~running
                finished = len(rows) - int(running.sum().item())  # rows outside `rows` are all done
                all_done = finished == len(rows)
                if group is not None:  # every rank of the EP group runs every step until all are done
                    all_done = self._agree(int(all_done), "min", group, device) == 1
                if all_done:
                    break
                if group is None and (not self.use_kv_cache or finished >= max(1.0, self.compact_fraction * len(rows))):
                    keep = running.nonzero().squeeze(-1)
                    rows = rows[keep]
                    for cache in caches if self.use_kv_cache else ():
                        cache.keep(keep)
                step_ids = seq[rows, P + t:P + t + 1] if self.use_kv_cache else seq[rows, :P + t + 1]
                if recorder is not None:
                    recorder.at(rows, P + t if self.use_kv_cache else 0)
                if compiled:  # one shape-stable step over the whole cache (kv_cache.static_decode_step)
                    position = torch.full((), P + t, dtype=torch.long, device=device)
                    cache = caches[0]
                    try:
                        logits = self._decode_step(self.model, step_ids, key_mask[rows], position, cache.k, cache.v,
                                                   cache.freqs, packed, cache.local_freqs)[:, :self.vocab_size]
                        cache.length += 1
                    except compile_failed() as err:  # raised before the graph runs: the cache is untouched
                        self._stop_compiling(err)
                        compiled = False
                if not compiled:
                    logits = self._logits(step_ids, key_mask[rows, :P + t + 1], caches, t + 1)
                self._timing["decode_steps"] += 1
            get_platform().synchronize()
            self._timing["decode_s"] += time.perf_counter() - t1  # sampling included
        finish = [FINISH_EOS if x else FINISH_LENGTH for x in stopped_by_token.tolist()]
        T_out = int(resp_len.max())
        if group is not None:  # one response width over the EP group (the rows of one batch when gathered)
            T_out = self._agree(T_out, "max", group, device)
        response_mask = (torch.arange(T_out, device=device)[None] < resp_len[:, None]).long()
        responses = seq[:, P:P + T_out].masked_fill(response_mask == 0, self.pad_token_id)
        routed = None
        if recorder is not None:  # -1 on padding; the last response token was never run: -1 too
            routed = recorder.result(torch.cat([prompt_mask, response_mask], 1), self.comm_timeout_s)
        return RolloutOutput(prompts=ids, prompt_mask=prompt_mask, responses=responses,
                             response_mask=response_mask, log_probs=log_probs[:, :T_out] * response_mask,
                             finish_reason=finish, prompt_length=lens, response_length=resp_len,
                             temperature=sp.logprob_temperature, routed_experts=routed)


def _concat(parts: list[RolloutOutput], pad: int, temperature: float) -> RolloutOutput:
    """Join per-batch outputs: prompts re-left-padded and responses re-right-padded to common widths."""
    if len(parts) == 1:
        return parts[0]
    P = max(p.prompts.shape[1] for p in parts)
    T = max(p.responses.shape[1] for p in parts)

    def left(x, width, value):
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    routed = None
    if parts[0].routed_experts is not None:  # (B, P + T, L, k): left-pad the prompt, right-pad the response
        routed = torch.cat([torch.nn.functional.pad(p.routed_experts, (0, 0, 0, 0, P - p.prompts.shape[1],
                                                                       T - p.responses.shape[1]), value=-1)
                            for p in parts])
    return RolloutOutput(
        prompts=torch.cat([left(p.prompts, P, pad) for p in parts]),
        prompt_mask=torch.cat([left(p.prompt_mask, P, 0) for p in parts]),
        responses=torch.cat([right(p.responses, T, pad) for p in parts]),
        response_mask=torch.cat([right(p.response_mask, T, 0) for p in parts]),
        log_probs=torch.cat([right(p.log_probs, T, 0.0) for p in parts]),
        finish_reason=[r for p in parts for r in p.finish_reason],
        prompt_length=torch.cat([p.prompt_length for p in parts]),
        response_length=torch.cat([p.response_length for p in parts]),
        temperature=temperature, routed_experts=routed)
