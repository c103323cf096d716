"""Actor/Rollout and Reference workers: one Ray actor per device, composing models/ and rollout/.

Each worker joins its role's process group (distributed/worker_env.py), builds its GPTModel shard
(random init, or a HF checkpoint sharded at load time), and answers the trainer's calls on its
DP shard of the batch. The actor trains with megatron's DDP + distributed optimizer
(models/train_step.py) and generates with the native engine over the SAME model object, so a
colocated actor needs no weight sync. The reference is the same trunk, frozen.

Reference inside the actor (`reference_in_actor`): when the reference shares the actor's devices
(`resource_pool.ref: []`) with the same TP/PP and no train/infer split, the actor worker holds the
frozen reference model beside the policy (as TRL holds both in one process) and computes its
log-probs right after generating, in the same call: one Ray round trip and one batch transfer less
per step, and no second process with its own copy of the framework. Its weights are the
reference's `load`, or a copy of the actor's initial weights when both load the same checkpoint
(or both start from the same seeded random init, which a separate worker would reproduce).

Every entry point times itself (`timing/<phase>_worker`, reported with the next update's stats), so
the trainer can show the Ray and driver time outside the workers as a measured number.

Checkpoints (save_checkpoint / load_checkpoint for resume, save_hf) are written by every rank
through models/checkpoint.py; the driver decides when (trainer/grpo.py). With ray_gpt's
train/infer split (num_gpus_for_infer > 0) these ranks only train: they build no engine and hand
their weights to the generation ranks (export_weights_for_rollout, workers/rollout.py). A
pipeline-parallel actor generates on its training ranks too: all TP and PP ranks of a DP group
run the engine together and return the same batch (rollout/native.py); the worker group keeps
the output rank's (TP rank 0 of the last stage).
"""
from __future__ import annotations

import contextlib
import logging
import resource
import time

import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.data.tokenizer import eos_token_ids
from mindspeed_rl.models.arch_check import model_args
from mindspeed_rl.models.chunks import as_chunks
from mindspeed_rl.models.hf_bridge.loader import hf_config_of
from mindspeed_rl.platform import get_platform, on_device, params_dtype
from mindspeed_rl.platform.placement import ref_offload

log = logging.getLogger(__name__)


def engine_metrics(stats: dict) -> dict[str, float]:
    """A rollout engine's stats (RolloutOutput.stats) as metrics: its seconds under timing/ like every
    wall time (`rollout/decode_s` -> `timing/rollout_decode`), its rate under perf/, the rest as they
    are (`rollout/decode_steps`, `rollout/kv_cache_gb`, `rollout/compiled_decode`,
    `rollout/packed_weights_gb`), so that what depends on the machine's speed stays apart from what
    a resumed run must reproduce."""
    out = {}
    for key, value in stats.items():
        name = key.split("/", 1)[-1]
        if name.endswith("_per_s"):
            out[f"perf/rollout_{name}"] = value
        elif name.endswith("_s"):
            out[f"timing/rollout_{name[:-2]}"] = value
        else:
            out[key] = value
    return out


def _parallel_kwargs(role_cfg, num_layers: int) -> dict:
    """TransformerConfig fields for the role's SP / virtual pipeline / recompute settings."""
    from mindspeed_rl.models.chunks import vpp_from_keys
    from mindspeed_rl.models.parallel import parallel_config_kwargs

    p = role_cfg.parallel
    vpp = vpp_from_keys(num_layers, p.pipeline_model_parallel_size,
                        p.virtual_pipeline_model_parallel_size, p.num_layers_per_virtual_pipeline_stage)
    granularity = p.recompute_granularity or ("selective" if p.recompute_activations else None)
    return parallel_config_kwargs(p.sequence_parallel, vpp, granularity, p.recompute_method, p.recompute_num_layers)


def _compile_layers(chunks, role_cfg, platform) -> int:
    """`use_torch_compile`: the role's dense decoder layers run compiled (models/compiled_layers.py).
    Returns how many do."""
    if not role_cfg.use_torch_compile:
        return 0
    from mindspeed_rl.models import compiled_layers
    from mindspeed_rl.platform.base import compiled_layers as platform_compiles_layers

    if not platform_compiles_layers(platform.name):
        log.warning("%s: use_torch_compile does not apply on %s; the layers run eagerly.", role_cfg.role, platform.name)
        return 0
    n = compiled_layers.install(chunks)
    log.info("%s: %d decoder layers run through torch.compile (use_torch_compile; the first step compiles).",
             role_cfg.role, n)
    return n


