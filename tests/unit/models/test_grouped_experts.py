"""moe_grouped_gemm (models/grouped_experts.py): the experts as two grouped GEMMs over the
SequentialMLP's own parameters give SequentialMLP's outputs, gradients and update, also with experts
that get no token; unaligned widths and a failing kernel run the experts one by one."""
import logging

import pytest
import torch

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, padded_vocab_size=40,
            max_position_embeddings=32, normalization="RMSNorm", swiglu=True, disable_bias_linear=True,
            num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=16)


@pytest.fixture(autouse=True)
def _fresh_state():
    from mindspeed_rl.models import grouped_experts

    grouped_experts._STATE["failed"] = None
    yield
    grouped_experts._STATE["failed"] = None


def _model(dtype=torch.float32, **extra):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state

    init_parallel_state(1, 1, seed=5)
    torch.manual_seed(0)
    return build_gpt_model(dict(ARGS, **extra), params_dtype=dtype)


def _inputs(b, s):
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask

    g = torch.Generator().manual_seed(3)
    ids, mask = torch.randint(0, 40, (b, s), generator=g), torch.ones(b, s, dtype=torch.long)
    return ids, position_ids_from_mask(mask), attention_mask_4d(mask)


def _experts(model):
    return [m for n, m in model.named_modules() if n.endswith("mlp.experts")]


def _forward_backward(model, b, s):
    """Logits and every parameter's gradient of a fixed random projection of them; the tokens each
    layer's experts received."""
    counts = []
    hooks = [e.register_forward_pre_hook(lambda m, a: counts.append(torch.as_tensor(a[1]).tolist()))
             for e in _experts(model)]
    logits = model(*_inputs(b, s))
    for h in hooks:
        h.remove()
    weight = torch.randn(logits.shape, generator=torch.Generator().manual_seed(4)).to(logits.dtype)
    (logits.float() * weight.float()).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, counts


@pytest.mark.parametrize("b,s", [(2, 6), (1, 3)])  # (1, 3): 6 routed slots over 8 experts, some get none
def test_grouped_experts_equal_sequential_forward_and_backward_fp32(gloo_world1, b, s):
    from mindspeed_rl.models.grouped_experts import GroupedExperts

    plain, grouped = _model(), _model(moe_grouped_gemm=True)
    assert all(type(e) is GroupedExperts for e in _experts(grouped)) and len(_experts(grouped)) == 2
    assert not any(type(e) is GroupedExperts for e in _experts(plain))
    ref_logits, ref_grads, ref_counts = _forward_backward(plain, b, s)
    logits, grads, counts = _forward_backward(grouped, b, s)
    assert counts == ref_counts and sum(ref_counts[0]) == b * s * 2
    if (b, s) == (1, 3):
        assert all(0 in c for c in counts)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)


def test_experts_without_a_gate_run_grouped_and_equal_sequential(gloo_world1, monkeypatch):
    """Nemotron-H's experts (relu(x)^2 without a gate: squared_relu) run as the two grouped GEMMs too, one pair per
    MoE layer, with SequentialMLP's logits and gradients."""
    from mindspeed_rl.platform import get_platform

    extra = dict(swiglu=False, squared_relu=True)
    plain, grouped = _model(**extra), _model(moe_grouped_gemm=True, **extra)
    platform, calls = get_platform(), []
    original = platform.grouped_mm
    monkeypatch.setattr(type(platform), "grouped_mm", lambda self, *a: calls.append(1) or original(*a))
    ref_logits, ref_grads, _ = _forward_backward(plain, 2, 6)
    assert not calls
    logits, grads, _ = _forward_backward(grouped, 2, 6)
    assert len(calls) == 2 * len(_experts(grouped)) == 4  # fc1 and fc2 of both MoE layers
    assert grouped.decoder.layers[0].mlp.experts.local_experts[0].linear_fc1.weight.shape[0] == ARGS["moe_ffn_hidden_size"]
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-6)
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)


def test_grouped_experts_bf16_match_sequential(gloo_world1):
    plain, grouped = _model(torch.bfloat16), _model(torch.bfloat16, moe_grouped_gemm=True)
    ref_logits, ref_grads, _ = _forward_backward(plain, 2, 6)
    logits, grads, _ = _forward_backward(grouped, 2, 6)
    # bf16 rounding of the same products, grouped in one kernel call instead of one per expert
    torch.testing.assert_close(logits.float(), ref_logits.float(), rtol=0, atol=2e-2)
    for n in grads:
        if ".experts." in n:
            torch.testing.assert_close(grads[n].float(), ref_grads[n].float(), rtol=2e-2, atol=2e-2, msg=n)


