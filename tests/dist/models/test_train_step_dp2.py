"""Data parallelism does not change the update: DP=2 on halves == DP=1 on the whole mini-batch."""
import pytest
import torch

from testing_utils import run_gloo

pytestmark = pytest.mark.dist


def _update(rank, world, mode, kl=True, frozen=()):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.freeze import freeze
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import ARGS, P, make_batch

    init_parallel_state(1, 1, seed=7)  # same seed on every rank: identical initial weights
    model = build_gpt_model(ARGS)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    freeze([model], frozen)
    ddp = wrap_ddp(model, use_distributed_optimizer=True)
    opt, sched = build_optimizer([ddp], lr=1e-3, train_iters=10, clip_grad=1e9)
    batch = make_batch()
    if not kl:  # policy loss only: zero-advantage rows are not run, so rank 0 runs 1 micro-batch, rank 1 runs 2
        batch["advantages"][1] = 0.0
    if world == 2:  # uneven token counts per rank: the global denominator must handle it
        batch = {k: v[rank * 2:(rank + 1) * 2] for k, v in batch.items()}
    stats = policy_update_step(ddp, opt, sched, batch, P, 1,
                               PolicyLossSettings(loss_agg_mode=mode, use_kl_loss=kl))
    return {"params": [p.detach().clone() for p in ddp.module.parameters()], "stats": stats,
            "unchanged": sorted(n for n, p in ddp.module.named_parameters() if torch.equal(p.detach(), initial[n]))}


@pytest.mark.parametrize("mode,kl", [("token-mean", True), ("seq-mean-token-mean", True), ("token-mean", False)])
def test_dp2_equals_dp1(mode, kl):
    one = run_gloo(_update, 1, mode, kl)[0]
    two = run_gloo(_update, 2, mode, kl)
    if not kl:
        assert [r["stats"]["actor/rows_not_run"] for r in two] == [1.0, 0.0]
    for rank_out in two:
        worst = max((a - b).abs().max().item() for a, b in zip(rank_out["params"], one["params"]))
        assert worst < 1e-6, worst
    mean_pg = sum(r["stats"]["actor/pg_loss"] for r in two) / 2
    assert abs(mean_pg - one["stats"]["actor/pg_loss"]) < 1e-6


def test_dp2_with_frozen_parameters_equals_dp1():
    """freeze_parameters (models/freeze.py) under the distributed optimizer at DP=2: the frozen tensors are left out of
    its buffers and keep their values on both ranks; the rest take DP=1's step."""
    frozen = ("embedding.word_embeddings.weight", "decoder.layers.0.mlp.*")
    one = run_gloo(_update, 1, "token-mean", True, frozen)[0]
    two = run_gloo(_update, 2, "token-mean", True, frozen)
    assert one["unchanged"] == ["decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.0.mlp.linear_fc2.weight",
                                "embedding.word_embeddings.weight"]
    for rank_out in two:
        assert rank_out["unchanged"] == one["unchanged"]
        worst = max((a - b).abs().max().item() for a, b in zip(rank_out["params"], one["params"]))
        assert worst < 1e-6, worst


