"""CPU device operations (platform.base.DeviceOps): gloo, no device runtime, and the
megatron-core CUDA shim (cpu_shim.py) as the one-time patch."""

from __future__ import annotations

import resource
from typing import Any, Mapping

from mindspeed_rl.platform import cpu_shim

_GB = float(1 << 30)


def patch(switches: Mapping[str, Any]) -> None:
    """Install the megatron-core CUDA->CPU shim (must precede `import megatron`)."""
    cpu_shim.install()


def set_device(index: int) -> None:
    """CPU has one device; nothing to select."""


def current_index() -> int:
    """The CPU is device 0."""
    return 0


def device_name(index: int) -> str:
    import torch

    return f"cpu ({torch.get_num_threads()} threads)"


def manual_seed(seed: int) -> None:
    """torch.manual_seed (done by Platform.manual_seed) already seeds the only generator."""


def synchronize() -> None:
    """CPU ops are synchronous."""


def empty_cache() -> None:
    """No caching allocator on CPU."""


def memory_stats() -> dict[str, float]:
    """Resident set size of this process (Linux /proc) and its peak (getrusage, KiB on Linux)."""
    stats = {"max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _GB}
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        stats["rss_gb"] = pages * resource.getpagesize() / _GB
    except (OSError, ValueError, IndexError):
        pass
    return stats
