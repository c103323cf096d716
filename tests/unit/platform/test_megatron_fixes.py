"""platform/megatron_fixes.py: megatron's no-Apex fallbacks for clipping replaced by the same maths,
and ChainedOptimizer's unasked zero count skipped."""
import pytest
import torch

from mindspeed_rl.platform import megatron_fixes


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in [(7, 5), (5,), (1,), (3, 4, 2)]] + [torch.empty(0)]


def test_l2_norm_equals_megatrons_local_fallback():
    from megatron.core.utils import local_multi_tensor_l2_norm

    ts = tensors()
    ours, per = megatron_fixes.l2_norm(2048, None, [ts], False)
    theirs, _ = local_multi_tensor_l2_norm(2048, None, [ts], False)
    assert per is None and ours.shape == (1,)
    torch.testing.assert_close(ours, theirs.to(ours.device), rtol=1e-6, atol=0)
    torch.testing.assert_close(ours[0], torch.cat([t.reshape(-1) for t in ts]).norm(), rtol=1e-6, atol=0)
    nan = tensors()
    nan[2][0] = float("nan")
    assert torch.isnan(megatron_fixes.l2_norm(2048, None, [nan], False)[0]).all()


@pytest.mark.parametrize("factor", [0.25, 1.0])
def test_scale_in_place_and_into_other_tensors(factor):
    src = tensors(1)
    expected = [t * factor for t in src]
    dst = [torch.full_like(t, 7.0) for t in src]
    megatron_fixes.scale(2048, None, [src, dst], factor)
    for d, e in zip(dst, expected):
        torch.testing.assert_close(d, e, rtol=0, atol=0)
    megatron_fixes.scale(2048, None, [src, src], factor)  # clipping scales the gradients in place
    for s, e in zip(src, expected):
        torch.testing.assert_close(s, e, rtol=0, atol=0)


def test_megatron_uses_the_fixes_without_apex_or_te():
    from megatron.core.optimizer import clip_grads, optimizer

    megatron_fixes.apply()
    assert clip_grads.l2_norm_impl is megatron_fixes.l2_norm
    assert clip_grads.multi_tensor_scale_impl is megatron_fixes.scale
    assert optimizer.multi_tensor_scale_impl is megatron_fixes.scale


def test_chained_optimizer_counts_zeros_only_when_asked(gloo_world1, monkeypatch):
    """megatron-core 0.12.1's ChainedOptimizer.step() counted the zeros of every gradient unasked."""
    from megatron.core.optimizer import optimizer as megatron_optimizer

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import ARGS, P, make_batch

    counted = []
    original = megatron_optimizer.count_zeros_fp32
    monkeypatch.setattr(megatron_optimizer, "count_zeros_fp32", lambda *a, **k: counted.append(1) or original(*a, **k))
    init_parallel_state(1, 1, seed=7)
    ddp = wrap_ddp(build_gpt_model(ARGS), use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=1e-2, train_iters=4, clip_grad=1.0, use_distributed_optimizer=False)
    assert isinstance(opt, megatron_optimizer.ChainedOptimizer)
    policy_update_step(ddp, opt, sched, make_batch(0), P, 2, PolicyLossSettings())
    assert counted == []
    for o in opt.chained_optimizers:
        o.config.log_num_zeros_in_grad = True
    policy_update_step(ddp, opt, sched, make_batch(1), P, 2, PolicyLossSettings())
    assert counted  # asked for: counted
