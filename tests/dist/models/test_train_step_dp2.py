"""Data parallelism does not change the update: DP=2 on halves == DP=1 on the whole mini-batch."""
import pytest

from testing_utils import run_gloo

pytestmark = pytest.mark.dist


def _update(rank, world, mode, kl=True):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import ARGS, P, make_batch

    init_parallel_state(1, 1, seed=7)  # same seed on every rank: identical initial weights
    ddp = wrap_ddp(build_gpt_model(ARGS), use_distributed_optimizer=True)
    opt, sched = build_optimizer([ddp], lr=1e-3, train_iters=10, clip_grad=1e9)
    batch = make_batch()
    if not kl:  # policy loss only: zero-advantage rows are not run, so rank 0 runs 1 micro-batch, rank 1 runs 2
        batch["advantages"][1] = 0.0
    if world == 2:  # uneven token counts per rank: the global denominator must handle it
        batch = {k: v[rank * 2:(rank + 1) * 2] for k, v in batch.items()}
    stats = policy_update_step(ddp, opt, sched, batch, P, 1,
                               PolicyLossSettings(loss_agg_mode=mode, use_kl_loss=kl))
    return {"params": [p.detach().clone() for p in ddp.module.parameters()], "stats": stats}


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