def _bf16_stochastic(rank, world, tp, distributed):
    """Two bf16 updates with stochastic rounding; returns every parameter and whether TP splits it."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import ARGS, P, make_batch

    init_parallel_state(tp, 1, seed=7)
    ddp = wrap_ddp(build_gpt_model(ARGS, params_dtype=torch.bfloat16), use_distributed_optimizer=distributed)
    opt, sched = build_optimizer([ddp], lr=1e-4, train_iters=10, clip_grad=1e9, use_distributed_optimizer=distributed,
                                 params_dtype=torch.bfloat16, stochastic_rounding=True, seed=5)
    dp = world // tp
    for step in range(2):
        batch = make_batch(step)
        if dp == 2:
            dp_rank = rank // tp
            batch = {k: v[dp_rank * 2:(dp_rank + 1) * 2] for k, v in batch.items()}
        policy_update_step(ddp, opt, sched, batch, P, 1, PolicyLossSettings(use_kl_loss=True))
    return {name: (p.detach().clone(), bool(getattr(p, "tensor_model_parallel", False)))
            for name, p in ddp.module.named_parameters()}


def test_bf16_stochastic_rounding_keeps_dp_replicas_identical_and_shards_consistent():
    """DP=2: both ranks hold the same bf16 weights, and the distributed optimizer (each rank rounds
    its shard at its offset in the parameter) gives the plain optimizer's weights bit for bit."""
    plain = run_gloo(_bf16_stochastic, 2, 1, False)
    sharded = run_gloo(_bf16_stochastic, 2, 1, True)
    for name, (weight, _) in plain[0].items():
        assert torch.equal(weight, plain[1][name][0]), name
        assert torch.equal(weight, sharded[0][name][0]) and torch.equal(weight, sharded[1][name][0]), name


def test_bf16_stochastic_rounding_keeps_tp_replicated_params_identical():
    """TP=2: the parameters both TP ranks hold whole (norms) round alike on both; a key that
    included the TP rank would let the replicas drift apart."""
    ranks = run_gloo(_bf16_stochastic, 2, 2, False)
    replicated = [name for name, (_, split) in ranks[0].items() if not split]
    assert replicated and any("norm" in name for name in replicated)
    for name in replicated:
        assert torch.equal(ranks[0][name][0], ranks[1][name][0]), name


def _moe_bf16_stochastic(rank, world, hf_dir):
    """EP=2 (dense parameters data-parallel over the two ranks, each rank its own experts): two bf16
    updates with stochastic rounding through megatron's chained (dense + expert) optimizer."""
    from mindspeed_rl.models import stochastic_rounding
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.hf_bridge import read_hf_config
    from mindspeed_rl.models.hf_config import model_config_from_hf
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import P, make_batch

    init_parallel_state(1, 1, seed=7, ep=2)
    args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=128)
    ddp = wrap_ddp(build_gpt_model(args, params_dtype=torch.bfloat16), use_distributed_optimizer=False)
    switched = []
    enable = stochastic_rounding.enable
    stochastic_rounding.enable = lambda *a, **k: switched.append(enable(*a, **k)) or switched[-1]
    try:
        opt, sched = build_optimizer([ddp], lr=1e-4, train_iters=10, clip_grad=1e9, use_distributed_optimizer=False,
                                     params_dtype=torch.bfloat16, stochastic_rounding=True, seed=5)
    finally:
        stochastic_rounding.enable = enable
    for step in range(2):
        batch = {k: v[rank * 2:(rank + 1) * 2] for k, v in make_batch(step).items()}
        policy_update_step(ddp, opt, sched, batch, P, 1, PolicyLossSettings(use_kl_loss=True))
    return {"switched": switched, "params": {name: (p.detach().clone(), getattr(p, "allreduce", True))
                                             for name, p in ddp.module.named_parameters()}}


def test_bf16_stochastic_rounding_under_expert_parallelism(tmp_path):
    """Both optimizers of the chain (dense, experts) round stochastically; the dense parameters, which
    the EP ranks hold as data-parallel replicas, stay identical; each rank's experts are its own."""
    from testing_utils import make_tiny_hf

    make_tiny_hf("qwen3_moe", str(tmp_path), num_hidden_layers=2)
    ranks = run_gloo(_moe_bf16_stochastic, 2, str(tmp_path), timeout_s=300)
    assert ranks[0]["switched"] == [2]
    params = [r["params"] for r in ranks]
    dense = [n for n, (_, allreduce) in params[0].items() if allreduce]
    experts = [n for n, (_, allreduce) in params[0].items() if not allreduce]
    assert dense and experts
    for name in dense:
        assert torch.equal(params[0][name][0], params[1][name][0]), name
    assert any(not torch.equal(params[0][n][0], params[1][n][0]) for n in experts)
