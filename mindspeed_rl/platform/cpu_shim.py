"""Run megatron-core on CPU: the one shim that redirects its hard-coded CUDA calls.

Megatron-core assumes a CUDA device. On a CPU-only torch build its calls either raise ("Torch
not compiled with CUDA enabled") or, worse, silently do nothing (torch.cuda.manual_seed and
megatron's `_set_cuda_rng_state` queue a lazy call that never runs). This is the same idea as
torch_npu's transfer_to_npu, reduced to what megatron-core 0.12.x-0.16.x needs for GPTModel
forward/backward, TP/PP over gloo, DDP and the fp32 optimizer:

  torch.cuda.current_device    -> torch.device("cpu")  used as `device=` for buffers everywhere
                                  (tensor_parallel layers/mappings, p2p, rotary, attention)
  torch.cuda.synchronize       -> no-op                after p2p batch_isend_irecv, in timers
  torch.cuda.get_rng_state / set_rng_state / manual_seed -> the CPU generator:
                                  CudaRNGStatesTracker.add() seeds and snapshots the "device" RNG;
                                  on CPU the device RNG *is* the CPU RNG
  megatron ..random._get_cuda_rng_state / _set_cuda_rng_state -> CPU generator: the tracker's
                                  fork() uses them; upstream they index torch.cuda.default_generators
                                  via a lazy call that never runs on CPU
  torch.tensor / zeros / ones / empty / full / arange (device="cuda" | "cuda:N" | cuda device)
                               -> device="cpu"          e.g. schedules' total_num_tokens, the
                                  default causal mask (transformer/utils.py), optimizer scalars
  torch.Tensor.cuda            -> returns the tensor   schedules, tensor_parallel/data, rope_utils
  torch.Tensor.type()          -> "torch.cuda.FloatTensor" for a CPU float tensor (no-argument
                                  form only): the optimizers and clip_grads assert/branch on these
                                  strings (MindSpeed patches Tensor.type the same way for npu)
  torch.distributed.all_gather_into_tensor / reduce_scatter_tensor (and the _base aliases)
                               -> native op, or, when the gloo build in use lacks it (older
                                  torch), an equivalent built from all_gather / all_reduce.
                                  Megatron binds these at import (`dist_all_gather_func = ...`),
                                  which is why the shim must come first.

Scope: megatron only. Nothing in torch's own namespaces changes, so transformers, vLLM, a reward
model or user code in the same process see stock torch (replacing torch.tensor globally once gave
transformers' from_pretrained uninitialised rotary inv_freq). Instead an import hook (installed
first, so it sees every megatron module) rebinds, in each megatron.* module after it executes,
the names that point at torch, torch.cuda or torch.distributed to views of them in which the
entries above are replaced, and any module-level binding of a replaced function (megatron binds
`dist_all_gather_func = torch.distributed.all_gather_into_tensor` at import) to its replacement.
Tensor.cuda and Tensor.type are methods, so they are patched on the class but keep their stock
behaviour unless the calling frame belongs to a megatron module.

  megatron.core.transformer.moe.moe_utils.te_general_gemm (0.16, unbound without Transformer
                                  Engine) -> None, so MoE routers take their torch path

Not patched, because they already behave on CPU or are off our code paths: torch.cuda.empty_cache
and memory_* (no-ops / zeros while CUDA is uninitialised), device_count (0; only megatron's
datasets read it), Stream/Event/graphs (MoE overlap, partial distributed optimizer, CUDA graphs).
Megatron's "CPU RNG state changed within GPU RNG context" warning is filtered: on CPU both RNGs are
one generator, so the change is expected.

Each patch checks that its target exists (AttributeError naming it otherwise); install() is
idempotent, warns loudly for megatron-core versions outside 0.12-0.16, and raises if megatron was
imported first (its modules would hold stock torch and miss the redirects).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import logging
import re
import sys
import types
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist

SUPPORTED_MEGATRON = ((0, 12), (0, 16))  # inclusive (major, minor) range the shim was written for
_CPU = torch.device("cpu")
_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange")
_CPU_TYPE_NAME = re.compile(r"^torch\.\w+Tensor$")  # "torch.FloatTensor", not "torch.cuda.*"
_UNSUPPORTED = re.compile(r"does not support|no support|not supported|not implemented", re.I)

_installed = False
_originals: dict[str, Any] = {}  # "torch.cuda.synchronize" -> the function it replaced


def is_installed() -> bool:
    return _installed


# ---------------------------------------------------------------------------------------------
# helpers


def _replace(owner: Any, attr: str, new: Any, label: str) -> None:
    """Swap owner.attr for new, remembering the original; the target must exist."""
    if not hasattr(owner, attr):
        raise AttributeError(f"cpu_shim: patch target {label} does not exist in this torch/megatron")
    old = getattr(owner, attr)
    if getattr(old, "_mindspeed_rl_shim", False):
        return
    setattr(new, "_mindspeed_rl_shim", True)
    _originals[label] = old
    setattr(owner, attr, new)


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


def megatron_version() -> str:
    return importlib.metadata.version("megatron-core")


def check_megatron_version(version: str) -> bool:
    """True when `version` is in SUPPORTED_MEGATRON; otherwise warn loudly (and return False)."""
    try:
        major_minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        major_minor = (-1, -1)
    lo, hi = SUPPORTED_MEGATRON
    if lo <= major_minor <= hi:
        return True
    msg = (f"mindspeed_rl cpu_shim was written for megatron-core {lo[0]}.{lo[1]}.x-{hi[0]}.{hi[1]}.x "
           f"but megatron-core {version} is installed; CPU runs may fail. Install megatron-core==0.12.1.")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    logging.getLogger("mindspeed_rl.platform").warning(msg)
    return False


# ---------------------------------------------------------------------------------------------
# torch.cuda -> CPU


def _current_device() -> torch.device:
    return _CPU


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.set_rng_state(new_state)


def _manual_seed(seed: int) -> None:
    # not torch.manual_seed: that calls torch.cuda.manual_seed_all (left alone: a lazy no-op here)
    torch.default_generator.manual_seed(int(seed))


def _called_from_megatron(depth: int = 2) -> bool:
    """True when the frame `depth` levels up (the caller of the patched method) is megatron's."""
    return sys._getframe(depth).f_globals.get("__name__", "").startswith("megatron")


