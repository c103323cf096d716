"""Fixtures for the data tests (helpers live in data_helpers.py, importable by name from tests here)."""

import pytest

from data_helpers import make_qwen_like_tokenizer


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory) -> str:
    return make_qwen_like_tokenizer(str(tmp_path_factory.mktemp("qwen_tok")))


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir):
    from mindspeed_rl.data.tokenizer import load_tokenizer

    return load_tokenizer(qwen_tokenizer_dir)


@pytest.fixture()
def hf_cache(tmp_path) -> str:
    """A per-test datasets cache, so tests neither share nor leave Arrow caches in ~/.cache."""
    return str(tmp_path / "hf_cache")
