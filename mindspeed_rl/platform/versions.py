"""The accelerator stack checked at start-up against a documented matrix: one sentence per mismatch.

    problems = check_versions(installed_versions(), "npu")   # [] when the stack fits

ray_gpt.py runs it after the config validates and before Ray starts anything; `--skip-version-check`
(or `training.skip_version_check: true`) bypasses it for those who know better. The matrix is data:

- MEGATRON_CORE: the megatron-core releases this code is written and tested against (0.12.1, the
  one MindSpeed-LLM 2.2/2.3 pair with, and 0.16.x, verl's 2026 Ascend stack; .ci/megatron016.sh).
- TORCH_NPU_CANN: which CANN each torch_npu release was built for (Ascend Extension for PyTorch
  README, "Version Matching Table", releases v6.0.rc3 to v26.0.0). torch_npu X.Y.Z also pairs with
  torch X.Y.Z exactly (the first part of its version is the torch it was built for).
- vllm-ascend X.Y pairs with vllm X.Y (same release line); vLLM pins the torch it was built with
  (its package metadata says which), on every platform.
- MindSpeed: its core_r0.N branches adapt megatron-core 0.N; when its version names the core
  release (0.N.x) the minor must match megatron-core's.
- CUDA: on the cuda platform torch must be a CUDA build (torch.version.cuda set).
Versions are read from package metadata (nothing heavy is imported); CANN from the toolkit's
version file. A package that is not installed is not checked unless the platform needs it.
"""
from __future__ import annotations

import os
import re
from typing import Optional

MEGATRON_CORE = {"min": "0.12.1", "below": "0.17", "tested": ("0.12.1", "0.16")}
TORCH_NPU_CANN = {
    # torch_npu release -> CANN it was released for
    "2.10.0": "9.0.0", "2.9.0.post2": "9.0.0", "2.8.0.post4": "9.0.0", "2.7.1.post4": "9.0.0",
    "2.9.0": "8.5.0", "2.8.0.post2": "8.5.0", "2.7.1.post2": "8.5.0", "2.6.0.post5": "8.5.0",
    "2.8.0": "8.3.RC1", "2.7.1": "8.3.RC1",
    "2.1.0.post10": "8.0.0", "2.3.1.post4": "8.0.0", "2.4.0.post2": "8.0.0",
    "2.1.0.post8": "8.0.RC3", "2.3.1.post2": "8.0.RC3", "2.4.0": "8.0.RC3",
}
PACKAGES = ("torch", "torch_npu", "mindspeed", "megatron-core", "vllm", "vllm-ascend")
CANN_VERSION_FILES = ("{home}/version.cfg", "{home}/compiler/version.info", "{home}/aarch64-linux/ascend_toolkit_install.info",
                      "{home}/x86_64-linux/ascend_toolkit_install.info")


def _release(version: str) -> tuple[int, ...]:
    """'2.5.1.post2+cpu' -> (2, 5, 1); '8.0.RC3' -> (8, 0)."""
    out = []
    for part in re.split(r"[.+]", version):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def installed_versions() -> dict[str, Optional[str]]:
    """{package: version or None}, plus "cann" and "torch_cuda" (torch.version.cuda, None on others)."""
    from importlib import metadata

    out: dict[str, Optional[str]] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["cann"] = cann_version()
    out["torch_cuda"] = None
    if out["torch"]:
        import torch  # already imported by every caller of this module; cheap here
        out["torch_cuda"] = getattr(torch.version, "cuda", None)
    out["vllm_requires_torch"] = _pinned_torch("vllm") if out["vllm"] else None
    return out


def _pinned_torch(package: str) -> Optional[str]:
    """The `torch==X` a package's metadata pins (vLLM pins the torch its kernels were built with)."""
    from importlib import metadata

    for req in metadata.requires(package) or []:
        m = re.match(r"^torch\s*==\s*([\w.+]+)\s*(;.*)?$", req)
        if m and not (m.group(2) and "extra ==" in m.group(2)):
            return m.group(1)
    return None


