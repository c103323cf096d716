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

from mindspeed_rl.distributed.cluster import GCS_WAIT_ENV, GCS_WAIT_S, NICENESS_ENV, WORKER_NICENESS
from mindspeed_rl.platform import get_platform
from testing_utils import free_port


# Every Ray instance the tests start (ray_session, the e2e runs' drivers, Ray's Cluster) gives its GCS
# as long to come up on a busy machine as the product's local starts do, and starts its workers at normal priority
# as those do.
os.environ.setdefault(GCS_WAIT_ENV, GCS_WAIT_S)
os.environ.setdefault(NICENESS_ENV, WORKER_NICENESS)


def pytest_configure(config):
    get_platform().patch()
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # xdist keeps order_for_workers' order (its default sorts by size)


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


@pytest.fixture
def tp1(gloo_world1):
    """megatron's parallel state at TP 1 / PP 1 in the test process, destroyed after the test (the Gated DeltaNet and
    Mamba-2 mixer tests)."""
    from mindspeed_rl.models.builder import destroy_parallel_state, init_parallel_state

    init_parallel_state(1, 1)
    yield
    destroy_parallel_state()


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
    parser.addoption("--core-archs", action="store_true",
                     help="skip the architecture-parametrized cases of NON_CORE_ARCHS (keeping one or two architectures of "
                          "each kind of layer megatron builds); .ci/megatron016.sh uses it")
    parser.addoption("--extended", action="store_true",
                     help="also run the tests marked `extended`: more architectures through paths CI already covers "
                          "with one of each kind (CI leaves them out for its time)")


# The architectures whose parametrized cases --core-archs keeps (the megatron-core 0.16 stage's): one or two of each
# kind of layer megatron builds: dense with and without q / k norms or biases (llama, qwen2, qwen3), a window (mistral),
# the MoE routers and experts (qwen3_moe, qwen2_moe's shared expert, mixtral, deepseek_v3's MLA with sigmoid routing and
# the expert bias, gpt_oss's biased experts and sinks), sandwich and post norms (gemma3_text, olmo2), soft caps (gemma2),
# Gated DeltaNet (qwen3_5_text), fused checkpoints and partial RoPE (phi3), LayerNorm with biases (starcoder2), the
# parallel layer (cohere2), multipliers (granite), NoPE layers (smollm3), one-block layers (nemotron_h) and weightless
# RMSNorms with the embeddings' norm and negated RoPE angles (nanochat). The rest
# (tests/testing_utils.py's tiny models) are other checkpoints on those layers: the main stage runs all of them.
NON_CORE_ARCHS = frozenset((
    "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "ministral3", "mistral3", "gemma3", "gemma", "olmo", "olmo3", "olmoe",
    "flex_olmo", "hunyuan_v1_dense", "hunyuan_v1_moe", "granitemoe", "granitemoeshared", "granitemoehybrid", "glm4",
    "glm", "stablelm", "nemotron", "cohere", "phi", "gpt_neox", "falcon", "helium", "glm4_moe", "deepseek_v2",
    "glm4_moe_lite", "minimax_m2", "arcee", "apertus", "ernie4_5", "ernie4_5_moe", "seed_oss", "exaone4", "qwen3_5",
    "qwen3_5_moe_text", "qwen3_next", "qwen3_5_moe",
    # Nemotron-H's MoE variant (its experts without a gate are megatron's own MLP; its dense variant, the one-block
    # layers, stays core)
    "nemotron_h-moe",
    # Falcon-H1 without the mixer's gated norm (the same modules as its core variant, one fewer)
    "falcon_h1-nonorm",
    # LFM2-MoE (LFM2's layers, core, with DeepSeek-V3's routing without groups) and LFM2's older config.json form
    "lfm2_moe", "lfm2-idxs",
    # Gemma 4 read from its image-text checkpoint, and its full layers with values of their own (gemma4_text, core: two
    # layer shapes, the keys as values)
    "gemma4", "gemma4_text-kv",
    # EXAONE 3.0 / 3.5 (Llama under its own names) and EXAONE MoE (EXAONE 4.0's attention, DeepSeek-V3's routing)
    "exaone", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe", "sarvam_mla", "jais2", "mellum",
    # HyperCLOVA X (Granite's scalars with Gemma 3's post norms)
    "hyperclovax",
    # IQuest-Coder and InternLM3 (Llama under their own model_types; InternLM3's dynamic NTK RoPE)
    "iquestcoder", "internlm3",
    # VaultGemma (Gemma 2's layer, core, without its post norms), dots.llm1 and Solar Open (read as GLM-4.5)
    "vaultgemma", "dots1", "solar_open"))


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--extended"):
        skip = pytest.mark.skip(reason="an `extended` case (another architecture or placement on a path CI runs with "
                                       "one of its kind); run it with --extended")
        for item in items:
            if item.get_closest_marker("extended") is not None:
                item.add_marker(skip)
    if config.getoption("--core-archs"):
        skip = pytest.mark.skip(reason="not a core architecture (--core-archs: tests/conftest.py NON_CORE_ARCHS)")
        for item in items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if any(isinstance(v, str) and (v in NON_CORE_ARCHS or v.split("-")[0] in NON_CORE_ARCHS)
                   for v in params.values()):
                item.add_marker(skip)
    if config.getoption("--reverse-order"):
        items.reverse()
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (`-n 2 --dist loadfile`, the README's command)
        order_for_workers(items)


# The order test files are handed to the workers in, heaviest first: xdist hands out the next file when
# a worker frees up, so long files go first and the run ends with short ones on both workers.
_WEIGHT = {"e2e": 0, "real_model": 0, "dist": 1}  # anything else: 2 (unit, data: seconds each)


def order_for_workers(items):
    """Under xdist (`--dist loadfile`: a file is one unit of work, so its module- and class-scoped
    fixtures, a Ray instance or a built model, are set up once, as in a serial run), the files in the
    order of their directory's weight, `slow`-marked first within it, then as collected; a file's tests
    stay together and in order. (`--dist loadgroup` with per-test e2e units was tried: xdist 3.8 names a
    group by rewriting `item._nodeid`, which pytest 9.2 no longer reads, so its groups are ignored.)"""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests):
        path = tests[0].nodeid
        top = path.split("/")[1] if path.startswith("tests/") else ""
        return _WEIGHT.get(top, 2), tests[0].get_closest_marker("slow") is None

    items[:] = [item for tests in sorted(files.values(), key=weight) for item in tests]  # stable sort
