"""models/stochastic_rounding.py: the bf16 copy of the fp32 main params rounds to one of the two
neighbours, up with probability equal to the distance (unbiased), keeps exact values, and draws its
random bits from (seed, step, parameter, position) only, so shards, replicas and resumed runs round
alike; megatron's optimizers use it when asked."""
import pytest
import torch

from mindspeed_rl.models import stochastic_rounding as sr

BF16_ULP_AT_1 = 2.0 ** -7


def neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 values just below and above x in magnitude (truncation, and truncation + 1 ulp)."""
    bits = x.view(torch.int32)
    down = torch.bitwise_and(bits, -65536).view(torch.float32)
    up = torch.bitwise_and(bits + 65536, -65536).view(torch.float32)
    exact = torch.bitwise_and(bits, 0xFFFF) == 0
    return down, torch.where(exact, down, up)


@pytest.fixture(params=["host", "device generator"])
def path(request, monkeypatch):
    """Both noise sources: numpy on the host, and torch's device-generator path (run on CPU here)."""
    if request.param == "device generator":
        monkeypatch.setattr(sr, "noise_on_host", lambda device: False)
    return request.param


def test_rounds_to_a_neighbour_and_keeps_exact_values(path):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(50_000, generator=g) * 0.05, -torch.rand(1000, generator=g) * 100,
                   torch.randn(1000, generator=g).to(torch.bfloat16).float(),  # exactly representable
                   torch.tensor([0.0, -0.0, 1.0, -2.0, 1e-40, 3e38])])
    out = sr.stochastic_round_(torch.empty(x.shape, dtype=torch.bfloat16), x, (1, 0)).float()
    down, up = neighbours(x)
    assert bool(((out == down) | (out == up)).all())
    exact = torch.bitwise_and(x.view(torch.int32), 0xFFFF) == 0
    assert torch.equal(out[exact], x[exact])
    inexact = ~exact
    ups = (out[inexact] == up[inexact]).float().mean().item()
    assert 0.3 < ups < 0.7  # random; RTN would round each value one fixed way
    assert not torch.equal(out, x.to(torch.bfloat16).float())


def test_unbiased(path):
    """E[round(x)] = x: for x = 1 + f ulp the fraction rounded up is f (5 sigma), for every f."""
    n = 200_000
    for f in (0.01, 0.3, 0.5, 0.93):
        x = torch.full((n,), 1.0 + f * BF16_ULP_AT_1)
        out = sr.stochastic_round_(torch.empty(n, dtype=torch.bfloat16), x, (7, int(f * 100))).float()
        p_up = ((out - 1.0) / BF16_ULP_AT_1).mean().item()
        assert abs(p_up - f) < 5 * (f * (1 - f) / n) ** 0.5, (f, p_up)
        neg = sr.stochastic_round_(torch.empty(n, dtype=torch.bfloat16), -x, (8, int(f * 100))).float()
        assert abs(((-neg - 1.0) / BF16_ULP_AT_1).mean().item() - f) < 5 * (f * (1 - f) / n) ** 0.5
    # and over steps: the mean of 400 roundings of a random vector is the vector (RTN's mean is not)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(2000, generator=g) * 0.05
    mean = torch.stack([sr.stochastic_round_(torch.empty(2000, dtype=torch.bfloat16), v, (1, step)).float()
                        for step in range(400)]).mean(0)
    ulp = (neighbours(v)[1] - neighbours(v)[0]).abs().clamp_min(1e-12)
    rtn_err = ((v.to(torch.bfloat16).float() - v) / ulp).abs().mean().item()
    sr_err = ((mean - v) / ulp).abs().mean().item()
    assert rtn_err > 0.2 and sr_err < 0.03, (rtn_err, sr_err)


