"""bench/rollout_decode.py runs end to end on a tiny bf16 model (a smoke run: nothing asserts a time),
with the rows --plain adds beside the native engine's (its decode matmuls on the weights as they
are, against the prepacked ones)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


def test_plain_rows_beside_the_packed_native_row():
    from mindspeed_rl.platform import packed_linear

    if not packed_linear.available("cpu", torch.bfloat16):
        pytest.skip("this torch build has no oneDNN packed linear")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rollout_decode.py"), "--batch", "4", "--new-tokens", "16",
         "--prompt-len", "8", "--layers", "2", "--hidden", "64", "--ffn", "128", "--heads", "4", "--kv-heads", "2",
         "--vocab", "256", "--dtype", "bfloat16", "--sample", "--plain", "--stop-frac", "0", "--repeats", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line[:22].strip(): line for line in proc.stdout.splitlines()}
    assert "native (megatron)" in rows and "transformers generate" in rows
    assert "decode plain/packed" in rows["native, plain matmuls"], proc.stdout
