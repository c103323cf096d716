"""Shared test setup: hooks and fixtures only (helpers live in testing_utils.py).

Like every worker process, the test session selects the device platform and applies its patches
before anything imports megatron (on CPU: the megatron-core CUDA shim).
"""

import datetime
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from mindspeed_rl.platform import get_platform
from testing_utils import free_port


# Every Ray instance the tests start (ray_session, the e2e runs' drivers, Ray's Cluster) gives its GCS
# 120 s to come up on a busy machine, as mindspeed_rl.distributed.cluster does for the product's.
os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")


def pytest_configure(config):
    get_platform().patch()
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # xdist keeps plan_for_workers' order (its default sorts by size)


def pytest_sessionfinish(session, exitstatus):
    """The process groups the tests made in this process (gloo_world1's world, megatron's groups,
    vLLM's) shut down while the interpreter is whole: left to the interpreter's exit, their gloo
    threads can abort the process after every test passed (exit 134: most likely how stop 44's
    CI run ended, at the end of its main stage)."""
    from mindspeed_rl.distributed.worker_env import destroy_world

    destroy_world()


@pytest.fixture(scope="session")
def gloo_world1():
    """A world-size-1 gloo process group in the test process (for megatron parallel_state)."""
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        torch.distributed.init_process_group(
            "gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    yield


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The SmolLM2-135M-Instruct fixture (scripts/make_smollm2.py): built once, cached between runs,
    and a skip with the reason when the GGUF package or the libraries to read it are unavailable."""
    spec = importlib.util.spec_from_file_location(
        "make_smollm2", Path(__file__).resolve().parents[1] / "scripts" / "make_smollm2.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    try:
        return script.ensure_smollm2()
    except script.FixtureUnavailable as err:
        pytest.skip(f"SmolLM2-135M-Instruct fixture unavailable: {err}")


@pytest.fixture(scope="module", autouse=True)
def _no_ray_left_behind(request):
    """Every test module that connects to Ray disconnects (and so stops the instance it started)
    before the next module runs: no test can join a cluster an earlier one left (order-independent)."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail(f"{request.module.__name__} left a Ray connection open; shut it down in the test or its fixture.")


def pytest_addoption(parser):
    parser.addoption("--reverse-order", action="store_true",
                     help="run the collected tests last to first (checks that no test depends on an earlier one; "
                          "pytest-random-order's `-p random_order --random-order-bucket=global` shuffles)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    if config.getoption("--reverse-order"):
        items.reverse()
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (`-n 2 --dist loadgroup`, the README's command)
        plan_for_workers(items)


# The order units of work are handed to the workers in, heaviest first: xdist hands out the next unit
# when a worker frees up, so long units go first and the run ends with short ones on both workers.
_WEIGHT = {"e2e": 0, "real_model": 0, "dist": 1}  # anything else: 2 (unit, data: seconds each)
_SHARED_SCOPES = ("module", "class", "package")


def plan_for_workers(items):
    """Under xdist, the units of work and their order (README: Tests).

    A test whose module's tests share a module- or class-scoped fixture (a Ray instance, a built
    model) stays with them on one worker: the module is one unit (an `xdist_group` mark named after
    it), so the fixture is set up once, as in a serial run. Every other test is a unit of its own, so
    one long file (the e2e runs) spreads over both workers. Units are ordered by their directory's
    weight, `slow`-marked first within it, then as collected; a unit's tests stay together and in order.
    """
    units: dict[str, list] = {}
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        shared = fixtures is not None and any(
            d.scope in _SHARED_SCOPES and d.argname != "_no_ray_left_behind"
            for defs in fixtures.name2fixturedefs.values() for d in defs)
        module = item.nodeid.split("::")[0]
        if shared:
            item.add_marker(pytest.mark.xdist_group(module))
        units.setdefault(module if shared else item.nodeid, []).append(item)

    def weight(unit):
        first = unit[0]
        top = first.nodeid.split("/")[1] if first.nodeid.startswith("tests/") else ""
        return _WEIGHT.get(top, 2), first.get_closest_marker("slow") is None

    ordered = sorted(units.values(), key=weight)  # stable: collection order within a weight
    items[:] = [item for unit in ordered for item in unit]
