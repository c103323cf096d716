"""Decode matmuls on prepacked weights (CPU, bf16): oneDNN's blocked weight layout, reordered once
per generation instead of once per matmul.

Why: torch's bf16 `matmul(x, W.t())` on the CPU goes through oneDNN, which reorders W into its
blocked layout on every call. In a decode step (a few rows against every weight of the model)
that reorder is most of the work. On this project's 2-core avx512_bf16 EPYC, the 48 matmuls of
a 12-layer 50M-parameter step at 16 rows took 10.1 ms plain and 6.4 ms prepacked, 7.9 / 4.3 ms at 7
rows; reordering every weight once took 46 ms. The results are bitwise the same (same kernel;
tests check it). fp32 goes through MKL, where prepacking did not pay (24 vs 30 ms), so it is
bf16 only. CUDA / NPU matmuls read weights in place: nothing to do there.

Use: `with packed_weights(weights, rows):` around a generation, and `matmul_t(x, W)` for each
linear of the decode path. Outside the block, or for a weight not packed, `matmul_t` is
`torch.matmul(x, W.t())`. The packed copies live only inside the block (one more copy of the
matmul weights during generation, none during training), so in-place optimizer updates between
generations are always seen. Under torch.compile `matmul_t` is the custom op
`mindspeed_rl::packed_linear` (inductor only lowers oneDNN's packed linear for frozen constant
weights, and the weights here are graph inputs): one opaque call per linear (~6 us of dispatch).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Optional

import torch

# data_ptr of a weight -> (the weight, its packed copy), filled only inside `packed_weights`
_PACKED: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def available(platform_name: str, dtype: torch.dtype) -> bool:
    """Whether decode matmuls of `dtype` weights on platform `platform_name` run on prepacked
    weights: bf16 on the CPU, where this torch build has oneDNN's packed linear."""
    return (platform_name == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def host_memory_available() -> Optional[int]:
    """Bytes the host can still give this process: /proc/meminfo's MemAvailable, capped by what is
    left under the cgroup's memory limit (v2 memory.max) when one is set; None where unknown."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                left = int(limit) - int(f.read().strip())
            avail = left if avail is None else min(avail, left)
    except (OSError, ValueError):
        pass
    return avail


def too_big(nbytes: int, fraction: float = 0.5) -> Optional[str]:
    """Why `nbytes` of packed copies should not be made now (None: they fit): more than `fraction` of
    the host memory still available, which the generation's KV cache and the update need too."""
    avail = host_memory_available()
    if avail is not None and nbytes > fraction * avail:
        return (f"the packed copies would take {nbytes / 2 ** 30:.2f} GiB, more than {fraction:.0%} of the "
                f"{avail / 2 ** 30:.2f} GiB of host memory available")
    return None


@contextlib.contextmanager
def packed_weights(weights: Iterable[torch.Tensor], rows: int) -> Iterator[int]:
    """Pack `weights` ((out, in) each, as megatron's linears hold them) for `rows`-row matmuls for the
    duration of the block; yields the bytes the packed copies take. Not re-entrant."""
    if _PACKED:
        raise RuntimeError("packed_weights is already active in this process")
    nbytes = 0
    try:
        for w in weights:
            if w.data_ptr() not in _PACKED:
                w = w.detach()
                _PACKED[w.data_ptr()] = (w, torch.ops.mkldnn._reorder_linear_weight(w, max(1, int(rows))))
                nbytes += w.numel() * w.element_size()  # the blocked copy is the same size (opaque tensor)
        yield nbytes
    finally:
        _PACKED.clear()


def _lookup(weight: torch.Tensor):
    entry = _PACKED.get(weight.data_ptr())
    if entry is None or entry[0].shape != weight.shape or entry[0].dtype != weight.dtype:
        return None
    return entry[1]


def _matmul_t(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    packed = _lookup(weight)
    if packed is None:
        return torch.matmul(x, weight.t())
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def _fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# `mindspeed_rl::packed_linear(x, weight)`: x @ weight.t() on weight's packed copy (a plain matmul when
# it has none), for compiled graphs. Defined with torch.library.Library rather than
# torch.library.custom_op: the call costs 6 instead of 13 us here (no autograd wrapper; decode runs
# under no_grad).
_LIB = torch.library.Library("mindspeed_rl", "FRAGMENT")
_LIB.define("packed_linear(Tensor x, Tensor weight) -> Tensor")
_LIB.impl("packed_linear", _matmul_t, "CPU")
_LIB.impl("packed_linear", _fake, "Meta")


def matmul_t(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.t(): on weight's packed copy inside `packed_weights`, else a plain matmul. Under
    torch.compile, the custom op (the packing is looked up when the graph runs)."""
    if torch.compiler.is_compiling():
        return torch.ops.mindspeed_rl.packed_linear(x, weight)
    return _matmul_t(x, weight)
