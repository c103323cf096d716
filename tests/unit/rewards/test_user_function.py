"""load_user_function: both spec forms, and one plain sentence naming the spec for every mistake."""

import textwrap

import pytest

from mindspeed_rl.rewards import VERIFIERS, compute_score, load_user_function, validate_verifiers
from mindspeed_rl.utils.errors import UserInputError

SOURCE = textwrap.dedent(
    """
    def exact(response, label):
        return float(response.strip() == label)

    def with_extras(response, label, extra_info=None, **kwargs):
        return 0.5

    def one_arg(response):
        return 1.0

    def keyword_only(response, *, label):
        return 1.0

    NOT_CALLABLE = 3
    """
)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(SOURCE)
    return path


def test_file_spec(user_file):
    fn = load_user_function(f"{user_file}:exact")
    assert fn("72 ", "72") == 1.0
    assert compute_score(f"{user_file}:with_extras", "a", "b") == 0.5  # extra parameters with defaults are fine
    assert load_user_function(f"{user_file}:exact") is fn  # cached: the file runs once


def test_module_spec(user_file, monkeypatch):
    monkeypatch.syspath_prepend(str(user_file.parent))
    assert compute_score("my_rewards:exact", "x", "x") == 1.0
    validate_verifiers(["format", "my_rewards:exact"], [0.5, 0.5])


@pytest.mark.parametrize(
    "spec_suffix, message",
    [
        (":missing", "has no attribute 'missing'"),
        (":NOT_CALLABLE", "not a function"),
        (":one_arg", "cannot be called as fn\\(response, label\\)"),
        (":keyword_only", "cannot be called as fn\\(response, label\\)"),
        (":", "is not of the form"),
    ],
)
def test_bad_function_is_named(user_file, spec_suffix, message):
    spec = f"{user_file}{spec_suffix}"
    with pytest.raises(UserInputError, match=message) as err:
        load_user_function(spec)
    assert repr(spec) in str(err.value)


def test_missing_file_module_and_broken_import(tmp_path):
    with pytest.raises(UserInputError, match="does not exist; fix the path") as err:
        load_user_function(f"{tmp_path}/nope.py:fn")
    assert "nope.py" in str(err.value)
    with pytest.raises(UserInputError, match="module 'no_such_pkg.rewards' cannot be imported"):
        load_user_function("no_such_pkg.rewards:fn")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(UserInputError, match="RuntimeError: boom"):
        load_user_function(f"{broken}:fn")


def test_unknown_name_is_a_value_error_listing_the_valid_ones():
    with pytest.raises(ValueError, match="unknown verifier 'acc2'") as err:
        compute_score("acc2", "r", "l")
    assert isinstance(err.value, UserInputError)
    assert all(name in str(err.value) for name in VERIFIERS)
