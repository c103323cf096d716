"""models/swiglu.py computes megatron's gated silu: forward and input gradient equal megatron's chunk
version (odd sizes, 2-D and 3-D, a bias, the token-weighted expert form with the weights' gradient;
bit-identical in bf16); its backward runs no cat; what it does not implement goes to megatron's; the
patch point is checked; a whole GPTModel, dense and MoE, gives the same logits and gradients with
the patch on and off (config.bias_activation_fusion), and the lean rollout decode still runs."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from mindspeed_rl.models import swiglu
from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, transformer_config

from megatron.core.transformer import mlp as megatron_mlp

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=48, num_attention_heads=4, padded_vocab_size=40,
            max_position_embeddings=32, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)
MOE = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=24)


def _megatron_glu(x: torch.Tensor) -> torch.Tensor:
    """megatron's unfused MLP: glu(x) = silu(chunk 0) * chunk 1."""
    x = torch.chunk(x, 2, dim=-1)
    return F.silu(x[0]) * x[1]


class _CountOps(TorchDispatchMode):
    def __init__(self, *ops):
        super().__init__()
        self.ops, self.calls = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket in self.ops
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("shape", [(7, 3, 2 * 13), (5, 2 * 1), (2, 9, 4, 2 * 37)])
@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_equals_megatron_forward_and_backward(shape, bias):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g, requires_grad=True)
    b = torch.randn(shape[-1], generator=g, requires_grad=True) if bias else None
    grad = torch.randn(shape[:-1] + (shape[-1] // 2,), generator=g)
    out = {}
    for name, fn in (("megatron", lambda x, b: _megatron_glu(x if b is None else x + b)),
                     ("ours", swiglu.bias_swiglu_impl)):
        y = fn(x, b)
        out[name] = (y, *torch.autograd.grad(y, [x] + ([b] if bias else []), grad))
    for ours, theirs in zip(out["ours"], out["megatron"]):
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= 1e-6


def test_bf16_is_bit_identical_and_backward_runs_no_cat():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, 2 * 96, generator=g).bfloat16().requires_grad_()
    grad = torch.randn(6, 4, 96, generator=g).bfloat16()
    y_ref = _megatron_glu(x)
    (gx_ref,) = torch.autograd.grad(y_ref, x, grad)
    counter = _CountOps(torch.ops.aten.cat)
    with counter:
        y = swiglu.swiglu(x)
        (gx,) = torch.autograd.grad(y, x, grad)
    assert y.dtype == gx.dtype == torch.bfloat16
    assert torch.equal(y, y_ref) and torch.equal(gx, gx_ref)
    assert counter.calls == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weighted_equals_megatron(dtype):
    """An expert's MLP with the router probabilities (fp32, (tokens, 1)) as megatron's unfused path
    applies them: (glu(x) * w).to(x.dtype); gradients for x and for the probabilities."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(11, 2 * 17, generator=g).to(dtype).requires_grad_()
    w = torch.rand(11, generator=g).requires_grad_()
    grad = torch.randn(11, 17, generator=g).to(dtype)
    out = {}
    for name, fn in (("megatron", lambda x, w: (_megatron_glu(x) * w).to(x.dtype)),
                     ("ours", lambda x, w: swiglu.weighted_bias_swiglu_impl(x, None, w))):
        y = fn(x, w.unsqueeze(-1))
        out[name] = (y, *torch.autograd.grad(y, (x, w), grad))
    for ours, theirs in zip(out["ours"], out["megatron"]):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert (ours.float() - theirs.float()).abs().max() <= (1e-6 if dtype == torch.float32 else 0)


def test_what_it_does_not_implement_goes_to_megatron(monkeypatch):
    calls = []
    monkeypatch.setattr(swiglu, "_MEGATRON", lambda *args: calls.append(args) or "megatron's")
    x = torch.randn(3, 8)
    assert swiglu.bias_swiglu_impl(x, None, True) == "megatron's"  # fp8 input store
    assert swiglu.bias_swiglu_impl(x, None, False, True) == "megatron's"  # 0.16's activation offload
    assert len(calls) == 2 and torch.is_tensor(swiglu.bias_swiglu_impl(x, None, False, False))
    with pytest.raises(ValueError, match="must be even"):
        swiglu.swiglu(torch.randn(3, 7))


def test_install_is_checked(gloo_world1, monkeypatch):
    init_parallel_state(1, 1, seed=1)
    assert transformer_config(ARGS).bias_activation_fusion  # a gated silu on CPU: the builder installs it
    assert not transformer_config(dict(ARGS, swiglu=False)).bias_activation_fusion  # gelu: megatron's unfused
    assert megatron_mlp.bias_swiglu_impl is swiglu.bias_swiglu_impl
    assert megatron_mlp.weighted_bias_swiglu_impl is swiglu.weighted_bias_swiglu_impl
    swiglu.install()  # idempotent
    monkeypatch.setattr(megatron_mlp, "weighted_bias_swiglu_impl", lambda input, weights: input)
    with pytest.raises(RuntimeError, match="models/swiglu.py must learn this version"):
        swiglu.install()


def _set_fusion(model, on: bool) -> None:
    """config.bias_activation_fusion of every module (megatron's SequentialMLP keeps its own copy)."""
    for module in model.modules():
        if getattr(module, "config", None) is not None:
            module.config.bias_activation_fusion = on


@pytest.mark.parametrize("arch", [{}, {"disable_bias_linear": False}, MOE], ids=["dense", "bias", "moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_equals_megatron_glu(gloo_world1, arch, dtype):
    init_parallel_state(1, 1, seed=1)
    torch.manual_seed(0)
    model = build_gpt_model(dict(ARGS, **arch), params_dtype=dtype)
    assert swiglu.runs(model.decoder.layers[0].mlp.config)
    ids = torch.randint(0, 40, (3, 11), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(11).expand(3, 11)
    with torch.no_grad():
        model(ids, pos, None)  # megatron builds (cats) and caches its rotary table on the first call
    out = {}
    for name in ("megatron", "ours"):
        _set_fusion(model, name == "ours")
        model.zero_grad()
        counter = _CountOps(torch.ops.aten.cat)
        with counter:
            logits = model(ids, pos, None)
            logits.float().square().mean().backward()
        out[name] = (logits.detach(), [p.grad.clone() for p in model.parameters()], counter.calls)
    assert torch.equal(out["ours"][0], out["megatron"][0])
    for ours, theirs in zip(out["ours"][1], out["megatron"][1]):
        assert torch.equal(ours, theirs)
    if not arch:  # dense: each layer's chunk backward was a cat, now none is left
        assert out["megatron"][2] - out["ours"][2] == ARGS["num_layers"]


def test_lean_decode_still_runs(gloo_world1):
    """rollout/kv_cache.py's lean decode computes the unfused glu itself: it accepts our fusion only."""
    from mindspeed_rl.rollout import kv_cache

    init_parallel_state(1, 1, seed=1)
    model = build_gpt_model(ARGS)
    assert model.config.bias_activation_fusion and kv_cache.lean_supported(model)
    model.config.activation_func_fp8_input_store = True  # would go to megatron's fused function
    assert not kv_cache.lean_supported(model)
