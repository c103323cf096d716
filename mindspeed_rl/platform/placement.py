"""Device and dtype discipline: the one place that decides where tensors and weights live.

    dtype = params_dtype("bf16")                     # the yaml spelling -> torch dtype
    batch = to_device(batch, device)                 # a worker's inputs, once per call
    out = to_host(out)                               # what a worker hands back to the driver
    @on_device  def compute_log_prob(self, batch)    # both, around a worker entry point (self.device)
    place_model(model, device, dtype)                # every param/buffer on one device, one dtype
    problems = placement_problems(model, device, dtype)   # [] when place_model's promise holds

The rule (issue 17): the driver only ever holds CPU tensors; a worker moves its inputs to its
device at the entry of each call and its outputs back to the CPU before returning; models are
built and loaded on the worker's device, and loaders copy into the existing parameters (device and
dtype preserved) instead of replacing them.

Dtype choice, as megatron-core's own training (Float16Module casts the whole model): every weight,
norms included, is in params_dtype; the fp32 copies ("main params") live in the optimizer
(models/optimizer.py). Nothing stays fp32 on the side by accident: the torch-norm fallback of the
local layer spec is created by torch.nn.RMSNorm in the default dtype and on the default device,
which is why place_model exists.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

PARAMS_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def params_dtype(name: str) -> torch.dtype:
    """torch dtype of a `params_dtype` config value ("fp32", "bf16", "fp16")."""
    try:
        return PARAMS_DTYPES[name]
    except KeyError:
        raise ValueError(f"params_dtype {name!r} is not one of {', '.join(PARAMS_DTYPES)}.") from None


def to_device(tree: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """`tree` (tensors inside dicts / lists / tuples, anything else passed through) with every tensor
    on `device`. Tensors already there are returned as they are (no copy)."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device, non_blocking=non_blocking)
    if isinstance(tree, dict):
        return {k: to_device(v, device, non_blocking) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in tree):
        return type(tree)(to_device(v, device, non_blocking) for v in tree)
    return tree


def to_host(tree: Any) -> Any:
    """`tree` with every tensor detached and on the CPU: what a worker returns through Ray."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {k: to_host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in tree):
        return type(tree)(to_host(v) for v in tree)
    return tree


def on_device(method: Optional[Callable] = None, *, move_inputs: bool = True) -> Callable:
    """Decorator for a worker's entry points: tensors in the arguments go to `self.device` once, at
    the entry (unless move_inputs=False: generation reads its prompts as Python lists), and every
    tensor of the result comes back to the CPU for the driver. The one place where a worker's data
    crosses between the host and its device."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(self, *args: Any, **kwargs: Any) -> Any:
            if move_inputs:
                args, kwargs = to_device(args, self.device), to_device(kwargs, self.device)
            return to_host(fn(self, *args, **kwargs))

        call.on_device = True  # tests check every entry point carries it
        return call

    return wrap(method) if method is not None else wrap


# param_offload: null keeps the reference on the device while its weights take at most this share of
# the device's memory (a 1.5B bf16 reference, 3 GB, stays on a 64 GB NPU; a 7B one, 14 GB, is offloaded)
REF_OFFLOAD_AUTO_SHARE = 0.05


def ref_offload(platform_name: str, setting: Optional[bool], weight_bytes: int,
                device_bytes: Optional[int]) -> tuple[bool, str]:
    """Whether a reference colocated with the actor keeps its weights in host memory between uses
    (MindSpeed-RL's reference offload), and why. On CPU never (they are in host memory already);
    `setting` true/false (the role's param_offload) decides on a device; null (auto) offloads when
    the weights exceed REF_OFFLOAD_AUTO_SHARE of the device's memory, or when that is unknown. Moving
    the weights costs two host-device copies per step: on an H200 a 135M reference's forward took
    0.157 s offloaded against TRL's 0.021 s kept (bench/grpo_step.py --device cuda)."""
    if platform_name == "cpu":
        return False, "cpu: the weights are in host memory already"
    gib = weight_bytes / 2 ** 30
    if setting is not None:
        return bool(setting), f"param_offload: {str(bool(setting)).lower()} ({gib:.2f} GiB of weights)"
    if not device_bytes:
        return True, f"param_offload auto: the device's memory is unknown, offloading {gib:.2f} GiB of weights"
    share = weight_bytes / device_bytes
    keep = share <= REF_OFFLOAD_AUTO_SHARE
    return not keep, (f"param_offload auto: {gib:.2f} GiB of weights = {share:.1%} of the device's "
                      f"{device_bytes / 2 ** 30:.0f} GiB, {'kept on the device' if keep else 'offloaded'} "
                      f"(limit {REF_OFFLOAD_AUTO_SHARE:.0%})")


def tensor_devices(tree: Any) -> set[torch.device]:
    """The devices of the tensors in `tree` (for checks and tests)."""
    if isinstance(tree, torch.Tensor):
        return {tree.device}
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return set().union(*(tensor_devices(v) for v in tree)) if tree else set()
    return set()


# router buffers that stay fp32 in a bf16 / fp16 model, as megatron and transformers keep them: the
# expert bias (GLM-4.5's e_score_correction_bias; rounded, it flips near-tied expert choices) and the
# token counts it is updated from
FP32_BUFFERS = ("router.expert_bias", "router.local_tokens_per_expert")


@torch.no_grad()
def place_model(model: torch.nn.Module, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """Move every parameter and buffer of `model` to `device` and cast the floating ones to `dtype`,
    in place: the Parameter objects stay the same (module._apply assigns .data), so references held
    elsewhere (optimizers built later, tied weights) stay valid. FP32_BUFFERS stay fp32."""
    if dtype is None:
        return model.to(device)
    model.to(device=device, dtype=dtype)
    for name, buffer in model.named_buffers():
        if name.endswith(FP32_BUFFERS):
            buffer.data = buffer.data.float()
    return model


def placement_problems(model: torch.nn.Module, device: torch.device,
                       dtype: Optional[torch.dtype] = None) -> list[str]:
    """One line per parameter/buffer of `model` that is not on `device` (or, for floating tensors,
    not in `dtype`); [] when the model is placed as place_model promises."""
    device = torch.device(device)
    problems = []
    named = list(model.named_parameters()) + list(model.named_buffers())
    for name, t in named:
        on = t.device
        if on.type != device.type or (device.index is not None and on.index != device.index):
            problems.append(f"{name} is on {on}, not {device}")
        if dtype is not None and t.is_floating_point() and t.dtype != dtype and not name.endswith(FP32_BUFFERS):
            problems.append(f"{name} is {t.dtype}, not {dtype}")
    return problems
