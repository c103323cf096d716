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


def test_cuda_calls_land_on_cpu():
    assert torch.cuda.current_device() == torch.device("cpu")
    torch.cuda.synchronize()
    for dev in ("cuda", "cuda:1", torch.device("cuda", 0), torch.cuda.current_device()):
        assert torch.zeros(2, device=dev).device.type == "cpu"
    assert torch.tensor([1.0], device="cuda").device.type == "cpu"
    assert torch.ones(2, 2, device="cuda").sum() == 4
    assert torch.full((2,), 3.0, device="cuda").device.type == "cpu"
    t = torch.arange(3)
    assert t.cuda() is t and t.cuda(0, non_blocking=True) is t
    assert torch.zeros(2, device="meta").device.type == "meta"  # other devices untouched


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


def test_tensor_type_names_cpu_tensors_as_device_tensors():
    assert torch.zeros(1).type() == "torch.cuda.FloatTensor"
    assert torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16)).type() == "torch.cuda.BFloat16Tensor"
    assert torch.zeros(1).type(torch.float64).dtype == torch.float64  # conversion form untouched
    assert torch.zeros(1, device="meta").type() == "torch.meta.FloatTensor"
