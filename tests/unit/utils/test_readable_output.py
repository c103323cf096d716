"""Output a person can read: one line per logged step when the console is not a terminal, and
library warnings that say nothing to the user filtered (in the driver and, via PYTHONWARNINGS,
in every worker)."""
import logging
import os
import subprocess
import sys
import warnings

from mindspeed_rl.trainer.metrics import MetricsLogger
from mindspeed_rl.utils import logging as ms_logging

STEP = {"grpo/score/mean": 0.5, "actor/pg_loss": -0.25, "timing/step": 1.5}


def test_not_a_terminal_one_line_per_logged_step(tmp_path, capsys):
    logger = MetricsLogger(str(tmp_path), 5, log_interval=2, interactive=False)
    for step in range(1, 6):
        logger.log(step, STEP)
    logger.close()
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines == ["step 2/5 (40%): score/mean=0.5, actor/pg_loss=-0.25, timing/step=1.5",
                     "step 4/5 (80%): score/mean=0.5, actor/pg_loss=-0.25, timing/step=1.5",
                     "step 5/5 (100%): score/mean=0.5, actor/pg_loss=-0.25, timing/step=1.5"]
    assert "\r" not in out + err and "GRPO" not in err  # no progress bar anywhere


def test_default_follows_stderr(tmp_path, capsys, monkeypatch):
    """stderr not a terminal (a log file, CI): the default is the plain lines."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    logger = MetricsLogger(str(tmp_path), 1)
    logger.log(1, STEP)
    logger.close()
    out, err = capsys.readouterr()
    assert out.startswith("step 1/1 (100%)") and "\r" not in err


def test_terminal_gets_the_bar(tmp_path, capsys):
    logger = MetricsLogger(str(tmp_path), 2, interactive=True)
    logger.log(1, STEP)
    logger.close()
    out, err = capsys.readouterr()
    assert "GRPO" in err and "step 1: score/mean=0.5" in out + err


def test_noise_warnings_filtered_in_this_process():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ms_logging.quiet_library_warnings()
        warnings.warn("Apex is not installed. Falling back to Torch Norm", UserWarning)
        warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.", UserWarning)
        warnings.warn("something the user should see", UserWarning)
    assert [str(w.message) for w in seen] == ["something the user should see"]


def test_ray_token_notice_filtered_but_not_the_disabled_warning(caplog):
    ms_logging.quiet_library_warnings()
    ms_logging.quiet_library_warnings()  # idempotent: one filter
    name = ms_logging.NOISE_LOG_LINES[0][0]
    lg = logging.getLogger(name)
    assert len(lg.filters) == 1
    with caplog.at_level(logging.WARNING, logger=name):
        lg.warning("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.")
        lg.warning("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
    assert [r.getMessage()[:40] for r in caplog.records] == ["Token authentication is disabled for thi"]


def test_pythonwarnings_for_workers():
    env_value = ms_logging.python_warnings_env("default::DeprecationWarning")
    assert env_value.startswith("default::DeprecationWarning,ignore:Apex is not installed:UserWarning")
    code = ("import warnings\n"
            "warnings.warn('Apex is not installed. Falling back to Torch Norm')\n"
            "warnings.warn('Transformer Engine and Apex are not installed. Falling back to local implementations')\n"
            "warnings.warn('keep me')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": ms_logging.python_warnings_env()}, timeout=60)
    assert "keep me" in proc.stderr and "Apex" not in proc.stderr, proc.stderr