def test_a_shard_rounds_as_its_slice_of_the_whole(path):
    n = sr.BLOCK * 2 + 12345
    x = torch.randn(n, generator=torch.Generator().manual_seed(2)) * 0.05
    whole = sr.stochastic_round_(torch.empty(n, dtype=torch.bfloat16), x, (3, 4, 5))
    for start, length in [(0, 10), (5, 1000), (sr.BLOCK - 3, 10), (sr.BLOCK + 7, sr.BLOCK), (n - 100, 100)]:
        part = sr.stochastic_round_(torch.empty(length, dtype=torch.bfloat16), x[start:start + length],
                                    (3, 4, 5), start=start)
        assert torch.equal(part, whole[start:start + length]), (start, length)
    again = sr.stochastic_round_(torch.empty(n, dtype=torch.bfloat16), x, (3, 4, 5))
    other = sr.stochastic_round_(torch.empty(n, dtype=torch.bfloat16), x, (3, 4, 6))
    assert torch.equal(again, whole) and not torch.equal(other, whole)


def test_non_finite_and_non_contiguous_targets(path):
    # NaN bit patterns that noise would carry into the sign (0x7FFFFFFF, 0xFFFFFFFF) or that truncation
    # alone would turn into inf (0x7F800001), among finite values in several blocks
    nans = torch.tensor([0x7FFFFFFF, -1, 0x7F800001, 0x7FC00000], dtype=torch.int32).view(torch.float32)
    x = torch.cat([torch.tensor([float("inf"), -float("inf"), float("nan"), 0.1, 3.4e38]), nans,
                   torch.full((sr.BLOCK,), 0.1), nans])
    for key in range(20):  # different noise each time: a carry needs noise above the pattern's low bits
        out = sr.stochastic_round_(torch.empty(len(x), dtype=torch.bfloat16), x, (key,))
        assert out[0].item() == float("inf") and out[1].item() == -float("inf") and torch.isnan(out[2])
        assert out[3].item() in neighbours(x[3:4])[0].tolist() + neighbours(x[3:4])[1].tolist()
        assert torch.equal(torch.isnan(out), torch.isnan(x)), key
        finite = torch.isfinite(x)
        finite[4] = False  # 3.4e38 lies between bf16's largest value and inf: either is right
        assert bool(torch.isfinite(out[finite]).all()), key
    target = torch.zeros(4, 6, dtype=torch.bfloat16)
    src = torch.randn(6, 4) * 0.05
    sr.stochastic_round_(target.t(), src, (9,))  # a transposed view
    down, up = neighbours(src)
    t = target.t().float()
    assert bool(((t == down) | (t == up)).all())


def test_refuses_other_dtypes_and_sizes():
    with pytest.raises(TypeError, match="fp32 into bf16"):
        sr.stochastic_round_(torch.empty(3, dtype=torch.float16), torch.zeros(3), (0,))
    with pytest.raises(ValueError, match="3 values into 4"):
        sr.stochastic_round_(torch.empty(4, dtype=torch.bfloat16), torch.zeros(3), (0,))


def _bf16_setup(distributed: bool, stochastic: bool, lr=1e-4, seed=5):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from tests.unit.models.test_train_step import ARGS

    init_parallel_state(1, 1, seed=7)
    ddp = wrap_ddp(build_gpt_model(ARGS, params_dtype=torch.bfloat16), use_distributed_optimizer=distributed)
    opt, sched = build_optimizer([ddp], lr=lr, train_iters=10, clip_grad=1e9, use_distributed_optimizer=distributed,
                                 params_dtype=torch.bfloat16, stochastic_rounding=stochastic, seed=seed)
    return ddp, opt, sched


def _step(ddp, opt, sched, seed):
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import P, make_batch

    policy_update_step(ddp, opt, sched, make_batch(seed), P, 2, PolicyLossSettings(use_kl_loss=True))


def _main_params(opt) -> list[torch.Tensor]:
    inner = opt.chained_optimizers if hasattr(opt, "chained_optimizers") else [opt]
    return [p for o in inner for group in o.fp32_from_float16_groups for p in group]


