"""mindspeed_rl.utils.logging: role/rank prefix, quiet non-zero ranks, progress helper."""

import io

import pytest

from mindspeed_rl.utils import logging as mlog


@pytest.fixture
def stream():
    buf = io.StringIO()
    root = mlog.setup_logging(role="driver", rank=None)
    old = root.handlers[0].setStream(buf)
    yield buf
    root.handlers[0].setStream(old)
    mlog.setup_logging(role="driver", rank=None)


def test_lines_carry_role_and_rank(stream):
    mlog.setup_logging(role="actor", rank=0)
    mlog.get_logger("mindspeed_rl.models.loader").info("loaded %d layers", 2)
    mlog.get_logger("workers").warning("slow")  # non-package names are re-rooted
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("INFO  [actor r0] loaded 2 layers")
    assert lines[1].endswith("WARNING [actor r0] slow")


def test_nonzero_ranks_are_quiet_unless_asked(stream, monkeypatch):
    log = mlog.get_logger(__name__)
    mlog.setup_logging(role="reference", rank=3)
    log.info("hidden")
    log.warning("shown")
    assert mlog.is_quiet_rank()
    monkeypatch.setenv("MINDSPEED_RL_LOG_ALL_RANKS", "1")
    mlog.setup_logging(role="reference", rank=3)
    log.info("now shown")
    out = stream.getvalue()
    assert "hidden" not in out and "[reference r3] shown" in out and "now shown" in out


def test_progress_yields_everything_on_any_rank(stream):
    mlog.setup_logging(role="actor", rank=1)
    assert list(mlog.progress(range(5), desc="quiet")) == list(range(5))
    mlog.setup_logging(role="actor", rank=0)
    assert list(mlog.progress(iter(range(5)), desc="bar", total=5)) == list(range(5))