def test_an_update_with_grouped_experts_equals_sequential(gloo_world1):
    """Through megatron's DDP and optimizer: the grouped experts' gradients reach main_grad as the
    sequential ones do, so one policy update gives the same weights."""
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 40, (4, 12), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": torch.ones(4, 6),
             "advantages": torch.randn(4, 6, generator=g), "old_log_probs": torch.full((4, 6), -3.7),
             "ref_log_probs": torch.full((4, 6), -3.7)}
    weights = []
    for grouped in (False, True):
        model = _model(moe_grouped_gemm=grouped)
        ddp = wrap_ddp(model, use_distributed_optimizer=False)
        optimizer, scheduler = build_optimizer([ddp], lr=1e-3, train_iters=4, use_distributed_optimizer=False)
        model.train()
        stats = policy_update_step(ddp, optimizer, scheduler, batch, 6, 2,
                                   PolicyLossSettings(use_kl_loss=True, kl_loss_coef=0.01, vocab_size=40))
        assert stats["actor/update_skipped"] == 0
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for n in weights[0]:
        torch.testing.assert_close(weights[1][n], weights[0][n], rtol=0, atol=1e-6, msg=n)


def test_unaligned_widths_run_the_experts_one_by_one(gloo_world1, monkeypatch):
    """fc2's input rows of 10 fp32 values (40 bytes) are not 16-byte strides: no grouped GEMM is tried."""
    calls = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain, grouped = _model(moe_ffn_hidden_size=10), _model(moe_ffn_hidden_size=10, moe_grouped_gemm=True)
    torch.testing.assert_close(_forward_backward(grouped, 2, 6)[0], _forward_backward(plain, 2, 6)[0], rtol=0, atol=0)
    assert calls == []


def test_a_failing_grouped_gemm_falls_back_with_one_warning(gloo_world1, monkeypatch, caplog):
    from mindspeed_rl.models import grouped_experts

    def no_kernel(*args, **kwargs):
        raise NotImplementedError("no _grouped_mm kernel for this device")

    monkeypatch.setattr(torch, "_grouped_mm", no_kernel)
    plain, grouped = _model(), _model(moe_grouped_gemm=True)
    with caplog.at_level(logging.WARNING, logger="mindspeed_rl.models.grouped_experts"):
        logits = _forward_backward(grouped, 2, 6)[0]
    said = [r.getMessage() for r in caplog.records if "moe_grouped_gemm" in r.getMessage()]
    assert len(said) == 1 and "no _grouped_mm kernel" in said[0] and "moe_grouped_gemm: false" in said[0]
    assert isinstance(grouped_experts.failed(), NotImplementedError)
    torch.testing.assert_close(logits, _forward_backward(plain, 2, 6)[0], rtol=0, atol=0)


def test_a_rank_with_no_routed_tokens_runs_and_back_propagates(gloo_world1):
    """At EP > 1 a rank's experts can receive no token at all: the forward returns no rows and the
    backward gives the experts zero gradients, as SequentialMLP does."""
    from mindspeed_rl.models.grouped_experts import GroupedExperts

    experts = _experts(_model(moe_grouped_gemm=True))[0]
    assert type(experts) is GroupedExperts
    hidden = torch.zeros(0, 32, requires_grad=True)
    out, bias = experts(hidden, torch.zeros(8, dtype=torch.long), torch.zeros(0))
    assert out.shape == (0, 32) and bias is None
    out.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in experts.parameters())


def test_on_ascend_the_experts_call_mindspeeds_grouped_matmul_with_counts(monkeypatch):
    """platform/npu.py's grouped_mm hands MindSpeed's npu_gmm_v2 what its API takes: x (M, in), the
    weights as one contiguous (E, in, out) tensor, the rows per group as int64 (not their cumsum),
    group_type 0. A stand-in module records the call (no NPU here) and computes the product."""
    import sys
    import types

    from mindspeed_rl.platform import npu

    calls = []

    def npu_gmm_v2(x, weight, *, bias=None, group_list=None, group_type=0):
        calls.append(dict(weight_contiguous=weight.is_contiguous(), shape=tuple(weight.shape), bias=bias,
                          group_list=group_list.tolist(), dtype=group_list.dtype, group_type=group_type))
        rows = torch.split(x, group_list.tolist())
        return torch.cat([r @ w for r, w in zip(rows, weight)])

    gmm = types.SimpleNamespace(npu_gmm_v2=npu_gmm_v2)
    monkeypatch.setitem(sys.modules, "mindspeed", types.ModuleType("mindspeed"))
    monkeypatch.setitem(sys.modules, "mindspeed.ops", types.SimpleNamespace(gmm=gmm))
    monkeypatch.setitem(sys.modules, "mindspeed.ops.gmm", gmm)
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(7, 8, generator=g), torch.randn(3, 5, 8, generator=g)  # 3 experts' (out, in) weights
    counts = torch.tensor([2, 0, 5], dtype=torch.int32)
    out = npu.grouped_mm(x, w.transpose(1, 2), counts)  # the (E, in, out) view GroupedExperts passes
    assert calls == [dict(weight_contiguous=True, shape=(3, 8, 5), bias=None, group_list=[2, 0, 5],
                          dtype=torch.int64, group_type=0)]
    torch.testing.assert_close(out, torch.cat([x[:2] @ w[0].T, x[2:] @ w[2].T]))


def test_the_cpu_platform_groups_with_torch_offsets():
    from mindspeed_rl.platform import get_platform

    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(6, 8, generator=g), torch.randn(3, 8, 4, generator=g)
    out = get_platform("cpu").grouped_mm(x, w, torch.tensor([1, 3, 2]))
    torch.testing.assert_close(out, torch.cat([x[:1] @ w[0], x[1:4] @ w[1], x[4:] @ w[2]]))
