"""The megatron-core CPU shim: each redirect, the RNG tracker, version/ordering checks, and a tiny
GPTModel forward+backward (+ DDP and the fp32 optimizer) in one process over gloo."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

from mindspeed_rl.platform import cpu_shim, get_platform

pytestmark = pytest.mark.skipif(get_platform().name != "cpu", reason="CPU shim tests")


def test_installed_and_idempotent():
    assert cpu_shim.is_installed()
    before = (torch.cuda.current_device, torch.zeros, torch.Tensor.cuda)
    cpu_shim.install()
    get_platform().patch()
    assert (torch.cuda.current_device, torch.zeros, torch.Tensor.cuda) == before


PROBE = """
import torch
import torch.distributed as dist
from torch.cuda import current_device


def run(fn):
    return fn(torch, current_device, dist)
"""


def _megatron_probe():
    """A module named like megatron's, made the way the import hook makes them (exec, _rebind)."""
    import types

    mod = types.ModuleType("megatron.shim_probe")
    exec(compile(PROBE, "<megatron.shim_probe>", "exec"), mod.__dict__)
    cpu_shim._rebind(mod)
    return mod


def test_cuda_calls_land_on_cpu_in_megatron():
    probe = _megatron_probe()

    def calls(torch_, current_device, dist_):
        assert current_device() == torch.device("cpu") == torch_.cuda.current_device()
        torch_.cuda.synchronize()
        for dev in ("cuda", "cuda:1", torch.device("cuda", 0), torch_.cuda.current_device()):
            assert torch_.zeros(2, device=dev).device.type == "cpu"
        assert torch_.tensor([1.0], device="cuda").device.type == "cpu"
        assert torch_.ones(2, 2, device="cuda").sum() == 4
        assert torch_.full((2,), 3.0, device="cuda").device.type == "cpu"
        assert torch_.zeros(2, device="meta").device.type == "meta"  # other devices untouched
        assert getattr(dist_.all_gather_into_tensor, "_mindspeed_rl_shim", False)
        assert torch_.nn is torch.nn and torch_.Tensor is torch.Tensor  # the rest is stock torch
        return True

    assert probe.run(calls)
    t = torch.arange(3)
    exec("assert t.cuda() is t and t.cuda(0, non_blocking=True) is t\n"
         "assert t.float().type() == 'torch.cuda.FloatTensor'", {"__name__": "megatron.shim_probe", "t": t})


def test_nothing_changes_outside_megatron():
    """Stock torch for everyone else: same objects, stock errors, stock type names."""
    assert not getattr(torch.tensor, "_mindspeed_rl_shim", False)
    assert not getattr(torch.cuda.current_device, "_mindspeed_rl_shim", False)
    assert not getattr(torch.distributed.all_gather_into_tensor, "_mindspeed_rl_shim", False)
    assert torch.tensor in torch.utils._device._device_constructors()
    for call in (lambda: torch.zeros(2, device="cuda"), lambda: torch.arange(3).cuda(),
                 lambda: torch.cuda.current_device()):
        with pytest.raises((RuntimeError, AssertionError)):
            call()
    assert torch.zeros(1).type() == "torch.FloatTensor"


def test_megatron_modules_see_the_redirects():
    from megatron.core.tensor_parallel import layers, mappings

    assert getattr(mappings.dist_all_gather_func, "_mindspeed_rl_shim", False)
    assert layers.torch is not torch and layers.torch.cuda.current_device() == torch.device("cpu")


