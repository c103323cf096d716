"""The SmolLM2-135M-Instruct fixture (scripts/make_smollm2.py): built once, cached between runs,
and a skip with the reason when the GGUF package or the libraries to read it are unavailable."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("make_smollm2", ROOT / "scripts" / "make_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    script = load_script()
    try:
        return script.ensure_smollm2()
    except script.FixtureUnavailable as err:
        pytest.skip(f"SmolLM2-135M-Instruct fixture unavailable: {err}")
