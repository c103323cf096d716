"""Time limits for verifier calls: a SIGALRM timer in the main thread, a helper process elsewhere.

Why two ways. A verifier can run away: a catastrophic regex, a sympy simplification that never
ends. Threads cannot be stopped, and a regex holds the GIL, so a watchdog thread would not even
wake up. What does stop them:
  - in the main thread of a process (a Ray actor with max_concurrency=1 runs its methods there):
    an interval timer whose SIGALRM handler raises. CPython's regex engine and sympy (pure
    Python) both check for signals, so the call unwinds at the deadline. Cost: two setitimer
    calls per verifier call (microseconds), so 256 short responses stay far under a second.
  - anywhere else (a threaded or async actor, a thread pool): the batch runs in a fresh helper
    Python process, which uses the timer above in its own main thread; if the helper misses a
    generous overall deadline (a C extension that ignores signals) it is killed. Each such
    batch pays the helper's start-up (about half a second).
`VerifierTimeout` derives from BaseException so that a verifier's `except Exception` (sympy and
math-verify have many) cannot swallow the deadline. A user function that sets SIGALRM itself
(e.g. math-verify with its default timeouts) replaces this timer for the rest of its call; call
math-verify with parsing_timeout=None and timeout_seconds=None, as math_boxed.py does.
"""

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class VerifierTimeout(BaseException):
    """A verifier call ran past its time limit."""


def alarm_available() -> bool:
    """True where SIGALRM timers work: a POSIX system, called from the main thread."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _raise_timeout(signum, frame):
    raise VerifierTimeout


@contextmanager
def alarm_scope() -> Iterator[None]:
    """Install the timeout handler for a batch of `call_with_alarm` calls; restore what was there.

    A timer that was already armed (e.g. pytest-timeout's) is re-armed afterwards with the time
    it had left, so this scope only borrows SIGALRM.
    """
    previous_delay, previous_interval = signal.getitimer(signal.ITIMER_REAL)
    started = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, _raise_timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # None: the old handler was installed from C and cannot be put back; the default is closest
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous_handler is None else previous_handler)
        if previous_delay > 0:
            left = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), previous_interval)


def call_with_alarm(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
    """fn(*args), raising VerifierTimeout after `timeout_s` seconds. Only inside `alarm_scope`."""
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


# ---- helper process for callers off the main thread

# The child runs fn(*args) from a pickle on stdin. Its fd 1 is pointed at stderr so that prints
# of user verifiers cannot corrupt the pickled result, which goes to a saved copy of stdout.
_CHILD = """
import importlib, os, pickle, sys
result_fd = os.dup(1)
os.dup2(2, 1)
module, name, args = pickle.load(sys.stdin.buffer)
result = getattr(importlib.import_module(module), name)(*args)
with os.fdopen(result_fd, "wb") as out:
    pickle.dump(result, out)
"""


class HelperProcessError(RuntimeError):
    """The helper process died without a result (crash, kill, import failure)."""


def call_in_helper_process(fn: Callable[..., Any], args: tuple, deadline_s: float) -> Any:
    """fn(*args) in a fresh Python process, whose main thread can use the alarm timer.

    A new interpreter (not fork, not multiprocessing's spawn) so that neither the caller's
    threads nor its __main__ module are copied or re-run. It inherits sys.path and stderr.

    Args:
        fn: a module-level function (found again by module and name in the child).
        args: picklable arguments.
        deadline_s: the child is killed after this many seconds.

    Raises:
        VerifierTimeout: past the deadline.
        HelperProcessError: the child exited without a result.
    """
    payload = pickle.dumps((fn.__module__, fn.__qualname__, args))
    path = os.pathsep.join(p or os.getcwd() for p in sys.path)
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        out, _ = proc.communicate(payload, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise VerifierTimeout from None
    if proc.returncode != 0 or not out:
        raise HelperProcessError(f"reward helper process exited with code {proc.returncode} (its stderr is above)")
    return pickle.loads(out)
