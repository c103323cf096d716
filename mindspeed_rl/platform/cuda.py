"""CUDA device operations (platform.base.DeviceOps). Megatron-core targets CUDA natively, so
there is nothing to patch; MindSpeed switches are reported as ignored by Platform.patch."""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

_GB = float(1 << 30)


def patch(switches: Mapping[str, Any]) -> None:
    """Nothing to patch on CUDA."""


def set_device(index: int) -> None:
    torch.cuda.set_device(index)


def current_index() -> int:
    return torch.cuda.current_device()


def device_name(index: int) -> str:
    return f"{torch.cuda.get_device_name(index)} (CUDA {torch.version.cuda})"


def manual_seed(seed: int) -> None:
    torch.cuda.manual_seed_all(seed)


def synchronize() -> None:
    torch.cuda.synchronize()


def empty_cache() -> None:
    torch.cuda.empty_cache()


def total_memory_bytes() -> int:
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def memory_stats() -> dict[str, float]:
    return {
        "allocated_gb": torch.cuda.memory_allocated() / _GB,
        "reserved_gb": torch.cuda.memory_reserved() / _GB,
        "max_allocated_gb": torch.cuda.max_memory_allocated() / _GB,
    }


def configure_host_threads(cpus: float) -> dict[str, int]:
    """The device computes; host threads only feed it, so Ray's settings stay. Reports them."""
    return {"threads": torch.get_num_threads(), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
