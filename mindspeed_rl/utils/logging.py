"""One logger setup for the driver and every Ray worker.

Console lines carry the role and rank so that interleaved output from many processes stays
readable:

    12:03:04 INFO  [actor r0] loaded 28 layers from /ckpt/qwen25-7b in 41.2 s
    12:03:04 WARN  [driver] use_flash_attn is ignored on cpu

Non-zero ranks are quiet by default (WARNING and above) so an 8-way TP group does not print
every line eight times; pass `all_ranks=True` (or set MINDSPEED_RL_LOG_ALL_RANKS=1) to see them.

    from mindspeed_rl.utils.logging import setup_logging, get_logger, progress
    setup_logging(role="actor", rank=dist_rank)        # once per process
    log = get_logger(__name__)
    for shard in progress(shards, desc="loading"):     # tqdm bar on rank 0 only
        ...
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")

ROOT = "mindspeed_rl"
_FORMAT = "%(asctime)s %(levelname)-5s [%(role_rank)s] %(message)s"
_STATE = {"role": "driver", "rank": 0, "configured": False}


class _RoleRankFilter(logging.Filter):
    """Stamps every record with the `[role rN]` prefix of this process."""

    def filter(self, record: logging.LogRecord) -> bool:
        role, rank = _STATE["role"], _STATE["rank"]
        record.role_rank = role if rank is None else f"{role} r{rank}"
        return True


def setup_logging(
    role: str = "driver",
    rank: Optional[int] = 0,
    level: int | str = logging.INFO,
    all_ranks: Optional[bool] = None,
) -> logging.Logger:
    """Configure the `mindspeed_rl` logger for this process. Safe to call again (e.g. once the
    rank is known); the last call wins.

    Args:
        role: actor / rollout / reference / reward / driver; shown in every line.
        rank: this process's rank in its role's worker group; None for the driver.
        level: level for rank 0 (and every rank when all_ranks).
        all_ranks: log `level` on every rank. Default: env MINDSPEED_RL_LOG_ALL_RANKS=1, else False.

    Returns:
        The configured `mindspeed_rl` root logger.
    """
    if all_ranks is None:
        all_ranks = os.environ.get("MINDSPEED_RL_LOG_ALL_RANKS", "0") == "1"
    _STATE.update(role=role, rank=rank)
    logger = logging.getLogger(ROOT)
    if not _STATE["configured"]:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler.addFilter(_RoleRankFilter())
        logger.addHandler(handler)
        logger.propagate = False
        _STATE["configured"] = True
    quiet = not all_ranks and rank not in (None, 0)
    logger.setLevel(logging.WARNING if quiet else level)
    return logger


# Library warnings that tell a user nothing they can act on, filtered in one place: the driver
# calls quiet_library_warnings(); Ray workers get the same Python filters through PYTHONWARNINGS
# (distributed/worker_group.py). (message prefix, category name)
NOISE_WARNINGS = (
    ("Apex is not installed", "UserWarning"),  # megatron-core falls back to torch norms: the intended path off CUDA
    ("Transformer Engine and Apex are not installed", "UserWarning"),  # ... and to torch optimizers
    # selective recompute: megatron warns about Transformer Engine's fused attention, which no CPU run has
    ("If you are using transformer_engine as the transformer implementation", "UserWarning"),
)
# Log lines of other libraries, the same idea: (logger name, message prefix)
NOISE_LOG_LINES = (
    # Ray says its default (token authentication on) at every local start; the security-relevant
    # opposite ("... is disabled ...") stays visible
    ("ray._private.authentication.authentication_token_setup", "Token authentication is enabled for this Ray cluster"),
)


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes):
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def quiet_library_warnings() -> None:
    """Install the NOISE_WARNINGS / NOISE_LOG_LINES filters in this process (idempotent)."""
    import builtins
    import re
    import warnings

    for prefix, category in NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(prefix), category=getattr(builtins, category))
    for name, prefix in NOISE_LOG_LINES:
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefixes) and prefix in f.prefixes for f in lg.filters):
            lg.addFilter(_DropPrefixes([prefix]))


def python_warnings_env(existing: Optional[str] = None) -> str:
    """NOISE_WARNINGS as a PYTHONWARNINGS value (appended to `existing`), for worker processes."""
    ours = [f"ignore:{prefix}:{category}" for prefix, category in NOISE_WARNINGS]
    return ",".join([existing] + ours if existing else ours)


def get_logger(name: str) -> logging.Logger:
    """A child of the `mindspeed_rl` logger (pass `__name__`). Works before setup_logging()."""
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name}"
    return logging.getLogger(name)


def is_quiet_rank() -> bool:
    """True on ranks whose INFO output is suppressed (everything but rank 0 by default)."""
    return not logging.getLogger(ROOT).isEnabledFor(logging.INFO)


def progress(
    iterable: Iterable[T], desc: str = "", total: Optional[int] = None, unit: str = "it"
) -> Iterator[T]:
    """Iterate with a tqdm bar (prefixed with role and rank) on the logging rank; plain
    iteration on quiet ranks and when stderr is not a terminal-like stream that tqdm can use."""
    if is_quiet_rank() or not sys.stderr.isatty():  # redraws of a bar are noise in a log file
        yield from iterable
        return
    from tqdm.auto import tqdm  # lazy: keep `import mindspeed_rl.utils.logging` cheap

    role, rank = _STATE["role"], _STATE["rank"]
    prefix = role if rank is None else f"{role} r{rank}"
    yield from tqdm(iterable, desc=f"[{prefix}] {desc}".rstrip(), total=total, unit=unit,
                    file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
