"""Ascend NPU device operations (platform.base.DeviceOps).

The one-time patch, in the order the Ascend stack requires (all before megatron is imported):
  1. `import torch_npu`                               registers the "npu" device with torch;
  2. `import torch_npu.contrib.transfer_to_npu`       redirects torch.cuda.* / device="cuda" to npu,
                                                       which covers megatron-core's CUDA calls;
  3. `import mindspeed.megatron_adaptor` (if installed) patches megatron-core with MindSpeed's
     fused kernels. MindSpeed decides which features to enable from the command line: its
     `mindspeed.args_utils.get_mindspeed_args()` (`megatron_adaptor.get_mindspeed_args()` in the
     releases paired with core 0.12) runs argparse `parse_known_args()` on sys.argv when the
     adaptor is imported, and caches the result. We therefore hand the config's switches over
     as `--use-flash-attn`-style flags in a temporary sys.argv during that import, then read
     MindSpeed's parsed args back and fail loudly if any switch did not arrive.

Nothing here can run on a machine without torch_npu; tests cover the argv/verification logic with
fake modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Mapping, Optional

from mindspeed_rl.utils.logging import get_logger

log = get_logger(__name__)
_GB = float(1 << 30)
_PATCHED: Optional[dict[str, Any]] = None  # the switches the adaptor was imported with


def switches_to_argv(switches: Mapping[str, Any]) -> list[str]:
    """{"use_flash_attn": True, "shape_order": "BSND", "use_mc2": False} ->
    ["--use-flash-attn", "--shape-order", "BSND"] (False/None switches are left out)."""
    argv: list[str] = []
    for key, value in switches.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        else:
            argv += [flag, str(value)]
    return argv


def _mindspeed_args():
    """MindSpeed's parsed feature args, from whichever module this MindSpeed release has."""
    for module_name in ("mindspeed.args_utils", "mindspeed.megatron_adaptor"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, "get_mindspeed_args"):
            return module.get_mindspeed_args()
    raise RuntimeError(
        "mindspeed is installed but exposes no get_mindspeed_args(); this MindSpeed release is "
        "not supported, install the one paired with your megatron-core."
    )


def verify_switches(switches: Mapping[str, Any], args: Any) -> None:
    """Raise if MindSpeed's parsed args disagree with a requested switch."""
    wrong = []
    for key, value in switches.items():
        if value is None or value is False:
            continue
        got = getattr(args, key, None)
        if got != value and str(got) != str(value):
            wrong.append(f"{key}={value!r} (MindSpeed has {got!r})")
    if wrong:
        raise RuntimeError(
            "MindSpeed did not pick up these switches: " + "; ".join(wrong) + ". "
            "mindspeed.megatron_adaptor was probably imported before the platform patch; call "
            "get_platform().patch(switches) first thing in the process."
        )


def patch(switches: Mapping[str, Any]) -> None:
    """torch_npu, transfer_to_npu, then MindSpeed's adaptor with `switches`. Idempotent; a second
    call with different switches raises (MindSpeed parses them once per process)."""
    global _PATCHED
    if _PATCHED is not None:
        if dict(switches) != _PATCHED:
            raise RuntimeError(
                f"NPU platform already patched with MindSpeed switches {_PATCHED}; cannot re-patch "
                f"with {dict(switches)} in the same process."
            )
        return
    adaptor_loaded = "mindspeed.megatron_adaptor" in sys.modules
    if "megatron.core" in sys.modules and not adaptor_loaded:
        raise RuntimeError(
            "megatron.core was imported before the NPU platform patch; MindSpeed must patch "
            "megatron first. Call get_platform().patch() before importing megatron or "
            "mindspeed_rl.models."
        )
    importlib.import_module("torch_npu")
    importlib.import_module("torch_npu.contrib.transfer_to_npu")
    if importlib.util.find_spec("mindspeed") is None:
        if any(v for v in switches.values()):
            log.warning("mindspeed is not installed: switches %s are ignored.", sorted(switches))
    else:
        saved_argv = sys.argv
        sys.argv = [saved_argv[0] if saved_argv else "mindspeed_rl"] + switches_to_argv(switches)
        try:
            importlib.import_module("mindspeed.megatron_adaptor")
        finally:
            sys.argv = saved_argv
        verify_switches(switches, _mindspeed_args())
    _PATCHED = dict(switches)


def _npu():
    # torch.npu exists once torch_npu is imported; go through torch_npu so the error says why.
    return importlib.import_module("torch_npu").npu


def set_device(index: int) -> None:
    _npu().set_device(index)


def current_index() -> int:
    return int(_npu().current_device())


def device_name(index: int) -> str:
    return str(_npu().get_device_name(index))


def manual_seed(seed: int) -> None:
    _npu().manual_seed_all(seed)


def synchronize() -> None:
    _npu().synchronize()


def empty_cache() -> None:
    _npu().empty_cache()


def total_memory_bytes() -> int:
    npu = _npu()
    return int(npu.get_device_properties(npu.current_device()).total_memory)


def memory_stats() -> dict[str, float]:
    npu = _npu()
    return {
        "allocated_gb": npu.memory_allocated() / _GB,
        "reserved_gb": npu.memory_reserved() / _GB,
        "max_allocated_gb": npu.max_memory_allocated() / _GB,
    }


def grouped_mm(x, weights, counts):
    """MindSpeed's grouped matmul for moe_grouped_gemm's experts (Platform.grouped_mm):
    `mindspeed.ops.gmm.npu_gmm_v2` takes the rows per group (group_list, int64 on the device, not
    their cumulative sum as npu_gmm does), x (M, in) split along M (group_type 0) and the weights as
    one contiguous (E, in, out) tensor, and has its backward (MindSpeed's GMMFunction)."""
    from mindspeed.ops import gmm

    return gmm.npu_gmm_v2(x, weights.contiguous(), bias=None, group_list=counts.long(), group_type=0)


def configure_host_threads(cpus: float) -> dict[str, int]:
    """The device computes; host threads only feed it, so Ray's settings stay. Reports them."""
    import torch

    return {"threads": torch.get_num_threads(), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