def _compiled_layer_count(n: int) -> int:
    """Layers that ran compiled: n, or 0 once a compile failed in this process (they run eagerly)."""
    if not n:
        return 0
    from mindspeed_rl.models import compiled_layers

    return 0 if compiled_layers.failed() is not None else n


class _ModelWorker:
    """Shared set-up of the actor and reference workers (composition helper, not an API)."""

    def __init__(self, cfg, role_cfg, train: bool):
        platform = get_platform(cfg.run.platform)
        platform.patch(role_cfg.mindspeed_switches)
        from mindspeed_rl.data.tokenizer import load_tokenizer
        from mindspeed_rl.distributed.worker_env import init_distributed
        from mindspeed_rl.models.builder import build_model_chunks, init_parallel_state

        self.cfg, self.role_cfg = cfg, role_cfg
        self.env = init_distributed(platform)
        self.device = platform.device(self.env.device_index)  # models live here; @on_device moves batches here
        par = role_cfg.parallel
        tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
        self.tokenizer = load_tokenizer(cfg.run.tokenizer_name_or_path, trust_remote_code=cfg.run.trust_remote_code)
        self.vocab_size = len(self.tokenizer)
        self.args = model_args(role_cfg, self.vocab_size)
        overrides = _parallel_kwargs(role_cfg, self.args["num_layers"])  # SP / virtual pipeline / recompute
        init_parallel_state(tp, pp, seed=cfg.run.seed, vpp=overrides.get("virtual_pipeline_model_parallel_size", 1),
                            ep=par.expert_model_parallel_size, etp=par.expert_tensor_parallel_size)
        chunks = build_model_chunks(self.args, params_dtype(role_cfg.params_dtype), self.device, overrides)
        # one GPTModel, or the list of this rank's virtual-pipeline chunks (models/chunks.py)
        self.model = chunks[0] if len(chunks) == 1 else chunks
        if role_cfg.load:  # a HF directory or a checkpoint of this project, sharded to this TP/PP
            from mindspeed_rl.models.checkpoint import load_weights
            load_weights(self.model, role_cfg.load, self.args)
        if not train:
            for chunk in chunks:
                chunk.requires_grad_(False)
        self.compiled_layers = _compile_layers(chunks, role_cfg, platform)
        self.temperature = cfg.actor.rollout.temperature if cfg.actor.rollout.do_sample else 1.0
        self.phase_s: dict[str, float] = {}  # seconds per entry point since the last drain_timings

    def rank_info(self) -> dict:
        from mindspeed_rl.distributed.worker_env import rank_info
        return rank_info()

    @contextlib.contextmanager
    def _timed(self, phase: str):
        """Adds the wall time, this process's CPU time (all its threads) and its minor page faults
        during the block to phase_s[phase] (worker-side: no Ray, no transfer). CPU / wall says how
        many of its threads a phase kept busy; the faults count fresh memory touched."""
        start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        try:
            yield
        finally:
            after = resource.getrusage(resource.RUSAGE_SELF)
            took = (time.perf_counter() - start,
                    after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                    after.ru_minflt - before.ru_minflt)
            phases = self.__dict__.setdefault("phase_s", {})
            phases[phase] = tuple(a + b for a, b in zip(phases.get(phase, (0.0, 0.0, 0)), took))

    def drain_timings(self) -> dict[str, float]:
        """{"timing/<phase>_worker": wall s, "timing/<phase>_worker_cpu": CPU s,
        "perf/<phase>_minor_faults": count} accumulated since the last call, and the rollout engine's
        stats of the last generation (engine_metrics); resets them."""
        out = dict(self.__dict__.pop("_rollout_stats", None) or {})
        for k, (wall, cpu, faults) in self.__dict__.get("phase_s", {}).items():
            out.update({f"timing/{k}_worker": wall, f"timing/{k}_worker_cpu": cpu, f"perf/{k}_minor_faults": faults})
        self.phase_s = {}
        return out

    def _response_log_probs(self, model, batch: dict, micro_batch_size: int | None = None,
                            replay: bool = False) -> torch.Tensor:
        """(B, T) response log-probs; replay: route MoE tokens as the rollout did (routed_experts)."""
        from mindspeed_rl.models.forward import compute_log_probs, micro_batch_divisor

        P, T = batch[K.PROMPT_IDS].shape[1], batch[K.RESPONSES].shape[1]
        mbs = micro_batch_divisor(batch[K.INPUT_IDS].shape[0], micro_batch_size or self.role_cfg.micro_batch_size)
        for chunk in as_chunks(model):
            chunk.eval()
        routed = batch.get(K.ROUTED_EXPERTS) if replay else None  # MoE routing replay (models/moe_replay.py)
        out = compute_log_probs(model, batch[K.INPUT_IDS], batch[K.ATTENTION_MASK], mbs, self.temperature,
                                self.vocab_size, from_position=P - 1,  # logits for the response only
                                **({"routed_experts": routed} if routed is not None else {}))
        if out is None:  # not the last pipeline stage: the output rank answers for the DP group
            return torch.zeros(batch[K.RESPONSES].shape, device=self.device)
        return out[0][:, P - 1: P - 1 + T] * batch[K.RESPONSE_MASK]