def _tensor_cuda(original: Callable) -> Callable:
    @functools.wraps(original)
    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _called_from_megatron():
            return self  # already on the (only) device
        return original(self, *args, **kwargs)

    return cuda


def _tensor_type(original: Callable) -> Callable:
    @functools.wraps(original)
    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any):
        if dtype is not None:
            return original(self, dtype, non_blocking, **kwargs)
        name = original(self)
        if _called_from_megatron() and _CPU_TYPE_NAME.match(name):
            return "torch.cuda." + name[len("torch."):]
        return name

    return type_


def _cpu_factory(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def factory(*args: Any, **kwargs: Any) -> torch.Tensor:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = _CPU
        return fn(*args, **kwargs)

    return factory


# ---------------------------------------------------------------------------------------------
# gloo collectives megatron needs; fallbacks used only when the native gloo op is missing


class _DoneWork:
    """Stand-in for the Work handle of an async collective that already completed."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def all_gather_into_tensor_fallback(output: torch.Tensor, input: torch.Tensor, group=None,
                                    async_op: bool = False):
    """output (world*n, ...) = concat over ranks of input (n, ...), via list all_gather."""
    world = dist.get_world_size(group)
    chunks = list(output.chunk(world, dim=0))
    gathered = [torch.empty_like(input) for _ in range(world)]
    dist.all_gather(gathered, input.contiguous(), group=group)
    for dst, src in zip(chunks, gathered):
        dst.copy_(src)
    return _DoneWork() if async_op else None


def reduce_scatter_tensor_fallback(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM,
                                   group=None, async_op: bool = False):
    """output (n, ...) = this rank's chunk of the elementwise reduction of input (world*n, ...)."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    reduced = input.detach().clone()
    dist.all_reduce(reduced, op=op, group=group)
    output.copy_(reduced.chunk(world, dim=0)[rank])
    return _DoneWork() if async_op else None


def _with_fallback(native: Callable, fallback: Callable) -> Callable:
    @functools.wraps(native)
    def collective(*args: Any, **kwargs: Any):
        try:
            return native(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as err:
            # gloo rejects the op before communicating, on every rank alike: safe to redo it
            if not _UNSUPPORTED.search(str(err)):
                raise
            return fallback(*args, **kwargs)

    return collective


# ---------------------------------------------------------------------------------------------
# megatron-core


def _megatron_get_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False):
    return torch.get_rng_state()


def _megatron_set_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False):
    torch.set_rng_state(new_state)


