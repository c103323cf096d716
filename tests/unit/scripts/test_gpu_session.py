"""scripts/gpu_session.sh (the two device calls of a GPU lease) without a GPU: its usage, the plain
sentences when a carried part or the model directory is missing; scripts/random_hf.py on a tiny config."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testing_utils import make_tiny_hf

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu_session.sh"


def session(*args, out):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(out)})


def test_the_script_parses_and_says_its_usage(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    for args in ([], ["stage3"]):
        proc = session(*args, out=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith("usage: bash scripts/gpu_session.sh"), proc.stderr


@pytest.mark.parametrize("stage,part", [("stage1", 2), ("stage2", 1)])
def test_a_stage_without_its_part_says_which_to_carry(tmp_path, stage, part):
    """In a checkout without the bundle (a copy of the script in an empty tree: this one may have it)."""
    (tmp_path / "scripts").mkdir()
    copy = tmp_path / "scripts" / "gpu_session.sh"
    copy.write_text(SCRIPT.read_text())
    proc = subprocess.run(["bash", str(copy), stage], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(tmp_path / "out")})
    assert proc.returncode == 3
    assert f".gpu_bundle/part{part}/install.sh is missing: carry .gpu_bundle/part{part} with this call" in proc.stderr


def test_prepare_refuses_a_directory_without_a_config(tmp_path):
    proc = session("prepare", str(tmp_path), out=tmp_path)
    assert proc.returncode == 2 and f"no config.json in {tmp_path}" in proc.stderr


def test_random_hf_builds_the_config_with_fresh_weights_and_copies_the_tokenizer(tmp_path):
    import torch
    from safetensors.torch import load_file

    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tiny_hf("llama", str(src))
    (src / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    (src / "chat_template.jinja").write_text("{{ messages }}")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "random_hf.py"), str(src), str(dst)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LlamaForCausalLM" in proc.stdout and "tokenizer_config.json" in proc.stdout
    assert json.loads((dst / "config.json").read_text())["hidden_size"] == json.loads(
        (src / "config.json").read_text())["hidden_size"]
    assert (dst / "tokenizer_config.json").is_file() and (dst / "chat_template.jinja").is_file()
    old, new = load_file(str(src / "model.safetensors")), load_file(str(dst / "model.safetensors"))
    assert old.keys() == new.keys() and any(not torch.equal(old[k], new[k]) for k in old)


def test_random_hf_needs_a_config(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "random_hf.py"), str(tmp_path), str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "has no config.json" in proc.stderr
