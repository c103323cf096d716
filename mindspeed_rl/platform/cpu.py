"""CPU device operations (platform.base.DeviceOps): gloo, no device runtime, the megatron-core
CUDA shim (cpu_shim.py) as the one-time patch, and host threads sized to the worker's CPUs.

Why the threads: Ray starts an actor with OMP_NUM_THREADS = its num_cpus request (a fraction or 1
on a colocated bundle) and at niceness 15, so a CPU worker would compute on one core at low
priority. Here the worker's compute *is* the host, so it takes the CPU units of its device bundle
(pools.py) as torch/OpenMP threads and goes back to normal priority where the OS permits
(CAP_SYS_NICE or root; otherwise a warning says so).
"""

from __future__ import annotations

import os
import resource
from typing import Any, Mapping

import torch

from mindspeed_rl.platform import cpu_shim
from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)

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


def total_memory_bytes() -> None:
    """None: on CPU the model is in host memory already; there is no device memory to spare."""
    return None


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


def configure_host_threads(cpus: float) -> dict[str, int]:
    """torch intra-op threads and OMP/MKL_NUM_THREADS (for libraries started later) = `cpus`
    (at least 1), and niceness back to 0 when Ray raised it. Returns the resulting settings."""
    threads = max(1, int(cpus))
    torch.set_num_threads(threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError as err:  # lowering niceness needs CAP_SYS_NICE
            log.warning("this CPU worker keeps niceness %d (Ray's default; %s): it computes at low "
                        "priority. Run Ray as a user allowed to renice (CAP_SYS_NICE) to avoid it.", nice, err)
    return {"threads": torch.get_num_threads(), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