class _ExpectedRngWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


class _View(types.ModuleType):
    """A module as megatron sees it: `overrides` first, everything else from the real module."""

    def __init__(self, real: types.ModuleType, overrides: dict[str, Any]):
        super().__init__(real.__name__, getattr(real, "__doc__", None))
        self.__dict__.update(overrides)
        self._mindspeed_rl_real = real

    def __getattr__(self, name: str) -> Any:  # only for names not overridden
        value = getattr(self._mindspeed_rl_real, name)
        setattr(self, name, value)  # cache: later lookups are plain attribute reads
        return value


_views: dict[int, _View] = {}        # id(real module) -> its megatron view
_by_original: dict[int, Any] = {}    # id(replaced function) -> replacement


def _scoped(owner: Any, attr: str, new: Any, label: str, overrides: dict[str, Any]) -> None:
    """Record `new` as megatron's owner.attr (the target must exist); owner itself is untouched."""
    if not hasattr(owner, attr):
        raise AttributeError(f"cpu_shim: patch target {label} does not exist in this torch/megatron")
    old = getattr(owner, attr)
    setattr(new, "_mindspeed_rl_shim", True)
    _originals[label] = old
    _by_original[id(old)] = new
    overrides[attr] = new


def _rebind(module: types.ModuleType) -> None:
    """Point a megatron module's names at the views / replacements (see the module docstring)."""
    namespace = vars(module)
    for name, value in list(namespace.items()):
        if isinstance(value, types.ModuleType) and id(value) in _views:
            namespace[name] = _views[id(value)]
        elif callable(value) and id(value) in _by_original:
            namespace[name] = _by_original[id(value)]


