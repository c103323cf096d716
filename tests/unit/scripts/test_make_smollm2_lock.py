"""scripts/make_smollm2.py builds the fixture once when several test processes ask at the same time
(pytest-xdist workers), and a wait for another builder ends with one sentence, not a hang."""
import fcntl
import importlib.util
import os
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def load_script():
    spec = importlib.util.spec_from_file_location("make_smollm2_under_test", ROOT / "scripts" / "make_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_callers_at_once_build_it_once(tmp_path, monkeypatch):
    script = load_script()
    builds = []

    def slow_convert(gguf, out_dir):
        builds.append(out_dir)
        time.sleep(0.5)  # the other caller arrives while this one builds
        os.makedirs(out_dir)
        Path(out_dir, "config.json").write_text("{}")
        Path(out_dir, "model.safetensors").write_bytes(b"")
        return out_dir

    monkeypatch.setattr(script, "find_gguf", lambda download=True: "model.gguf")
    monkeypatch.setattr(script, "convert", slow_convert)
    out = str(tmp_path / "smollm2")
    results = []
    threads = [threading.Thread(target=lambda: results.append(script.ensure_smollm2(out))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [out, out]
    assert builds == [out]  # the second caller waited for the lock, then found it built


def test_waiting_for_another_builder_times_out_naming_it(tmp_path, monkeypatch):
    script = load_script()
    monkeypatch.setattr(script, "LOCK_TIMEOUT_S", 0.3)
    monkeypatch.setattr(script, "convert", lambda *a: pytest.fail("built while another process held the lock"))
    out = str(tmp_path / "smollm2")
    with open(out + ".lock", "w") as held:  # another process building it
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(script.FixtureUnavailable, match=r"waited 0\.3 s for another process building .*smollm2 "
                                                            r"\(it holds .*smollm2\.lock\); let it finish or stop it"):
            script.ensure_smollm2(out)
