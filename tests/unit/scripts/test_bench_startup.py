"""bench/startup.py reads the phases of the line ray_gpt.py prints once its workers are ready (the runs
themselves are the bench's: two ray_gpt.py start-ups per round, not a unit test's)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))


def test_the_ready_line_parses_into_its_phases():
    import startup

    from mindspeed_rl.trainer.launch import ready_line

    match = startup.READY.search("config ...\n" + ready_line(10.0, 12.5, 16.0, 30.25) + "\nstep 1/1 ...")
    assert match is not None
    assert [float(x) for x in match.groups()] == [20.2, 2.5, 3.5, 14.2]  # 20.25 and 14.25 print rounded to even


def test_zero_rounds_is_refused_in_one_sentence():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "startup.py"), "--rounds", "0"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--rounds must be at least 1, got 0" in proc.stderr
