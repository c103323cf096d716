"""User reward functions named in the config as `module.path:function` or `/path/to/file.py:function`.

`load_user_function(spec)` imports the function once and checks, before any worker starts, that
it exists, is callable and accepts `(response, label)` (more parameters are fine if they have
defaults or are keyword catch-alls). Every problem is a `UserInputError` whose one sentence
names the spec and the fix. The function must return a number (bool and int count); scoring.py
turns anything else into a failure for that response.
"""

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable

from mindspeed_rl.utils.errors import UserInputError


def is_user_spec(name: str) -> bool:
    """True when a verifier name looks like `module:function` or `/path/file.py:function`."""
    return ":" in name


def _import_file(path: str, spec: str):
    if not os.path.isfile(path):
        raise UserInputError(
            f"reward function {spec!r}: file {path!r} does not exist; fix the path in verifier_function"
        )
    # a name derived from the path: two files called rewards.py do not overwrite each other
    module_name = "mindspeed_rl_user_reward_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise UserInputError(f"reward function {spec!r}: {path!r} cannot be loaded as Python; give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        raise UserInputError(
            f"reward function {spec!r}: importing {path!r} failed with {type(err).__name__}: {err}; fix that file"
        ) from err
    return module


def _import_module(target: str, spec: str):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        raise UserInputError(
            f"reward function {spec!r}: module {target!r} cannot be imported ({err}); "
            "check the spelling or put its directory on PYTHONPATH"
        ) from err
    except Exception as err:
        raise UserInputError(
            f"reward function {spec!r}: importing module {target!r} failed with {type(err).__name__}: {err}; "
            "fix that module"
        ) from err


@functools.lru_cache(maxsize=None)
def load_user_function(spec: str) -> Callable[..., float]:
    """Import and validate the reward function `module.path:function` or `/path/file.py:function`.

    Args:
        spec: the string from the config's verifier_function list.

    Returns:
        The function, callable as fn(response, label). Cached: a file is executed once per process.

    Raises:
        UserInputError: malformed spec, missing file/module/attribute, not callable, or a signature
            that cannot take (response, label).
    """
    target, _, attribute = spec.rpartition(":")
    if not target or not attribute.isidentifier():
        raise UserInputError(
            f"reward function {spec!r} is not of the form 'module.path:function' or '/path/file.py:function'; "
            "fix verifier_function"
        )
    is_file = target.endswith(".py") or os.sep in target or "/" in target
    module = _import_file(target, spec) if is_file else _import_module(target, spec)
    fn = getattr(module, attribute, None)
    if fn is None:
        raise UserInputError(f"reward function {spec!r}: {target!r} has no attribute {attribute!r}; fix the name")
    if not callable(fn):
        raise UserInputError(f"reward function {spec!r}: {attribute!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind("response", "label")
    except TypeError as err:
        raise UserInputError(
            f"reward function {spec!r} cannot be called as fn(response, label) ({err}); "
            "give it two positional parameters (more only with defaults or **kwargs)"
        ) from err
    except ValueError:  # builtins without a signature: accept, a failure will show per response
        pass
    return fn