def reference_in_actor(cfg) -> bool:
    """The reference runs inside the actor worker: it shares the actor's devices (resource_pool.ref
    empty) at the same TP / PP / virtual pipeline / EP / ETP (one megatron parallel state per
    process), with no train/infer split (whose training ranks generate nothing to score next to)."""
    from mindspeed_rl.models.chunks import vpp_from_keys

    def layout(role_cfg):
        p = role_cfg.parallel
        vpp = vpp_from_keys(role_cfg.arch.num_layers, p.pipeline_model_parallel_size,
                            p.virtual_pipeline_model_parallel_size, p.num_layers_per_virtual_pipeline_stage)
        return (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, vpp, p.expert_model_parallel_size,
                p.expert_tensor_parallel_size or p.tensor_model_parallel_size)

    return not cfg.resource_pool.ref and not cfg.actor.num_gpus_for_infer and layout(cfg.actor) == layout(cfg.ref)


class ActorRolloutWorker(_ModelWorker):
    def __init__(self, cfg, with_reference: bool = False):
        """with_reference: also hold the frozen reference model (see reference_in_actor)."""
        super().__init__(cfg, cfg.actor, train=True)
        self.ref_model = self._build_reference() if with_reference else None
        from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
        from mindspeed_rl.rollout.interface import SamplingParams
        from mindspeed_rl.rollout.native import NativeEngine, engine_options

        from megatron.core import parallel_state

        o = cfg.actor.optim
        # At DP=1 there is nothing to shard, and on CPU megatron's distributed optimizer leaves every
        # later multi-threaded op of the process slower after its first (size-1) parameter all-gather
        # (bench/grpo_step.py: step 3.05 s -> 2.42 s at 10M params). Same maths either way.
        distributed = o.use_distributed_optimizer and parallel_state.get_data_parallel_world_size() > 1
        if o.freeze_parameters:  # not trained: no gradient buffer or optimizer state (models/freeze.py)
            from mindspeed_rl.models.freeze import freeze

            self.frozen = freeze(as_chunks(self.model), o.freeze_parameters)
        from mindspeed_rl.rollout.weight_buckets import RolloutSkip

        # frozen tensors go to a rollout engine with its own weights once (the first sync records their HF names)
        self.rollout_skip = RolloutSkip(record=bool(o.freeze_parameters))
        ddp = [wrap_ddp(chunk, distributed, bucketing=i == 0) for i, chunk in enumerate(as_chunks(self.model))]
        self.ddp = ddp[0] if len(ddp) == 1 else ddp
        mini_batches = cfg.run.global_batch_size // cfg.actor.ppo.ppo_mini_batch_size
        self.optimizer, self.scheduler = build_optimizer(
            ddp, lr=o.lr, train_iters=cfg.run.train_iters * mini_batches * cfg.actor.ppo.ppo_epochs,
            min_lr=o.min_lr, lr_decay_style=o.lr_decay_style, lr_warmup_fraction=o.lr_warmup_fraction,
            weight_decay=o.weight_decay, clip_grad=o.clip_grad, adam_beta1=o.adam_beta1, adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps, use_distributed_optimizer=distributed,
            params_dtype=ddp[0].config.params_dtype, initial_loss_scale=o.initial_loss_scale,
            stochastic_rounding=o.bf16_stochastic_rounding, seed=cfg.run.seed)
        r = cfg.actor.rollout
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.engine_kind = r.rollout_engine
        if cfg.actor.num_gpus_for_infer:  # split: the rollout ranks generate
            self.engine = None
        elif r.rollout_engine == "vllm":  # its own copy of the weights, synced after every update
            from mindspeed_rl.rollout.vllm_engine import build_vllm_engine

            self.engine = build_vllm_engine(cfg, self.args, self.tokenizer, self.vocab_size)
        else:
            self.engine = NativeEngine(
                self.model, vocab_size=self.vocab_size,
                max_length=self.args.get("max_position_embeddings", cfg.run.seq_length),
                eos_token_ids=eos_token_ids(self.tokenizer, cfg.actor.load), pad_token_id=pad,
                record_routing=cfg.actor.ppo.moe_enable_routing_replay,  # MoE routing replay (R3)
                **engine_options(r))
        self._sampling = lambda n, greedy, seed: SamplingParams.from_ray_gpt(
            n_samples_per_prompt=n, do_sample=r.do_sample and not greedy, temperature=r.temperature,
            top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens, seq_length=cfg.run.seq_length, seed=seed)
        self.calls = 0

    def _build_reference(self) -> torch.nn.Module:
        """The frozen reference beside the policy: the ref role's own checkpoint, or the actor's
        initial weights when the two load the same one (or both start from the seeded random init,
        which is what a separate reference worker builds). The RNG states are put back afterwards,
        so the actor's later draws do not depend on where the reference lives."""
        from mindspeed_rl.models.builder import build_model_chunks
        from mindspeed_rl.models.checkpoint import _rng_state, _set_rng_state

        ref_cfg = self.cfg.ref
        args = model_args(ref_cfg, self.vocab_size)
        rng = _rng_state()  # python, numpy, torch and megatron's model-parallel tracker (as a checkpoint saves)
        try:
            chunks = build_model_chunks(args, params_dtype(ref_cfg.params_dtype), self.device,
                                        _parallel_kwargs(ref_cfg, args["num_layers"]))
        finally:
            _set_rng_state(rng)
        model = chunks[0] if len(chunks) == 1 else chunks
        _compile_layers(chunks, ref_cfg, get_platform())
        if ref_cfg.load and ref_cfg.load != self.cfg.actor.load:
            from mindspeed_rl.models.checkpoint import load_weights
            load_weights(model, ref_cfg.load, args)
        else:
            with torch.no_grad():
                for chunk, actor_chunk in zip(chunks, as_chunks(self.model)):
                    for dst, src in zip(chunk.state_dict().values(), actor_chunk.state_dict().values()):
                        if isinstance(dst, torch.Tensor):
                            dst.copy_(src)
        for chunk in chunks:
            chunk.requires_grad_(False)
            chunk.eval()
        platform = get_platform(self.cfg.run.platform)
        # MindSpeed-RL's reference offload (host memory between uses), where the weights are worth it
        self.ref_offload = _decide_ref_offload(platform, ref_cfg.param_offload, chunks)
        self._empty_cache = platform.empty_cache
        if self.ref_offload:
            self._move(model, torch.device("cpu"))
        return model

    def _move(self, model, device: torch.device) -> None:
        """The reference's offload: every chunk to `device`; the device cache is emptied after leaving it."""
        for chunk in as_chunks(model):
            chunk.to(device)
        if device.type == "cpu":
            self._empty_cache()

    def _ref_log_probs(self, batch: dict) -> torch.Tensor:
        """(B, T) reference log-probs of a batch already on this worker's device."""
        if self.ref_model is None:
            raise RuntimeError("compute_ref_log_prob on an actor worker built without the reference "
                               "(reference_in_actor was false for this config)")
        with self._timed("ref"):
            if self.ref_offload:
                self._move(self.ref_model, self.device)
            try:
                with torch.no_grad():
                    return self._response_log_probs(self.ref_model, batch, self.cfg.ref.micro_batch_size)
            finally:
                if self.ref_offload:
                    self._move(self.ref_model, torch.device("cpu"))

    @on_device
    def compute_ref_log_prob(self, batch: dict) -> torch.Tensor:
        """The reference's (B, T) log-probs, computed by the reference held in this process."""
        return self._ref_log_probs(batch)

    def sync_rollout_weights(self) -> dict[str, float]:
        """vLLM colocated: stream this rank's weights, TP-gathered under HF names, into its engine in
        bounded chunks (every rank of a TP group takes part). The native engine runs this very
        model: nothing to copy. Returns timing/sync_weights and rollout/sync_peak_bytes ({} native)."""
        if self.engine_kind != "vllm" or self.engine is None:
            return {}
        from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors

        self.engine.update_weights(gathered_hf_tensors(self.model, self.args, self.rollout_skip),
                                   learn_layers=self.rollout_skip.record)
        self.rollout_skip.record = False
        return {"timing/sync_weights": self.engine.last_sync["seconds"],
                "rollout/sync_peak_bytes": self.engine.last_sync["peak_bytes"],
                "rollout/sync_tensors": self.engine.last_sync["tensors"]}

    def frozen_hf_names(self) -> set:
        """HF names of this rank's frozen tensors, as the first sync recorded them (empty before it or unfrozen)."""
        return self.rollout_skip.frozen_hf_names()

    def skippable_weights(self, names) -> set:
        """Colocated vLLM: which of these (frozen) HF names this rank's engine can do without from now on."""
        return set(self.engine.skippable(names)) if self.engine_kind == "vllm" and self.engine is not None else set()

    def set_rollout_skip(self, names) -> None:
        """The HF names every sync leaves out from now on (the same on every rank: trainer/roles.py)."""
        self.rollout_skip.skip = frozenset(names)

    @on_device(move_inputs=False)
    def generate_probe(self) -> dict:
        """The engine's generation on the fixed weight-sync probe (rollout/sync_check.py)."""
        from mindspeed_rl.rollout.sync_check import probe_batch

        r = self.cfg.actor.rollout
        return probe_batch(self.engine, self.engine.vocab_size, r.do_sample, r.temperature, self.cfg.run.seq_length)

    @on_device(move_inputs=False)  # the engine reads prompts as lists; its output comes back to the host
    def generate_sequences(self, prompts: dict, n: int, greedy: bool = False, with_ref: bool = False) -> dict:
        """n samples per prompt; with_ref: also the reference's log-probs of them (ref_log_probs),
        computed here by the reference held in this process, before the batch leaves the worker."""
        from mindspeed_rl.rollout.interface import generate_batch, sampling_seed

        with self._timed("gen"):
            self.calls += 1
            for chunk in as_chunks(self.model):
                chunk.eval()
            seed = sampling_seed(self.cfg.run.seed, self.calls, self.rank_info()["dp_rank"])
            batch = generate_batch(self.engine, prompts, n, self._sampling(n, greedy, seed))
        # the engine's own numbers (native: prefill / decode seconds, decode steps, KV-cache GiB, whether
        # the decode steps ran compiled), reported with the next update's stats
        self._rollout_stats = engine_metrics(getattr(self.engine, "last_stats", None) or {})
        if with_ref:
            batch[K.REF_LOG_PROBS] = self._ref_log_probs(batch)
        return batch

    @on_device
    def compute_log_prob(self, batch: dict) -> torch.Tensor:
        with self._timed("old_log_prob"), torch.no_grad():
            return self._response_log_probs(self.model, batch, replay=True)

    @on_device
    def update_actor(self, batch: dict) -> dict[str, float]:
        """ppo_epochs x mini-batches over this DP rank's shard (rows of a prompt's group stay together
        unless shuffle_minibatch). The stats carry this worker's phase times since the last update
        (timing/<phase>_worker: gen, ref, old_log_prob, update_actor)."""
        with self._timed("update_actor"):
            stats = self._update_actor(batch)
        stats.update(self.drain_timings())
        if getattr(self, "compiled_layers", 0):  # use_torch_compile; 0 once a compile failed (then eager)
            stats["perf/compiled_layers"] = _compiled_layer_count(self.compiled_layers)
        return stats

    def _update_actor(self, batch: dict) -> dict[str, float]:
        from mindspeed_rl.models.forward import micro_batch_divisor
        from mindspeed_rl.models.moe_metrics import ExpertLoadMeter
        from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

        if self.engine is not None:
            self.engine.sleep()  # vLLM on NPU/CUDA: release its KV cache for the update; no-op otherwise
        p = self.cfg.actor.ppo
        s = PolicyLossSettings(p.clip_ratio_low, p.clip_ratio_high, p.clip_ratio_c, p.loss_agg_mode, p.use_kl_loss,
                               p.kl_loss_type, p.kl_loss_coef, p.entropy_coeff, self.temperature, self.vocab_size,
                               p.tis_mode, p.tis_cap)
        rows = batch[K.INPUT_IDS].shape[0]
        num_mini = self.cfg.run.global_batch_size // p.ppo_mini_batch_size
        names = [k for k in (K.INPUT_IDS, K.ATTENTION_MASK, K.RESPONSE_MASK, K.ADVANTAGES, K.OLD_LOG_PROBS,
                             K.REF_LOG_PROBS, K.ROLLOUT_LOG_PROBS) if k in batch]
        P = batch[K.PROMPT_IDS].shape[1]
        g = torch.Generator().manual_seed(self.cfg.run.seed + self.calls)
        for chunk in as_chunks(self.model):
            chunk.train()
        collected: list[dict] = []
        with ExpertLoadMeter(self.model) as meter:  # MoE: expert load + aux loss (no-op when dense)
            for _ in range(p.ppo_epochs):
                order = torch.randperm(rows, generator=g) if p.shuffle_minibatch else torch.arange(rows)
                for idx in order.to(self.device).chunk(num_mini):
                    mb = {"input_ids": batch[K.INPUT_IDS][idx], "attention_mask": batch[K.ATTENTION_MASK][idx],
                          "response_mask": batch[K.RESPONSE_MASK][idx].float(), "advantages": batch[K.ADVANTAGES][idx]}
                    if K.OLD_LOG_PROBS in names:
                        mb["old_log_probs"] = batch[K.OLD_LOG_PROBS][idx]
                    if K.REF_LOG_PROBS in names:
                        mb["ref_log_probs"] = batch[K.REF_LOG_PROBS][idx]
                    if K.ROLLOUT_LOG_PROBS in names and p.tis_mode != "off":
                        mb["rollout_log_probs"] = batch[K.ROLLOUT_LOG_PROBS][idx]
                    if K.ROUTED_EXPERTS in batch:  # MoE routing replay (R3): the rollout's experts
                        mb["routed_experts"] = batch[K.ROUTED_EXPERTS][idx]
                    mbs = micro_batch_divisor(len(idx), self.role_cfg.micro_batch_size)
                    collected.append(policy_update_step(self.ddp, self.optimizer, self.scheduler, mb, P, mbs, s))
        keys = collected[0].keys() if collected and collected[0] else []
        return {**{k: sum(c[k] for c in collected) / len(collected) for k in keys}, **meter.stats()}

    def save_checkpoint(self, path: str, step: int, trainer_state: dict | None = None, keep_last_n: int = 0,
                        config_hash: str = "") -> str:
        """Model + optimizer + scheduler + rng of every rank at `step` under `path`, with the driver's
        trainer_state (and this worker's call counter, which seeds sampling) in trainer_state.json;
        written to a temp dir and renamed when complete (models/checkpoint.py). Every rank calls it."""
        from mindspeed_rl.models.checkpoint import save_checkpoint

        state = dict(trainer_state or {}, actor={"calls": self.calls})
        return save_checkpoint(path, step, self.ddp, self.args, self.optimizer, self.scheduler,
                               vocab_size=self.model_vocab(), hf_config=hf_config_of(self.cfg.actor.load),
                               params_dtype=self.role_cfg.params_dtype, trainer_state=state,
                               manifest_extra={"config_hash": config_hash}, keep_last_n=keep_last_n)

    def load_checkpoint(self, path: str) -> dict:
        """Resume from a checkpoint of this project. At the saved TP/PP/DP: weights, optimizer,
        scheduler, rng and the sampling counter, so the run continues bitwise. At another layout:
        weights through the models bridge, the optimizer's state per parameter (fp32 main params and
        Adam's moments, models/optimizer_state.py) and the counter; checkpoints written before
        2026-11-30 hold the optimizer per layout, so there Adam's moments start fresh. Every rank calls it.

        Returns:
            step, saved_layout and layout (this run's) as {tp, pp, dp}, optimizer_restored.
        """
        from mindspeed_rl.models.checkpoint import _ranks, load_checkpoint, read_manifest, read_trainer_state
        from mindspeed_rl.models.optimizer_state import resumes_anywhere

        manifest, here = read_manifest(path), _ranks()
        saved = {k: manifest.get(k, 1) for k in ("tp", "pp", "vpp", "dp")}  # vpp: 1 in older checkpoints
        same = all(saved[k] == here[k] for k in saved)
        restore = same or resumes_anywhere(manifest)
        step = load_checkpoint(path, self.ddp, self.args, self.optimizer, self.scheduler, load_optimizer=restore,
                               load_rng=same)
        if not restore:  # the optimizer's fp32 main params (bf16/fp16 runs) must follow the new weights
            self.optimizer.reload_model_params()
        self.calls = int(read_trainer_state(path).get("actor", {}).get("calls", self.calls))
        return {"step": step, "saved_layout": saved, "layout": {k: here[k] for k in saved},
                "optimizer_restored": restore and bool(manifest.get("has_optimizer"))}

    def save_hf(self, out_dir: str) -> str:
        """Export the live actor as a Hugging Face checkpoint directory (every rank calls it)."""
        from mindspeed_rl.models.hf_export import export_hf

        return export_hf(self.ddp, self.args, out_dir, self.model_vocab(), hf_config=hf_config_of(self.cfg.actor.load),
                         tokenizer_dir=self.cfg.run.tokenizer_name_or_path, mtp_source=self.cfg.actor.load)

    def model_vocab(self) -> int:
        """Vocabulary rows of checkpoints and exports: config.json's vocab_size when the actor started
        from a HF checkpoint, so that the export's rows match the config.json written with it (a
        tokenizer often has fewer ids: Qwen2.5's 151,665 against 152,064 rows), else the tokenizer's."""
        hf = hf_config_of(self.cfg.actor.load)
        return int(hf["vocab_size"]) if hf and hf.get("vocab_size") else self.vocab_size

    def export_weights_for_rollout(self, bucket_mb: float = 256.0) -> list:
        """Split deployment: this stage's weights under HF names, in the Ray object store in buckets
        of about bucket_mb; returns their object refs ([] on ranks that put none). Every training
        rank must call it (TP all-gathers); workers/rollout.py describes the hand-over."""
        from mindspeed_rl.rollout.weight_buckets import export_hf_buckets

        refs = export_hf_buckets(self.model, self.args, bucket_mb, self.rollout_skip)
        self.rollout_skip.record = False
        return refs


