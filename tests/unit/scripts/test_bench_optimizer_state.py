"""bench/optimizer_state.py runs end to end on a one-layer model and prints its table (times are the
bench's business, not a test's)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.dist
def test_the_bench_prints_its_rows():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "optimizer_state.py"), "--layers", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("save at DP 2 (distributed optimizer)", "load at DP 2 (same TP / PP)",
                "load at TP 2, optimizer included", "load at TP 2, weights only"):
        assert row in proc.stdout, proc.stdout
    assert "checkpoint bytes: optimizer state" in proc.stdout and "weights" in proc.stdout