def test_hf_model_in_a_shim_process_matches_a_clean_process(tmp_path):
    """transformers' from_pretrained (rotary inv_freq included) with the shim installed and
    megatron imported gives the same logits, bit for bit, as in a process without either."""
    from testing_utils import make_tiny_hf

    make_tiny_hf("llama", str(tmp_path / "hf"))
    code = ("import sys, torch\n"
            "if sys.argv[1] == '1':\n"
            "    from mindspeed_rl.platform import get_platform\n"
            "    get_platform().patch()\n"
            "    import mindspeed_rl.models.builder\n"
            "    assert 'megatron.core.models.gpt.gpt_model' in sys.modules\n"
            "import transformers\n"
            "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32).eval()\n"
            "ids = (torch.arange(1, 33).reshape(2, 16) * 7) % 120\n"
            "with torch.no_grad():\n"
            "    torch.save(m(ids).logits, sys.argv[3])\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    for shim in ("0", "1"):
        proc = subprocess.run([sys.executable, "-c", code, shim, str(tmp_path / "hf"), str(tmp_path / f"{shim}.pt")],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    clean, shimmed = torch.load(tmp_path / "0.pt"), torch.load(tmp_path / "1.pt")
    assert torch.isfinite(clean).all() and torch.equal(clean, shimmed)


def test_rng_tracker_really_switches_state(gloo_world1):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(7)
    # the model-parallel stream is seeded with seed + 2718 + tp_rank (megatron's rule)
    expected = torch.rand(4, generator=torch.Generator().manual_seed(7 + 2718))
    outside_before = torch.get_rng_state()
    with get_cuda_rng_tracker().fork():
        inside = torch.rand(4)
    assert torch.equal(inside, expected)
    assert torch.equal(torch.get_rng_state(), outside_before)  # default stream restored
    with get_cuda_rng_tracker().fork():
        again = torch.rand(4)  # continues the tracked stream instead of restarting it
    g = torch.Generator().manual_seed(7 + 2718)
    torch.rand(4, generator=g)
    assert torch.equal(again, torch.rand(4, generator=g))
    ps.destroy_model_parallel()


def test_version_check_warns_outside_range():
    assert cpu_shim.check_megatron_version("0.12.1") and cpu_shim.check_megatron_version("0.16.1")
    with pytest.warns(RuntimeWarning, match="megatron-core 0.17.0 is installed"):
        assert not cpu_shim.check_megatron_version("0.17.0")
    with pytest.warns(RuntimeWarning, match="megatron-core 0.11.0"):
        cpu_shim.check_megatron_version("0.11.0")


def test_missing_patch_target_fails_loudly():
    with pytest.raises(AttributeError, match="patch target torch.cuda.no_such_fn does not exist"):
        cpu_shim._replace(torch.cuda, "no_such_fn", lambda: None, "torch.cuda.no_such_fn")


def test_gloo_fallbacks_used_only_for_unsupported_errors():
    calls = []

    def native(*a, **k):
        raise RuntimeError(calls.pop(0))

    def fallback(*a, **k):
        return "fallback"

    wrapped = cpu_shim._with_fallback(native, fallback)
    calls.append("Backend gloo does not support reduce_scatter_tensor")
    assert wrapped() == "fallback"
    calls.append("connection reset by peer")
    with pytest.raises(RuntimeError, match="connection reset"):
        wrapped()


def test_megatron_imported_first_is_detected():
    code = ("import megatron.core\n"
            "from mindspeed_rl.platform import cpu_shim\n"
            "cpu_shim.install()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert "megatron was imported before the CPU shim" in proc.stderr
    assert "megatron.core.tensor_parallel.mappings.dist_all_gather_func" in proc.stderr


# ---- megatron-core GPTModel on CPU


def _tiny_gpt(**overrides):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = dict(num_layers=2, hidden_size=64, num_attention_heads=4, hidden_dropout=0.0,
               attention_dropout=0.0, pipeline_dtype=torch.float32)
    cfg.update(overrides)
    return GPTModel(TransformerConfig(**cfg), get_gpt_layer_local_spec(), vocab_size=128,
                    max_sequence_length=64, position_embedding_type="rope")


@pytest.fixture
def mp_world1(gloo_world1):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    yield
    ps.destroy_model_parallel()


def test_gpt_forward_backward_on_cpu(mp_world1):
    torch.manual_seed(0)
    model = _tiny_gpt()
    ids = torch.randint(0, 128, (2, 16))  # (B, S)
    pos = torch.arange(16).expand(2, 16)
    causal = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)[None, None]  # True = masked
    loss_explicit = model(ids, pos, attention_mask=causal, labels=ids)  # (B, S) per-token loss
    loss_default = model(ids, pos, attention_mask=None, labels=ids)  # default mask built on "cuda"
    assert loss_explicit.shape == (2, 16)
    torch.testing.assert_close(loss_explicit, loss_default)
    logits = model(ids, pos, attention_mask=causal)
    assert logits.shape == (2, 16, 128) and torch.isfinite(logits).all()
    loss_explicit.mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["decoder.layers.0.self_attention.linear_qkv.weight"].abs().sum() > 0


def test_gpt_ddp_and_fp32_optimizer_on_cpu(mp_world1):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    torch.manual_seed(0)
    model = _tiny_gpt()
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "falling back to torch optimizers" (no apex / TE on CPU)
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1.0), [ddp])
    ids = torch.randint(0, 128, (2, 16))
    pos = torch.arange(16).expand(2, 16)
    losses = []
    for _ in range(4):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        loss = ddp(ids, pos, attention_mask=None, labels=ids).mean()
        loss.backward()
        ddp.finish_grad_sync()
        ok, grad_norm, _ = opt.step()
        assert ok and grad_norm > 0
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_tensor_type_names_cpu_tensors_as_device_tensors_for_megatron():
    g = {"__name__": "megatron.core.optimizer.probe", "torch": torch}
    exec("a = torch.zeros(1).type(); b = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16)).type()\n"
         "c = torch.zeros(1).type(torch.float64).dtype; d = torch.zeros(1, device='meta').type()", g)
    assert (g["a"], g["b"]) == ("torch.cuda.FloatTensor", "torch.cuda.BFloat16Tensor")
    assert g["c"] == torch.float64 and g["d"] == "torch.meta.FloatTensor"  # conversion form, meta untouched


def test_configure_host_threads_undoes_rays_defaults():
    """A process started as Ray starts a worker (OMP_NUM_THREADS=1, nice 15) gets 2 threads, nice 0."""
    code = ("import os, torch\n"
            "from mindspeed_rl.platform import cpu\n"
            "before = (torch.get_num_threads(), os.getpriority(os.PRIO_PROCESS, 0))\n"
            "print(before, cpu.configure_host_threads(2.0), os.environ['OMP_NUM_THREADS'])\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    ray_nice = max(15, os.getpriority(os.PRIO_PROCESS, 0))  # 15, or more when pytest itself runs niced
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, ray_nice))
    assert proc.returncode == 0, proc.stderr
    before, omp = proc.stdout.strip().rsplit(" ", 1)
    assert before.startswith(f"(1, {ray_nice})") and omp == "2", proc.stdout
    if os.geteuid() == 0:
        assert "{'threads': 2, 'nice': 0}" in proc.stdout, proc.stdout
    else:  # no CAP_SYS_NICE: it says so and keeps going
        assert f"{{'threads': 2, 'nice': {ray_nice}}}" in proc.stdout and f"keeps niceness {ray_nice}" in proc.stderr
