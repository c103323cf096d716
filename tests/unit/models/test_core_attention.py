"""The fused core attention (models/core_attention.py) computes what megatron's local
DotProductAttention computes: forward and gradients to 1e-5 in fp32, with GQA, padding masks
(left padding, short rows), no mask (causal), a query block against a longer key range, and
query-key layer scaling; megatron's own forward where SDPA does not apply (dropout while training)."""
import pytest
import torch

from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, transformer_config
from mindspeed_rl.models.core_attention import SDPACoreAttention, with_sdpa_attention
from mindspeed_rl.models.forward import attention_mask_4d

from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

ARGS = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=16, padded_vocab_size=40, max_position_embeddings=64,
            normalization="RMSNorm", swiglu=True, disable_bias_linear=True)


def _pair(overrides=None, layer_number=2, **args):
    config = transformer_config(dict(ARGS, **args), overrides=overrides)
    make = lambda cls: cls(config, layer_number, AttnMaskType.causal, "self")  # noqa: E731
    return make(DotProductAttention), make(SDPACoreAttention)


def _qkv(sq, sk, b=3, heads=4, groups=2, hn=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sq, b, heads, hn, generator=g, requires_grad=True)
    k = torch.randn(sk, b, groups, hn, generator=g, requires_grad=True)
    v = torch.randn(sk, b, groups, hn, generator=g, requires_grad=True)
    return q, k, v


def _mask():
    m = torch.ones(3, 9, dtype=torch.long)
    m[0, :3] = 0  # left padding: its first 3 queries see no key at all (padding rows)
    m[1, 6:] = 0  # a short row
    return m


@pytest.mark.parametrize("case", ["padding", "causal_no_mask", "cached_keys", "layer_scaling"])
def test_sdpa_equals_megatron_local_attention(gloo_world1, case):
    init_parallel_state(1, 1, seed=1)
    overrides = {"apply_query_key_layer_scaling": True} if case == "layer_scaling" else None
    local, fused = _pair(overrides)
    sq, sk = (4, 9) if case == "cached_keys" else (9, 9)
    mask = attention_mask_4d(_mask())
    if case == "cached_keys":  # the last 4 queries against all 9 keys (a prefill continuing a cache)
        mask = mask[:, :, -sq:]
    if case == "causal_no_mask":
        mask = None
    q, k, v = _qkv(sq, sk)
    # rows that may attend to some key; the others are padding (module docstring)
    rows = torch.ones(3, sq, dtype=torch.bool) if mask is None else ~mask[:, 0].all(-1)  # (b, sq)
    rows = rows.t()[:, :, None]  # (sq, b, 1)
    out = {}
    for name, module in (("local", local), ("fused", fused)):
        ctx = module(q, k, v, mask)  # (sq, b, np * hn)
        assert ctx.shape == (sq, 3, 64)
        grads = torch.autograd.grad((ctx * rows).square().sum(), (q, k, v))
        out[name] = (ctx, grads)
    assert (out["fused"][0] - out["local"][0]).masked_fill(~rows, 0).abs().max() <= 1e-5
    for g_fused, g_local in zip(out["fused"][1], out["local"][1]):
        assert (g_fused - g_local).abs().max() <= 1e-5


def test_dropout_while_training_takes_megatron_path(gloo_world1):
    init_parallel_state(1, 1, seed=1)
    local, fused = _pair(attention_dropout=0.5)
    q, k, v = _qkv(9, 9)
    mask = attention_mask_4d(torch.ones(3, 9, dtype=torch.long))
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention
    try:
        torch.nn.functional.scaled_dot_product_attention = lambda *a, **kw: calls.append(1) or original(*a, **kw)
        fused.train()
        fused(q, k, v, mask)
        assert not calls  # dropout drawn by megatron's RNG tracker, in its own forward
        fused.eval()
        local.eval()
        assert (fused(q, k, v, mask) - local(q, k, v, mask)).abs().max() <= 1e-5
        assert calls
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