class _MegatronLoader(importlib.abc.Loader):
    """Wraps the real loader of a megatron module: exec, then _rebind."""

    def __init__(self, inner: Any):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        _rebind(module)
        fix = _MODULE_FIXES.get(module.__name__)
        if fix is not None:
            fix(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_source, ...
        return getattr(self._inner, name)


class _MegatronFinder(importlib.abc.MetaPathFinder):
    """Finds megatron.* modules with the next finders, and hands them the wrapping loader."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != "megatron" and not fullname.startswith("megatron."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _MegatronLoader(spec.loader)
                return spec
        return None


_finder = _MegatronFinder()


def _fix_moe_utils(module: types.ModuleType) -> None:
    """megatron-core 0.16 moe_utils: RouterGatingLinearFunction tests `te_general_gemm is not None`,
    but the name is only bound when Transformer Engine imports, so every MoE router forward raises
    NameError without TE. Bind it to None (the fallback path it was written for); only when the
    module left it unbound, so a version that fixes this is untouched."""
    if not getattr(module, "HAVE_TE", True) and "te_general_gemm" not in vars(module):
        module.te_general_gemm = None


# megatron module -> a fix applied right after it executes (each checks its own precondition)
_MODULE_FIXES: dict[str, Callable[[types.ModuleType], None]] = {
    "megatron.core.transformer.moe.moe_utils": _fix_moe_utils,
}


def _check_no_stale_bindings() -> None:
    """Raise if a loaded megatron module still holds stock torch or an original we replaced (it was
    imported before install(), so the redirects cannot reach it)."""
    originals = {id(v): k for k, v in _originals.items()}
    stale = []
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("megatron") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if id(value) in originals:
                stale.append(f"{mod_name}.{attr} (= {originals[id(value)]})")
    if stale:
        raise RuntimeError(
            "megatron was imported before the CPU shim, and these references escaped it: "
            + ", ".join(stale) + ". Call mindspeed_rl.platform.get_platform().patch() before "
            "importing megatron (or mindspeed_rl.models)."
        )


# ---------------------------------------------------------------------------------------------


def install() -> None:
    """Apply every patch once (idempotent). Call before importing megatron."""
    global _installed
    if _installed:
        return
    if torch.cuda.is_available():
        raise RuntimeError("cpu_shim must not be installed when CUDA is available; use the cuda platform.")
    check_megatron_version(megatron_version())

    if any(m == "megatron" or m.startswith("megatron.") for m in sys.modules):
        # their `torch` is stock torch: name what escaped (the megatron binding of a collective)
        for name in ("all_gather_into_tensor", "_all_gather_base", "reduce_scatter_tensor", "_reduce_scatter_base"):
            if hasattr(dist, name):
                _originals[f"torch.distributed.{name}"] = getattr(dist, name)
        _check_no_stale_bindings()
        raise RuntimeError("megatron was imported before the CPU shim; call "
                           "mindspeed_rl.platform.get_platform().patch() before importing megatron.")

    cuda_over: dict[str, Any] = {}
    for attr, new in (("current_device", _current_device), ("synchronize", _noop),
                      ("get_rng_state", _get_rng_state), ("set_rng_state", _set_rng_state),
                      ("manual_seed", _manual_seed)):
        _scoped(torch.cuda, attr, new, f"torch.cuda.{attr}", cuda_over)
    dist_over: dict[str, Any] = {}
    for name, fallback in (("all_gather_into_tensor", all_gather_into_tensor_fallback),
                           ("_all_gather_base", all_gather_into_tensor_fallback),
                           ("reduce_scatter_tensor", reduce_scatter_tensor_fallback),
                           ("_reduce_scatter_base", reduce_scatter_tensor_fallback)):
        if name.startswith("_") and not hasattr(dist, name):
            continue  # private alias removed in newer torch; megatron then uses the public name
        _scoped(dist, name, _with_fallback(getattr(dist, name), fallback), f"torch.distributed.{name}", dist_over)
    torch_over: dict[str, Any] = {}
    for name in _FACTORIES:
        _scoped(torch, name, _cpu_factory(getattr(torch, name)), f"torch.{name}", torch_over)
    cuda_view, dist_view = _View(torch.cuda, cuda_over), _View(dist, dist_over)
    torch_over.update(cuda=cuda_view, distributed=dist_view)
    _views.update({id(torch): _View(torch, torch_over), id(torch.cuda): cuda_view, id(dist): dist_view})
    _replace(torch.Tensor, "cuda", _tensor_cuda(torch.Tensor.cuda), "torch.Tensor.cuda")
    _replace(torch.Tensor, "type", _tensor_type(torch.Tensor.type), "torch.Tensor.type")
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)

    import megatron.core.tensor_parallel.random as mrandom  # first megatron import of the process

    _replace(mrandom, "_get_cuda_rng_state", _megatron_get_rng_state,
             "megatron.core.tensor_parallel.random._get_cuda_rng_state")
    _replace(mrandom, "_set_cuda_rng_state", _megatron_set_rng_state,
             "megatron.core.tensor_parallel.random._set_cuda_rng_state")
    logging.getLogger(mrandom.__name__).addFilter(_ExpectedRngWarning())

    _check_no_stale_bindings()
    _installed = True