def _decide_ref_offload(platform, setting, chunks) -> bool:
    """platform.placement.ref_offload for these model chunks on this worker's device, logged once."""
    weight_bytes = sum(t.numel() * t.element_size() for chunk in chunks for t in chunk.state_dict().values()
                       if isinstance(t, torch.Tensor))
    offload, why = ref_offload(platform.name, setting, weight_bytes,
                               platform.total_memory_bytes() if platform.name != "cpu" else None)
    log.info("reference beside the actor: %s", why)
    return offload


class ReferenceWorker(_ModelWorker):
    """The frozen reference. Colocated with the actor on an accelerator (`resource_pool.ref: []`),
    its weights can live in host memory between calls (MindSpeed-RL's reference offload; the ref
    role's param_offload, auto by default: see platform.placement.ref_offload), so that the device
    memory goes to the actor's training and generation."""

    def __init__(self, cfg):
        super().__init__(cfg, cfg.ref, train=False)
        platform = get_platform(cfg.run.platform)
        self.offload = not cfg.resource_pool.ref and _decide_ref_offload(platform, cfg.ref.param_offload,
                                                                         as_chunks(self.model))
        self._empty_cache = platform.empty_cache
        if self.offload:
            self._place(torch.device("cpu"))

    def _place(self, device: torch.device) -> None:
        """Move the weights (parameters and buffers) to `device`; free the device cache after leaving it."""
        for chunk in as_chunks(self.model):
            chunk.to(device)
        if device.type == "cpu":
            self._empty_cache()

    @on_device
    def compute_ref_log_prob(self, batch: dict) -> torch.Tensor:
        if self.offload:
            self._place(self.device)
        try:
            with torch.no_grad():
                return self._response_log_probs(self.model, batch)
        finally:
            if self.offload:
                self._place(torch.device("cpu"))
