"""Prepare the packages a GPU machine lacks, as files, in parts small enough to carry over.

    python scripts/gpu_bundle.py                       # -> .gpu_bundle/part1, part2, ... (+ plan.json)
    python scripts/gpu_bundle.py --dry-run             # print what would go in, fetch nothing
    # on the GPU machine, from the repository root, after each part has arrived (any order):
    bash .gpu_bundle/partN/install.sh && export PYTHONPATH=$PWD/.gpu_bundle/pylib:$PWD

Why: the GPU machines this project is checked on have torch, transformers, safetensors,
tokenizers, tensorboard, pytest and tqdm, but no Ray, megatron-core, hydra-core/omegaconf, antlr4
or math-verify, and reach no package index; one transfer carries at most 64 MiB.

What goes in: the requirement closure (this venv's metadata, markers evaluated for the target:
CPython 3.12, Linux x86_64, no extras) of --need, minus the closure of --have (what the target
already has, with everything those require). Each selected distribution is
  - copied from this venv with its dist-info when it is pure Python (its WHEEL says
    Root-Is-Purelib: true): a tar of its files as installed, unpacked into pylib there; the
    dist-info comes along because some packages read their own version (importlib.metadata);
  - otherwise downloaded as a wheel for the target (`pip download --only-binary=:all: --no-deps
    --platform manylinux... --python-version 3.12`), at the version installed here.
megatron-core's METADATA lists what its training scripts and tools need (wandb, zarr, nltk,
nvidia-modelopt, ...); the model code we run needs only einops and packaging from it, so its
requirements are replaced by that list (DEPS_OVERRIDE). megatron-core 0.12.1 has no CPython 3.12
wheel, so it is copied like a pure package, leaving out its compiled dataset helper (COPY_COMPILED).

Parts: files are packed first-fit-decreasing into parts of at most --part-mib MiB (default 56, to
leave room for the repository in a 64 MiB transfer); a file bigger than that (Ray's wheel, ~79 MB)
is cut into chunks in different parts. Every part has the same install.sh: it stages its files
next to pylib/, joins a cut wheel once all its chunks are staged, installs each complete wheel
with `pip install --no-index --no-deps --target pylib` and unpacks each tar into pylib.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEED = ("ray", "megatron-core", "hydra-core", "omegaconf", "antlr4-python3-runtime", "math-verify", "datasets")
# what the GPU machines' image holds (the device tool's KINDS.md); every install_requires entry of
# setup.py is in NEED or here (a test checks), so the bundle cannot miss a runtime dependency
HAVE = ("torch", "transformers", "safetensors", "tokenizers", "tensorboard", "pytest", "tqdm", "numpy", "pyarrow",
        "pandas", "fsspec", "xxhash", "huggingface-hub", "filelock", "packaging", "pyyaml", "requests", "aiohttp",
        "psutil")
DEPS_OVERRIDE = {"megatron-core": ("einops", "packaging")}
# compiled distributions copied anyway, and why that is safe: megatron-core 0.12.1 publishes no
# CPython 3.12 wheel; its one compiled module (megatron/core/datasets/helpers_cpp, built for this
# venv's Python) serves megatron's own dataset builders, which this project never imports.
COPY_COMPILED = {"megatron-core": "megatron/core/datasets/helpers_cpp is only used by megatron's datasets"}
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
          "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
MIB = 1 << 20


# ---------------------------------------------------------------------------------------------
# selection


@dataclass
class Dist:
    """What the selection needs to know about one installed distribution."""

    name: str  # canonical
    version: str
    requires: list[str] = field(default_factory=list)
    pure: bool = False


def installed(dists: Optional[Iterable[md.Distribution]] = None) -> dict[str, Dist]:
    """The distributions of this environment by canonical name."""
    out: dict[str, Dist] = {}
    for d in dists if dists is not None else md.distributions():
        name = canonicalize_name(d.metadata["Name"] or "")
        if not name or name in out:
            continue
        wheel = d.read_text("WHEEL") or ""
        pure = "Root-Is-Purelib: true" in wheel or name in COPY_COMPILED
        out[name] = Dist(name, d.version, list(d.requires or []), pure)
    return out


def runtime_requirements(dist: Dist, env: Mapping[str, str] = TARGET) -> list[str]:
    """Canonical names `dist` requires on the target (markers evaluated there, extras off)."""
    if dist.name in DEPS_OVERRIDE:
        return list(DEPS_OVERRIDE[dist.name])
    environment = {**default_environment(), **env}
    names = []
    for line in dist.requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(environment):
            names.append(canonicalize_name(req.name))
    return names


def closure(roots: Iterable[str], dists: Mapping[str, Dist]) -> tuple[list[str], list[str]]:
    """(names reachable from roots that are installed here, names required but not installed)."""
    seen, absent, todo = [], [], [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop(0)
        if name in seen or name in absent:
            continue
        if name not in dists:
            absent.append(name)
            continue
        seen.append(name)
        todo += runtime_requirements(dists[name])
    return seen, absent


def select(need: Iterable[str], have: Iterable[str], dists: Mapping[str, Dist]) -> dict[str, list]:
    """The plan: pure (copy from here) and wheels (download) as [name, version], the names that
    are required but not installed here (the bundle cannot bring them), and what the target is
    assumed to have."""
    wanted, missing_here = closure(need, dists)
    present, _ = closure(have, dists)
    chosen = [dists[n] for n in wanted if n not in present]
    return {"pure": [[d.name, d.version] for d in chosen if d.pure],
            "wheels": [[d.name, d.version] for d in chosen if not d.pure],
            "not_installed_here": sorted(missing_here), "assumed_present": sorted(present)}


# ---------------------------------------------------------------------------------------------
# parts


def plan_parts(files: Mapping[str, int], limit: int) -> list[list[tuple[str, int, int, int]]]:
    """First-fit-decreasing packing of {file: size} into parts of at most `limit` bytes. A file
    larger than `limit` is cut into ceil(size/limit) chunks, placed like separate files.

    Returns:
        parts, each a list of (file, chunk index, chunk count, chunk size).
    """
    pieces = []
    for name, size in files.items():
        count = max(1, -(-size // limit))
        for i in range(count):
            pieces.append((name, i, count, min(limit, size - i * limit)))
    pieces.sort(key=lambda p: -p[3])
    parts: list[list[tuple[str, int, int, int]]] = []
    room: list[int] = []
    for piece in pieces:
        for j, free in enumerate(room):
            if piece[3] <= free:
                parts[j].append(piece)
                room[j] -= piece[3]
                break
        else:
            parts.append([piece])
            room.append(limit - piece[3])
    return parts


def chunk_name(file: str, index: int, count: int) -> str:
    return file if count == 1 else f"{file}.chunk{index + 1:02d}-of-{count:02d}"


def write_chunk(src: str, dst: str, index: int, limit: int, size: int) -> None:
    with open(src, "rb") as f, open(dst, "wb") as out:
        f.seek(index * limit)
        out.write(f.read(size))


INSTALL_SH = r"""#!/usr/bin/env bash
# One part of the mindspeed_rl GPU bundle (scripts/gpu_bundle.py). Run every part's copy once, in any
# order; each installs what is complete so far into pylib/ next to the parts. Then:
#   export PYTHONPATH=<repo>/.gpu_bundle/pylib:<repo>
# PYTHON (default python3) is the interpreter whose pip installs the wheels: the one that runs the checks.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BASE="${GPU_BUNDLE_BASE:-$(dirname "$HERE")}"
STAGE="$BASE/staging"; DEST="$BASE/pylib"
mkdir -p "$STAGE" "$DEST"
for f in "$HERE"/*; do case "$f" in *install.sh|*manifest.json) ;; *) cp -f "$f" "$STAGE/" ;; esac; done
cd "$STAGE"
for first in *.chunk01-of-*; do
  [ -e "$first" ] || continue
  whole="${first%.chunk01-of-*}"; count="${first##*-of-}"
  have=$(ls "$whole".chunk*-of-"$count" 2>/dev/null | wc -l)
  if [ "$have" -eq "$((10#$count))" ] && [ ! -e "$whole" ]; then cat "$whole".chunk*-of-"$count" > "$whole"; fi
done
for f in *.whl *.tar; do
  [ -e "$f" ] || continue
  [ -e "$f.installed" ] && continue
  case "$f" in
    *.whl) "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --target "$DEST" --upgrade "$f" ;;
    *.tar) tar -xf "$f" -C "$DEST" ;;
  esac
  touch "$f.installed"; echo "gpu_bundle: installed $f"
done
left=$(ls *.chunk*-of-* 2>/dev/null | sed 's/\.chunk.*//' | sort -u | while read w; do [ -e "$w" ] || echo "$w"; done)
if [ -n "$left" ]; then echo "gpu_bundle: waiting for the other parts of: $left"; fi
"""


def pure_tar(dist_name: str, out_dir: str) -> str:
    """A tar of the installed files of `dist_name` (its dist-info included, caches and files outside
    site-packages left out), named {name}-{version}.tar."""
    d = md.distribution(dist_name)
    base = str(d.locate_file(""))
    path = os.path.join(out_dir, f"{canonicalize_name(dist_name)}-{d.version}.tar")
    with tarfile.open(path, "w") as tar:
        for f in d.files or []:
            rel = str(f)
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith((".pyc", ".so")):
                continue  # .so: only COPY_COMPILED packages get here with one, built for another Python
            full = os.path.join(base, rel)
            if os.path.isfile(full):
                tar.add(full, arcname=rel)
    return path


def download_wheel(name: str, version: str, out_dir: str) -> str:
    """pip download of name==version as a CPython 3.12 manylinux x86_64 wheel into out_dir."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps", "--python-version",
           "3.12", "--implementation", "cp", "--abi", "cp312", "-d", out_dir, f"{name}=={version}"]
    for p in PLATFORMS:
        cmd[5:5] = ["--platform", p]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"gpu_bundle: pip download of {name}=={version} did not finish within 900 s.") from None
    prefix = f"{name.replace('-', '_')}-{version}-".lower()
    got = sorted(f for f in os.listdir(out_dir) if f.lower().startswith(prefix) and f.endswith(".whl"))
    if proc.returncode != 0 or not got:
        raise SystemExit(f"gpu_bundle: pip could not download a CPython 3.12 manylinux x86_64 wheel of "
                         f"{name}=={version}: {proc.stderr.strip()[-400:]}")
    return os.path.join(out_dir, got[0])


