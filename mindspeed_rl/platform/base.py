"""The `Platform` value every other package talks to, and the selection logic behind
`get_platform()`.

A Platform is a small frozen dataclass: a few facts (names of the Ray resource, distributed
backend, visible-devices variable) plus `ops`, the device module (npu.py / cuda.py / cpu.py)
that does the device work. The three device modules share one informal protocol (`DeviceOps`);
there is no class hierarchy.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, MutableMapping, Optional, Protocol, Sequence

import torch

from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)

PLATFORM_NAMES = ("npu", "cuda", "cpu")

# MindSpeed feature switches this code base knows (Megatron/MindSpeed argument names, the
# spelling of configs/rlxf/model/*.yaml). On NPU they become `--use-flash-attn`-style flags that
# MindSpeed's adaptor parses (mindspeed.args_utils.get_mindspeed_args reads sys.argv when
# `mindspeed.megatron_adaptor` is imported); elsewhere they are reported as ignored.
MINDSPEED_SWITCHES = (
    "use_flash_attn",
    "use_fused_rmsnorm",
    "use_fused_swiglu",
    "use_fused_rotary_pos_emb",
    "use_fused_ring_attention_update",
    "use_fusion_attn_v2",
    "use_mc2",
    "use_ascend_mc2",
    "use_ascend_coc",
    "use_cp_send_recv_overlap",
    "context_parallel_algo",
    "cp_attention_mask_type",
    "ulysses_degree_in_cp",
    "use_fused_moe_token_permute_and_unpermute",
    "use_nd_matmul",
    "reuse_fp32_param",
    "swap_attention",
    "npu_deterministic",
    "shape_order",
    "sparse_mode",
    "pre_tockens",
    "next_tockens",
)


class DeviceOps(Protocol):
    """What platform/{npu,cuda,cpu}.py each provide (module-level functions)."""

    def patch(self, switches: Mapping[str, Any]) -> None: ...
    def set_device(self, index: int) -> None: ...
    def current_index(self) -> int: ...
    def device_name(self, index: int) -> str: ...
    def manual_seed(self, seed: int) -> None: ...
    def synchronize(self) -> None: ...
    def empty_cache(self) -> None: ...
    def memory_stats(self) -> dict[str, float]: ...
    def total_memory_bytes(self) -> Optional[int]: ...
    def configure_host_threads(self, cpus: float) -> dict[str, int]: ...


@dataclass(frozen=True)
class Platform:
    """Everything device-specific, behind one object. Build it with `get_platform()`.

    Attributes:
        name: "npu" | "cuda" | "cpu".
        device_type: torch device type ("npu", "cuda", "cpu").
        ray_resource: custom Ray resource a worker requests per device ("NPU" on NPU and CPU,
            where the local Ray is started with that many logical NPUs; "GPU" on CUDA).
        dist_backend: torch.distributed backend ("hccl", "nccl", "gloo").
        visible_devices_env_var: ASCEND_RT_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES / None on CPU.
        ray_noset_env_var: the RAY_EXPERIMENTAL_NOSET_* variable that stops Ray from rewriting
            visible_devices_env_var in its workers (None on CPU).
    """

    name: str
    device_type: str
    ray_resource: str
    dist_backend: str
    visible_devices_env_var: Optional[str]
    ray_noset_env_var: Optional[str]
    ops: Any = field(repr=False, compare=False)

    @property
    def uses_mindspeed(self) -> bool:
        """Whether MindSpeed feature switches take effect here (Ascend only)."""
        return self.name == "npu"

    # ---- devices
    def device(self, local_rank: int = 0) -> torch.device:
        """The torch device of a worker: index `local_rank` among the devices visible to it."""
        if self.name == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, local_rank)

    def set_device(self, local_rank: int = 0) -> torch.device:
        """Make device(local_rank) the current device of this process and return it."""
        self.ops.set_device(local_rank)
        return self.device(local_rank)

    def current_device(self) -> torch.device:
        """The device this process computes on now (set_device's choice; the CPU on cpu): where
        models are built when no device is given (models/builder.py)."""
        if self.name == "cpu":
            return torch.device("cpu")
        return self.device(self.ops.current_index())

    def device_name(self, local_rank: int = 0) -> str:
        """A human-readable name of device(local_rank) (model and runtime), for reports."""
        return self.ops.device_name(local_rank)

    # ---- visible-devices env handling
    def get_visible_devices(self, env: Mapping[str, str] = os.environ) -> Optional[list[int]]:
        """Device ids listed in the visible-devices variable; None when it is unset (all visible)."""
        if self.visible_devices_env_var is None:
            return None
        raw = env.get(self.visible_devices_env_var)
        if raw is None:
            return None
        try:
            return [int(x) for x in raw.split(",") if x.strip() != ""]
        except ValueError:
            raise ValueError(
                f"{self.visible_devices_env_var}={raw!r} is not a comma-separated list of device "
                f"ids; set it like {self.visible_devices_env_var}=0,1,2,3."
            ) from None

    def set_visible_devices(
        self, device_ids: Sequence[int], env: MutableMapping[str, str] = os.environ
    ) -> None:
        """Restrict this process (and its children) to `device_ids`. Must run before the device
        runtime initialises; on CPU it does nothing."""
        if self.visible_devices_env_var is None:
            return
        env[self.visible_devices_env_var] = ",".join(str(int(i)) for i in device_ids)

    def ray_worker_env(self, manage_visible_devices: bool) -> dict[str, str]:
        """Env vars for a Ray actor's runtime_env.

        Args:
            manage_visible_devices: True when we set visible devices ourselves (e.g. colocated
                roles that must see every device of the node); Ray is then told not to rewrite
                the visible-devices variable.
        """
        if manage_visible_devices and self.ray_noset_env_var:
            return {self.ray_noset_env_var: "1"}
        return {}

    # ---- process-wide setup and device utilities
    def patch(self, mindspeed_switches: Optional[Mapping[str, Any]] = None) -> list[str]:
        """Apply this platform's one-time patches; call first thing in a process, before
        megatron is imported. Idempotent.

        Args:
            mindspeed_switches: MindSpeed feature switches (names in MINDSPEED_SWITCHES) from the
                model config. Forwarded to MindSpeed on NPU; reported as ignored elsewhere.

        Returns:
            Names of the switches that were set but ignored on this platform.
        """
        switches = check_switches(mindspeed_switches or {})
        ignored = [] if self.name == "npu" else [k for k, v in switches.items() if v]
        if ignored:
            log.warning("MindSpeed switches ignored on %s: %s", self.name, ", ".join(ignored))
        self.ops.patch(switches)
        return ignored

    def manual_seed(self, seed: int) -> None:
        """Seed torch's CPU generator and the device generators."""
        torch.manual_seed(seed)
        self.ops.manual_seed(seed)

    def synchronize(self) -> None:
        self.ops.synchronize()

    def empty_cache(self) -> None:
        self.ops.empty_cache()

    def configure_host_threads(self, cpus: float) -> dict[str, int]:
        """Size this worker's torch/OpenMP thread pool to the `cpus` CPU units its bundle holds and
        undo Ray's worker niceness where the platform computes on the host (CPU). Returns
        {"threads": ..., "nice": ...} as they are afterwards."""
        return self.ops.configure_host_threads(cpus)

    def memory_stats(self) -> dict[str, float]:
        """GiB figures: allocated_gb, reserved_gb, max_allocated_gb (device), or rss_gb,
        max_rss_gb (CPU)."""
        return self.ops.memory_stats()

    def grouped_mm(self, x: torch.Tensor, weights: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """(M, out) = each group's rows of x (M, in), in order, times its weight of `weights`
        (E, in, out); counts (E,) the rows per group, on x's device (moe_grouped_gemm's experts,
        models/grouped_experts.py). CPU and CUDA: torch._grouped_mm (offsets, no host sync); Ascend:
        MindSpeed's grouped matmul (platform/npu.py). Differentiable."""
        if self.name == "npu":
            return self.ops.grouped_mm(x, weights, counts)
        return torch._grouped_mm(x, weights, offs=torch.cumsum(counts, 0, dtype=torch.int32))

    def total_memory_bytes(self) -> Optional[int]:
        """The current device's memory in bytes; None on CPU (host memory is not the device's)."""
        return self.ops.total_memory_bytes()


def check_switches(switches: Mapping[str, Any]) -> dict[str, Any]:
    """Validate switch names; unknown names raise a ValueError listing the known ones."""
    unknown = sorted(set(switches) - set(MINDSPEED_SWITCHES))
    if unknown:
        raise ValueError(
            f"unknown MindSpeed switch(es) {unknown}; known switches: {', '.join(MINDSPEED_SWITCHES)}."
        )
    return dict(switches)


# ---------------------------------------------------------------------------------------------
# selection


def npu_available() -> bool:
    """torch_npu imports and reports at least one device."""
    try:
        torch_npu = importlib.import_module("torch_npu")
    except ImportError:
        return False
    try:
        return bool(torch_npu.npu.is_available()) and torch_npu.npu.device_count() > 0
    except Exception as err:  # a broken CANN install: say so, fall back
        log.warning("torch_npu is installed but unusable (%s); not selecting npu.", err)
        return False


def cuda_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def resolve_name(name: str = "auto") -> str:
    """Map "auto" to npu, else cuda, else cpu; check explicit names."""
    name = name.lower()
    if name == "auto":
        if npu_available():
            return "npu"
        return "cuda" if cuda_available() else "cpu"
    if name not in PLATFORM_NAMES:
        raise ValueError(f"unknown device platform {name!r}; choose one of auto, {', '.join(PLATFORM_NAMES)}.")
    return name


def expected_platform(requested: str) -> str:
    """The platform a run asking for `requested` will get, judged on the driver without touching a
    device (validation): an explicit name as it is; "auto" is npu where torch_npu is installed, else
    "auto" (cpu or cuda: alike for what validation asks, see own_rotary / attention_takes_masks)."""
    if requested == "auto" and importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    return requested


def attention_takes_masks(name: str) -> bool:
    """Whether attention on platform `name` honours the bool mask megatron hands it, as given, so a
    sliding window can be one more masked band (models/sliding_window.py): CPU and CUDA (SDPA or
    megatron's attention). NPU attends with MindSpeed's fused kernel, which builds its own causal mask."""
    return name != "npu"


MOE_TOKEN_DISPATCHERS = ("allgather", "alltoall", "alltoall_seq", "flex")


def moe_token_dispatchers(name: str) -> tuple[str, ...]:
    """Megatron MoE token dispatchers that run on platform `name`. On CPU only allgather: megatron's
    alltoall / alltoall_seq create a torch.cuda.Stream and hand split sizes to all_to_all as tensors
    where gloo wants lists, and flex needs DeepEP (CUDA). NPU / CUDA: all but flex on NPU."""
    if name == "cpu":
        return ("allgather",)
    return MOE_TOKEN_DISPATCHERS if name == "cuda" else MOE_TOKEN_DISPATCHERS[:3]


def sdpa_core_attention(name: str) -> bool:
    """Whether models on platform `name` use torch's scaled_dot_product_attention as megatron's
    local core attention (models/core_attention.py): CPU and CUDA. On NPU, MindSpeed's fused
    attention is switched by its own keys (use_flash_attn), so megatron's module stays."""
    return name in ("cpu", "cuda")


def sdpa_in_fp32_for_bf16(name: str) -> bool:
    """Whether the fused core attention (models/core_attention.py) computes bf16 inputs in fp32 on
    platform `name`: CPU. torch's CPU flash-attention kernel is slower in bf16 than in fp32 on CPUs
    without AMX (this project's avx512_bf16 EPYC, torch 2.13, (16, 4, 72, 64): forward + backward
    29 ms bf16 vs 15 ms fp32; the 10M bench update 0.38 s instead of 0.43 s), and fp32 is the more
    precise of the two. CUDA keeps its bf16 flash kernels; NPU does not use the module."""
    return name == "cpu"


def sdpa_native_gqa(name: str) -> bool:
    """Whether the fused core attention (models/core_attention.py) hands GQA's K/V to SDPA as they are
    (`enable_gqa=True`) on platform `name`, instead of repeating each group's K/V for its query heads:
    CPU. torch's CPU flash kernel serves the groups itself, with the same forward bits and the K/V
    gradients summed in another order (1e-6), without the repeated copies and their backward. CUDA
    keeps the repeat, as verified on an H200 (enable_gqa not measured there: with an attention mask
    SDPA may pick a kernel without GQA support); NPU does not use the module."""
    return name == "cpu"


def fused_adamw(name: str) -> bool:
    """Whether torch's Adam/AdamW on platform `name` runs its fused kernel (one pass over every
    parameter; on CPU 5x faster than the per-parameter loop torch picks there, same numbers to 1e-8):
    CPU and CUDA. On NPU MindSpeed brings its own fused Adam, so torch's flags are left alone."""
    return name in ("cpu", "cuda")


def own_rotary(name: str) -> bool:
    """Whether models on platform `name` apply RoPE with models/rotary.py (cos/sin once per table, one
    rotation op) instead of megatron's unfused rope: CPU and CUDA. On NPU, MindSpeed's fused rope stays
    (use_fused_rotary_pos_emb)."""
    return name in ("cpu", "cuda")


def own_swiglu(name: str) -> bool:
    """Whether gated silu MLPs on platform `name` run models/swiglu.py (silu(a) * b on the halves of
    fc1's output, backward without a cat) through megatron's bias_activation_fusion hook: CPU and CUDA.
    On NPU, MindSpeed's fused swiglu stays (use_fused_swiglu)."""
    return name in ("cpu", "cuda")


def compiled_decode(name: str) -> bool:
    """Whether the native rollout engine may compile its decode step with torch.compile (inductor) on
    platform `name` (rollout/kv_cache.static_decode_step, `enforce_eager: false`): CPU and CUDA. On
    Ascend, torch.compile needs torchair's backend, which the native engine does not wire;
    `rollout_engine: vllm` (vllm-ascend) compiles there."""
    return name in ("cpu", "cuda")


def compile_failed() -> tuple[type[BaseException], ...]:
    """torch.compile's errors raised while compiling (before a graph runs): inductor's, e.g. no C++
    compiler, subclass BackendCompilerFailed. The compiled decode and compiled layers fall back on
    them (`except compile_failed() as err:`). A function, not a module constant: importing
    torch._dynamo takes 2-7 s on a 2-core host, which the driver (it imports this module and never
    compiles) would pay at start-up; the model workers load it anyway, through megatron-core's own
    import. An except clause's expression is evaluated only when an exception reaches it, by which
    time torch.compile has imported it."""
    import torch._dynamo.exc as dynamo_exc

    return dynamo_exc.BackendCompilerFailed, dynamo_exc.InternalTorchDynamoError


def compile_error_summary(err: Exception) -> str:
    """`Type: first non-empty line` of a compile error (at most 300 characters of the line), for the
    one warning a fallback to eager logs. Dynamo's wrapper of a backend's error (`backend='...'
    raised:`) is summarised by the error it wraps."""
    inner = getattr(err, "inner_exception", None)
    if isinstance(inner, BaseException) and inner is not err:
        return f"{type(err).__name__} ({compile_error_summary(inner)})"
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    return f"{type(err).__name__}: {first[:300]}"


def compile_fix(summary: str, skip: str) -> str:
    """The fix sentence of a fallback warning: a missing C++ compiler is the one failure a user can
    mend; otherwise `skip` (the setting that turns compiling off) is the way out."""
    if "Cxx" in summary or "C++" in summary:
        return f"Inductor on CPU needs a working C++ compiler (g++ or clang++); install one, or set {skip}."
    return f"The error is torch.compile's; set {skip} to skip compiling."


def compiled_layers(name: str) -> bool:
    """Whether `use_torch_compile` compiles the decoder layers of the training and log-prob forwards
    with torch.compile (inductor) on platform `name` (models/compiled_layers.py): CPU and CUDA. On
    Ascend torch.compile needs torchair's backend, and MindSpeed's fused kernels serve there."""
    return name in ("cpu", "cuda")


def make_platform(name: str) -> Platform:
    """Build the Platform for a resolved name (imports only that device's module)."""
    if name == "npu":
        from mindspeed_rl.platform import npu as ops

        return Platform("npu", "npu", "NPU", "hccl", "ASCEND_RT_VISIBLE_DEVICES",
                        "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", ops)
    if name == "cuda":
        from mindspeed_rl.platform import cuda as ops

        return Platform("cuda", "cuda", "GPU", "nccl", "CUDA_VISIBLE_DEVICES",
                        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", ops)
    from mindspeed_rl.platform import cpu as ops

    return Platform("cpu", "cpu", "NPU", "gloo", None, None, ops)
