"""The generation-only rollout worker of ray_gpt's train/infer split, and the weight hand-over.

With `num_gpus_for_train: a` + `num_gpus_for_infer: b` the actor pool's first a devices train
(ActorRolloutWorker: Megatron, the role's TP/PP) and the last b devices only generate
(RolloutWorker below). Each side is its own worker group and its own torch.distributed world.

Layout of the generation ranks: the megatron engine uses the actor's TP and PP 1 (MindSpeed-LLM's
ray_gpt generated with the actor's `tensor_model_parallel_size`: "currently only use TP for
Inference"): b / TP generation DP groups. The vLLM engine (`rollout_engine: vllm`) uses
`infer_tensor_parallel_size` (MindSpeed-RL's key): b / infer TP engines; it slices the full
HF tensors itself, so the hand-over below is the same.

Weights, after every update (trainer/roles.py ActorFacade.sync_rollout_weights):
  1. training ranks `export_hf_buckets`: every parameter of a stage is all-gathered over its TP
     group, mapped to its Hugging Face names, and TP rank 0 of DP rank 0 of each pipeline stage
     puts them in the Ray object store in buckets of about `bucket_mb`; only object refs travel
     back to the driver (it never holds a weight);
  2. every generation rank `update_weights`: fetches the buckets one at a time and streams them
     into rollout/weights.py load_hf_tensors, which slices its own TP shard.
Vocabulary padding rows are sent too (both sides pad the vocabulary the same way: same TP), so a
synced generation model equals the training model bit for bit. Departure from ray_gpt, which
broadcast megatron shards over NCCL groups between the two sides: the HF-named stream is what a
vLLM engine consumes, so the same hand-over serves any engine; the object store is the transport.
"""
from __future__ import annotations

import torch

from mindspeed_rl.platform import get_platform, on_device, params_dtype

def generation_tp(cfg) -> int:
    """TP of a generation-only rank: infer_tensor_parallel_size for vLLM, else the actor's TP."""
    if cfg.actor.rollout.rollout_engine == "vllm":
        return cfg.actor.rollout.infer_tensor_parallel_size
    return cfg.actor.parallel.tensor_model_parallel_size