def cann_version(env: Optional[dict] = None) -> Optional[str]:
    """The CANN toolkit version (ASCEND_TOOLKIT_HOME, else the default install path), None if none."""
    env = os.environ if env is None else env
    homes = [env.get("ASCEND_TOOLKIT_HOME"), "/usr/local/Ascend/ascend-toolkit/latest"]
    for home in filter(None, homes):
        for pattern in CANN_VERSION_FILES:
            path = pattern.format(home=home)
            try:
                with open(path) as f:
                    text = f.read()
            except OSError:
                continue
            m = re.search(r"(?:version|Version)\s*[=:]\s*\[?([0-9][\w.]*)", text)
            if m:
                return m.group(1)
    return None


def check_versions(v: dict[str, Optional[str]], platform: str) -> list[str]:
    """One sentence per mismatch of the installed stack `v` (installed_versions()) on `platform`."""
    problems: list[str] = []
    mc = v.get("megatron-core")
    if mc is None:
        problems.append("megatron-core is not installed; `pip install -c constraints.txt megatron-core` (0.12.1).")
    elif not _release(MEGATRON_CORE["min"]) <= _release(mc) < _release(MEGATRON_CORE["below"]):
        problems.append(f"megatron-core {mc} is outside the supported {MEGATRON_CORE['min']} to "
                        f"<{MEGATRON_CORE['below']} (tested: {', '.join(MEGATRON_CORE['tested'])}); install 0.12.1 or a 0.16.x.")
    torch_v = v.get("torch")
    if platform == "npu":
        npu = v.get("torch_npu")
        if npu is None:
            problems.append("the npu platform needs torch_npu; install the torch_npu release that pairs with "
                            f"torch {torch_v} and your CANN.")
        else:
            if torch_v and _release(npu)[:3] != _release(torch_v)[:3]:
                problems.append(f"torch_npu {npu} is built for torch {'.'.join(map(str, _release(npu)[:3]))}, "
                                f"but torch {torch_v} is installed; install the matching pair.")
            cann, want = v.get("cann"), TORCH_NPU_CANN.get(npu.split("+")[0])
            if cann is None:
                problems.append("no CANN toolkit found (ASCEND_TOOLKIT_HOME or /usr/local/Ascend/ascend-toolkit/latest); "
                                "source CANN's set_env.sh before starting.")
            elif want and _release(cann)[:2] != _release(want)[:2]:
                problems.append(f"torch_npu {npu} was released for CANN {want}, but CANN {cann} is installed; "
                                f"install the torch_npu release made for CANN {cann} (or CANN {want}).")
        ms = v.get("mindspeed")
        if ms and mc and _release(ms)[:1] == (0,) and _release(ms)[:2] != _release(mc)[:2]:
            problems.append(f"MindSpeed {ms} adapts megatron-core {'.'.join(map(str, _release(ms)[:2]))}.x, but "
                            f"megatron-core {mc} is installed; use MindSpeed's core_r{'.'.join(map(str, _release(mc)[:2]))} branch.")
        va, vl = v.get("vllm-ascend"), v.get("vllm")
        if va and not vl:
            problems.append(f"vllm-ascend {va} is installed without vllm; install vllm {'.'.join(map(str, _release(va)[:2]))}.x.")
        elif va and vl and _release(va)[:2] != _release(vl)[:2]:
            problems.append(f"vllm-ascend {va} pairs with vllm {'.'.join(map(str, _release(va)[:2]))}.x, but vllm {vl} "
                            f"is installed; install the matching pair.")
    if platform == "cuda" and torch_v and not v.get("torch_cuda"):
        problems.append(f"torch {torch_v} is a CPU build, but the platform is cuda; install a CUDA build of torch "
                        f"(https://pytorch.org/get-started/locally/).")
    pinned = v.get("vllm_requires_torch")
    if pinned and torch_v and _release(pinned)[:3] != _release(torch_v)[:3]:
        problems.append(f"vllm {v.get('vllm')} is built for torch {pinned}, but torch {torch_v} is installed; "
                        f"install torch {pinned} (or the vllm release built for torch {torch_v}).")
    return problems