def test_builder_uses_sdpa_on_cpu(gloo_world1):
    init_parallel_state(1, 1, seed=1)
    model = build_gpt_model(ARGS)
    assert all(type(layer.self_attention.core_attention) is SDPACoreAttention for layer in model.decoder.layers)
    assert with_sdpa_attention([DotProductAttention, int]) == [SDPACoreAttention, int]


@pytest.mark.parametrize("in_fp32", [True, False])
def test_bf16_attends_in_fp32_on_cpu(gloo_world1, monkeypatch, in_fp32):
    """On CPU, bf16 query/key/value are computed in fp32 (platform.base.sdpa_in_fp32_for_bf16) and the
    context rounded to bf16 once: bit for bit the fp32 module's result rounded, gradients in bf16. Where
    the platform says no, the kernel runs in bf16 (another rounding)."""
    from mindspeed_rl.models import core_attention

    monkeypatch.setattr(core_attention, "sdpa_in_fp32_for_bf16", lambda name: in_fp32)
    init_parallel_state(1, 1, seed=1)
    _, fused = _pair()
    mask = attention_mask_4d(_mask())
    q, k, v = (t.detach().bfloat16().requires_grad_() for t in _qkv(9, 9))
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(core_attention.F, "scaled_dot_product_attention",
                        lambda *a, **kw: seen.append(a[0].dtype) or original(*a, **kw))
    ctx = fused(q, k, v, mask)
    assert ctx.dtype == torch.bfloat16 and seen == [torch.float32 if in_fp32 else torch.bfloat16]
    reference = fused(*(t.detach().float() for t in (q, k, v)), mask).bfloat16()
    if in_fp32:
        assert torch.equal(ctx, reference)
    else:
        assert (ctx.float() - reference.float()).abs().max() <= 0.05
    grads = torch.autograd.grad(ctx.float().square().sum(), (q, k, v))
    assert all(g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("native", [True, False])
def test_gqa_reaches_sdpa_as_groups_on_cpu(gloo_world1, monkeypatch, native):
    """GQA's K/V go to SDPA as their groups with enable_gqa where the platform says so (CPU), else
    repeated for their heads: the same context bit for bit, gradients within 1e-6 (the K/V gradients
    are summed over their heads in another order), equal to megatron's local attention as above."""
    from mindspeed_rl.models import core_attention

    monkeypatch.setattr(core_attention, "sdpa_native_gqa", lambda name: native)
    init_parallel_state(1, 1, seed=1)
    _, fused = _pair()
    mask = attention_mask_4d(_mask())
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(core_attention.F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append((k.shape[1], kw.get("enable_gqa", False))) or
                        original(q, k, v, **kw))
    q, k, v = _qkv(9, 9)
    ctx = fused(q, k, v, mask)
    assert seen == [(2, True)] if native else seen == [(4, False)]
    grads = torch.autograd.grad(ctx.square().sum(), (q, k, v))
    monkeypatch.setattr(core_attention, "sdpa_native_gqa", lambda name: not native)
    ctx2 = fused(q, k, v, mask)
    assert torch.equal(ctx, ctx2)
    for a, b in zip(grads, torch.autograd.grad(ctx2.square().sum(), (q, k, v))):
        assert (a - b).abs().max() <= 1e-6


def test_only_cpu_attends_bf16_in_fp32():
    from mindspeed_rl.platform.base import sdpa_in_fp32_for_bf16

    assert sdpa_in_fp32_for_bf16("cpu") and not sdpa_in_fp32_for_bf16("cuda") and not sdpa_in_fp32_for_bf16("npu")


def test_only_cpu_hands_gqa_groups_to_sdpa():
    from mindspeed_rl.platform.base import sdpa_native_gqa

    assert sdpa_native_gqa("cpu") and not sdpa_native_gqa("cuda") and not sdpa_native_gqa("npu")