def build(plan: dict, out: str, part_bytes: int) -> list[str]:
    """Fetch/pack everything in `plan` under out/files, then lay the parts out as out/partN."""
    files_dir = os.path.join(out, "files")
    shutil.rmtree(files_dir, ignore_errors=True)  # a failed earlier run's leftovers
    os.makedirs(files_dir)
    files = [pure_tar(n, files_dir) for n, _ in plan["pure"]]
    files += [download_wheel(n, v, files_dir) for n, v in plan["wheels"]]
    parts = plan_parts({f: os.path.getsize(f) for f in files}, part_bytes)
    dirs = []
    for i, part in enumerate(parts, 1):
        d = os.path.join(out, f"part{i}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for file, index, count, size in part:
            write_chunk(file, os.path.join(d, chunk_name(os.path.basename(file), index, count)), index,
                        part_bytes, size)
        with open(os.path.join(d, "install.sh"), "w") as f:
            f.write(INSTALL_SH)
        os.chmod(os.path.join(d, "install.sh"), 0o755)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"part": i, "of": len(parts), "files": sorted(os.listdir(d))}, f, indent=1)
        dirs.append(d)
    shutil.rmtree(files_dir)
    return dirs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, ".gpu_bundle"))
    p.add_argument("--need", nargs="+", default=list(NEED), help="distributions the target lacks")
    p.add_argument("--have", nargs="+", default=list(HAVE), help="distributions the target already has")
    p.add_argument("--part-mib", type=float, default=56.0)
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSON; fetch and write nothing")
    args = p.parse_args(argv)
    if args.part_mib <= 0:
        p.error(f"--part-mib must be > 0, got {args.part_mib}")
    dists = installed()
    absent = [n for n in args.need if canonicalize_name(n) not in dists]
    if absent:
        print(f"gpu_bundle: {', '.join(absent)} not installed in this environment ({sys.prefix}); run it with "
              f"the project's venv, where they are.", file=sys.stderr)
        return 2
    plan = select(args.need, args.have, dists)
    if args.dry_run:
        print(json.dumps(plan, indent=1))
        return 0
    dirs = build(plan, args.out, int(args.part_mib * MIB))
    with open(os.path.join(args.out, "plan.json"), "w") as f:
        json.dump(plan, f, indent=1)
    for d in dirs:
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{os.path.relpath(d, ROOT)}: {size / MIB:.1f} MiB, {len(os.listdir(d)) - 2} files")
    rel = os.path.relpath(args.out, ROOT)
    print(f"on the GPU machine, after each part arrives: bash {rel}/partN/install.sh && "
          f"export PYTHONPATH=$PWD/{rel}/pylib:$PWD")
    return 0


if __name__ == "__main__":
    sys.exit(main())