class RolloutWorker:
    """One generation-only rank: the actor's architecture at the actor's TP, PP 1, no optimizer.

    It holds no weights of its own until the first update_weights (the training ranks are the
    only source of truth, also for a `load:` checkpoint); generating before that is an error.
    """

    def __init__(self, cfg):
        platform = get_platform(cfg.run.platform)
        platform.patch(cfg.actor.mindspeed_switches)
        from mindspeed_rl.data.tokenizer import load_tokenizer
        from mindspeed_rl.distributed.worker_env import init_distributed
        from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
        from mindspeed_rl.rollout.interface import SamplingParams
        from mindspeed_rl.rollout.native import NativeEngine, engine_options
        from mindspeed_rl.data.tokenizer import eos_token_ids
        from mindspeed_rl.models.arch_check import model_args

        self.cfg, a, r = cfg, cfg.actor, cfg.actor.rollout
        self.env = init_distributed(platform)
        self.device = platform.device(self.env.device_index)
        init_parallel_state(generation_tp(cfg), 1, seed=cfg.run.seed)
        self.tokenizer = load_tokenizer(cfg.run.tokenizer_name_or_path, trust_remote_code=cfg.run.trust_remote_code)
        self.vocab_size = len(self.tokenizer)
        self.args = model_args(a, self.vocab_size)  # the training ranks' args: same TP, same padding
        self.engine_kind = r.rollout_engine
        if r.rollout_engine == "vllm":  # vLLM holds the weights; the buckets stream straight into it
            from mindspeed_rl.rollout.vllm_engine import build_vllm_engine

            self.model = None
            self.engine = build_vllm_engine(cfg, self.args, self.tokenizer, self.vocab_size)
        else:
            # sequence_parallel off: decoding
            self.model = build_gpt_model(self.args, params_dtype=params_dtype(a.params_dtype), device=self.device)
            self.model.requires_grad_(False)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
            self.engine = NativeEngine(self.model, vocab_size=self.vocab_size,
                                       max_length=self.args.get("max_position_embeddings", cfg.run.seq_length),
                                       eos_token_ids=eos_token_ids(self.tokenizer, a.load), pad_token_id=pad,
                                       model_args=self.args, shares_training_weights=False, **engine_options(r))
        self._sampling = lambda n, greedy, seed: SamplingParams.from_ray_gpt(
            n_samples_per_prompt=n, do_sample=r.do_sample and not greedy, temperature=r.temperature,
            top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens, seq_length=cfg.run.seq_length, seed=seed)
        self.calls = 0
        self.weight_updates = 0
        self.kept: frozenset = frozenset()  # frozen HF names the syncs leave out (set_rollout_skip)

    def rank_info(self) -> dict:
        from mindspeed_rl.distributed.worker_env import rank_info
        return rank_info()

    def update_weights(self, refs: list, timeout_s: float = 600.0, with_stats: bool = False):
        """Load the training ranks' buckets (object refs from export_hf_buckets), one bucket in
        memory at a time. Returns the params (native) or tensors (vLLM) written; with_stats: a dict
        of timing/sync_weights (this rank's load), rollout/sync_peak_bytes and rollout/sync_tensors (that
        count) instead."""
        import time

        from mindspeed_rl.rollout.weight_buckets import fetch_buckets
        from mindspeed_rl.rollout.weights import load_hf_tensors

        who = f"rollout rank {self.env.rank}"
        start = time.perf_counter()
        if self.engine_kind == "vllm":  # (a first sync with frozen parameters learns which layers each tensor feeds)
            learn = self.weight_updates == 0 and bool(self.cfg.actor.optim.freeze_parameters)
            self.engine.update_weights(fetch_buckets(refs, timeout_s, who), learn_layers=learn)
            written, peak = int(self.engine.last_sync["tensors"]), self.engine.last_sync["peak_bytes"]
        else:
            written = load_hf_tensors(self.model, fetch_buckets(refs, timeout_s, who), self.args, absent=self.kept)
            peak = float("nan")
        self.weight_updates += 1
        if with_stats:
            return {"timing/sync_load": time.perf_counter() - start, "rollout/sync_peak_bytes": peak,
                    "rollout/sync_tensors": float(written)}
        return written

    def skippable_weights(self, names) -> set:
        """Which of these frozen HF names later syncs may leave out: vLLM's whole layers (VLLMEngine.skippable); all
        of them for the native engine, whose model keeps every tensor that does not come."""
        return set(self.engine.skippable(names)) if self.engine_kind == "vllm" else set(names)

    def set_rollout_skip(self, names) -> None:
        """The HF names later syncs leave out (the native engine then does not wait for them)."""
        self.kept = frozenset(names)

    @on_device(move_inputs=False)
    def generate_probe(self) -> dict:
        """The engine's generation on the fixed weight-sync probe (rollout/sync_check.py)."""
        from mindspeed_rl.rollout.sync_check import probe_batch

        r = self.cfg.actor.rollout
        return probe_batch(self.engine, self.engine.vocab_size, r.do_sample, r.temperature, self.cfg.run.seq_length)

    @on_device(move_inputs=False)
    def generate_sequences(self, prompts: dict, n: int, greedy: bool = False) -> dict:
        """The ActorRolloutWorker's generate_sequences, on this rank's copy of the weights."""
        from mindspeed_rl.rollout.interface import generate_batch, sampling_seed

        if not self.weight_updates:
            raise RuntimeError("generate_sequences before any update_weights: the generation ranks hold no "
                               "weights until the training ranks send them (ActorFacade.sync_rollout_weights)")
        self.calls += 1
        seed = sampling_seed(self.cfg.run.seed, self.calls, self.rank_info()["dp_rank"])
        return generate_batch(self.engine, prompts, n, self._sampling(n, greedy, seed))

    def sampling_state(self) -> dict:
        """What seeds this rank's next sample (saved in the actor's checkpoint for a bitwise resume)."""
        return {"calls": self.calls}

    def load_sampling_state(self, state: dict) -> None:
        self.calls = int(state["calls"])

    @on_device(move_inputs=False)
    def hf_weights(self) -> dict[str, torch.Tensor]:
        """This rank's full weights under HF names (TP gathered), for checking a sync (native engine)."""
        if self.model is None:
            raise RuntimeError("hf_weights: the vLLM engine holds the weights of this rank; check it with the probe")
        from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors

        return dict(gathered_hf_tensors(self.model, self.args))