def _model_params(opt) -> list[torch.Tensor]:
    inner = opt.chained_optimizers if hasattr(opt, "chained_optimizers") else [opt]
    return [p for o in inner for group in o.float16_groups for p in group]


def test_megatron_copy_is_stochastic_rounding_of_the_main_params(gloo_world1):
    """After each step every bf16 parameter is exactly the stochastic rounding of its fp32 main param
    with key (seed, steps before, parameter); RTN would differ."""
    ddp, opt, sched = _bf16_setup(distributed=False, stochastic=True)
    keys = sr.param_keys([ddp])
    for step in range(2):
        _step(ddp, opt, sched, step)
        differs_from_rtn = 0
        for model, main in zip(_model_params(opt), _main_params(opt)):
            expected = sr.stochastic_round_(torch.empty_like(model), main.detach(), (5, step) + keys[id(model)])
            assert torch.equal(model.detach(), expected)
            differs_from_rtn += int((model.detach() != main.detach().to(torch.bfloat16)).sum())
        assert differs_from_rtn > 0


def test_distributed_optimizer_rounds_as_the_plain_one(gloo_world1):
    """megatron's DistributedOptimizer copies its shard through our copy; at DP=1 the shard is the
    whole parameter and the bf16 weights equal the Float16 optimizer's bit for bit (DP=2 in tests/dist)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    runs = []
    for distributed in (False, True):
        ddp, opt, sched = _bf16_setup(distributed=distributed, stochastic=True)
        assert any(isinstance(o, DistributedOptimizer) for o in getattr(opt, "chained_optimizers", [opt])) == distributed
        for step in range(3):
            _step(ddp, opt, sched, step)
        runs.append([p.detach().clone() for p in ddp.module.parameters()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_small_updates_reach_the_model_only_with_stochastic_rounding(gloo_world1):
    """At an lr far below half an ulp of most weights, round-to-nearest moves only the weights whose
    ulp is tiny (|w| < ~256 lr, 3 % of this random init); stochastic rounding moves each weight with
    probability |update| / ulp, twice as many here (its expected value follows the fp32 master)."""
    moved = {}
    for stochastic in (False, True):
        ddp, opt, sched = _bf16_setup(distributed=False, stochastic=stochastic, lr=1e-6)
        before = [p.detach().clone() for p in ddp.module.parameters()]
        _step(ddp, opt, sched, 0)
        after = [p.detach() for p in ddp.module.parameters()]
        moved[stochastic] = sum(int((a != b).sum()) for a, b in zip(before, after)) / sum(a.numel() for a in after)
    assert moved[False] < 0.05 and moved[True] > 1.5 * moved[False], moved


def test_step_comes_from_the_scheduler(gloo_world1):
    """The random bits of a copy are a function of the scheduler's step count: the same main params
    copied at the same count round alike (a resumed run), at another count differently."""
    ddp, opt, sched = _bf16_setup(distributed=False, stochastic=True)
    inner = opt.chained_optimizers[0] if hasattr(opt, "chained_optimizers") else opt
    _step(ddp, opt, sched, 0)  # main params between bf16 values (before it they are exact bf16)
    results = []
    for steps in (3, 3, 4):
        sched.num_steps = steps
        inner._copy_main_params_to_model_params()
        results.append([p.detach().clone() for p in _model_params(opt)])
    assert all(torch.equal(a, b) for a, b in zip(results[0], results[1]))
    assert not all(torch.equal(a, b) for a, b in zip(results[0], results[2]))


def test_build_optimizer_refuses_non_bf16(gloo_world1):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from tests.unit.models.test_train_step import ARGS

    init_parallel_state(1, 1, seed=7)
    ddp = wrap_ddp(build_gpt_model(ARGS), use_distributed_optimizer=False)
    with pytest.raises(ValueError, match="bf16 parameters"):
        build_optimizer([ddp], lr=1e-3, train_iters=2, use_distributed_optimizer=False, stochastic_rounding=True)
