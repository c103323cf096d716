"""Device platform layer: the only package that knows about NPU, CUDA or CPU devices.

    from mindspeed_rl.platform import get_platform
    plat = get_platform()                 # "auto": npu if torch_npu sees devices, else cuda, else cpu
    plat.patch(mindspeed_switches)        # FIRST, before megatron is imported; idempotent
    torch.distributed.init_process_group(plat.dist_backend, ...)
    device = plat.set_device(local_rank)

Public API
    get_platform(name="auto") -> Platform     cached; the first call fixes the process's platform
    Platform.name / device_type / ray_resource / dist_backend
    Platform.visible_devices_env_var / ray_noset_env_var
    Platform.device(local_rank) -> torch.device;  Platform.set_device(local_rank) -> torch.device
    Platform.get_visible_devices(env) -> list[int] | None;  Platform.set_visible_devices(ids, env)
    Platform.ray_worker_env(manage_visible_devices) -> dict   (RAY_EXPERIMENTAL_NOSET_* when needed)
    Platform.patch(mindspeed_switches=None) -> list[str]      (switches ignored on this platform)
    Platform.manual_seed(seed), synchronize(), empty_cache(), memory_stats() -> dict
    MINDSPEED_SWITCHES: the MindSpeed feature switch names we forward on NPU

Device and dtype discipline (placement.py; the rule is in its docstring):
    params_dtype("bf16") -> torch.dtype;  to_device(tree, device);  to_host(tree);  @on_device
    place_model(model, device, dtype);  placement_problems(model, device, dtype) -> list[str]
    Platform.current_device() -> torch.device (where models are built by default);  Platform.device_name()

Per device (one file each, no inheritance):
    npu.py   torch_npu + torch_npu.contrib.transfer_to_npu + mindspeed.megatron_adaptor (switches
             are handed to MindSpeed through the argv its adaptor parses), hccl, "NPU" resource.
    cuda.py  nothing to patch, nccl, "GPU" resource.
    cpu.py   gloo, "NPU" resource (the local Ray is started with N logical NPUs), and
             cpu_shim.py: the one version-checked shim redirecting megatron-core's hard-coded
             CUDA calls to the CPU (same idea as torch_npu's transfer_to_npu).
"""

from __future__ import annotations

from typing import Optional

from mindspeed_rl.platform.base import MINDSPEED_SWITCHES, Platform, make_platform, resolve_name
from mindspeed_rl.platform.placement import (PARAMS_DTYPES, on_device, params_dtype, place_model,
                                             placement_problems, tensor_devices, to_device, to_host)

__all__ = ["MINDSPEED_SWITCHES", "PARAMS_DTYPES", "Platform", "get_platform", "on_device", "params_dtype", "place_model",
           "placement_problems", "tensor_devices", "to_device", "to_host"]

_ACTIVE: Optional[Platform] = None


def get_platform(name: str = "auto") -> Platform:
    """The process's device platform. The first call selects it ("auto", "npu", "cuda", "cpu");
    later calls return the same object. Asking for a different explicit platform afterwards
    raises, because patches and device runtimes cannot be switched inside one process."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = make_platform(resolve_name(name))
    elif name.lower() not in ("auto", _ACTIVE.name):
        raise RuntimeError(
            f"this process already runs on platform {_ACTIVE.name!r}; cannot switch to {name!r}. "
            "Select the platform once, at process start."
        )
    return _ACTIVE
