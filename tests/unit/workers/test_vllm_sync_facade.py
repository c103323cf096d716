"""The vLLM weight sync through the actor facade, without Ray or vLLM: when weights move, the probe
check after every sync, the sentence that stops the run, and the sync metrics."""
import pytest
import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.distributed.worker_group import DPLayout
from mindspeed_rl.rollout.sync_check import RolloutSyncError, check_sync, probe_prompts, tolerance
from mindspeed_rl.trainer.roles import ActorFacade, RolloutFacade
from testing_utils import FakeGroup


def probe(logp):
    """A probe batch as generate_probe returns it: 1 prompt of 2 tokens, 2 response tokens."""
    return {K.PROMPT_IDS: torch.tensor([[3, 4]]), K.PROMPT_MASK: torch.ones(1, 2, dtype=torch.long),
            K.INPUT_IDS: torch.tensor([[3, 4, 5, 6]]), K.ATTENTION_MASK: torch.ones(1, 4, dtype=torch.long),
            K.RESPONSES: torch.tensor([[5, 6]]), K.RESPONSE_MASK: torch.ones(1, 2, dtype=torch.long),
            K.ROLLOUT_LOG_PROBS: torch.tensor([logp])}


def colocated(log, engine_logp, train_logp=(-1.0, -2.0)):
    train = FakeGroup("train", log, {
        "sync_rollout_weights": lambda: [{"timing/sync_weights": 0.1, "rollout/sync_peak_bytes": 1024.0}],
        "generate_probe": lambda: [probe(engine_logp)],
        "compute_log_prob": lambda b: torch.tensor([list(train_logp)] * len(b[K.PROMPT_IDS])),
        "generate_sequences": lambda p, n, g: {"n": n},
        "update_actor": lambda b: {"actor/pg_loss": [1.0]}})
    return ActorFacade(train, DPLayout.pure(1), colocated_copy=True, verify_sync=True, sync_tolerance=1e-4)


def test_colocated_vllm_syncs_once_per_update_and_checks_every_sync():
    log = []
    actor = colocated(log, engine_logp=[-1.0, -2.00005])
    actor.generate_sequences({K.PROMPT_IDS: torch.zeros(1, 2)}, 2)  # the engine starts with dummy weights
    assert log == [("train", "sync_rollout_weights"), ("train", "generate_probe"), ("train", "compute_log_prob"),
                   ("train", "generate_sequences")]
    actor.sync_rollout_weights()  # nothing changed: no transfer, no check
    assert len(log) == 4
    stats = actor.update_actor({})
    assert stats["rollout/sync_peak_bytes"] == 1024.0 and stats["timing/sync_weights"] > 0
    assert stats["rollout/logp_diff_max"] == pytest.approx(5e-5, abs=1e-6)
    assert stats["timing/sync_check"] > 0  # what the probe check costs, reported with the update
    actor.sync_rollout_weights()  # after the update: sync and check again
    assert log[-3:] == [("train", "sync_rollout_weights"), ("train", "generate_probe"), ("train", "compute_log_prob")]


def test_a_bad_sync_stops_the_run_naming_the_step_and_the_difference():
    actor = colocated([], engine_logp=[-1.0, -2.75])
    actor.updates = 2  # two updates done: the sync before step 3
    with pytest.raises(RolloutSyncError, match=r"^step 3: after the weight sync, the log-probs of the actor ranks' "
                                               r"rollout engines on the probe differ from the training forward by up "
                                               r"to 0\.75 "):
        actor.sync_rollout_weights()


def test_split_with_verification_checks_the_generation_ranks():
    log = []
    train = FakeGroup("train", log, {"export_weights_for_rollout": lambda: ["ref"],
                                     "compute_log_prob": lambda b: torch.tensor([[-1.0, -2.0]] * len(b[K.PROMPT_IDS]))})
    gen = FakeGroup("gen", log, {"update_weights": lambda refs, timeout, stats: [{"rollout/sync_peak_bytes": 64.0}],
                                 "generate_probe": lambda: [probe([-1.0, -2.0]), probe([-1.0, -2.0])]})
    actor = ActorFacade(train, DPLayout.pure(2), rollout=RolloutFacade(gen, DPLayout.pure(1)), colocated_copy=True,
                        verify_sync=True)
    actor.sync_rollout_weights()
    assert log == [("train", "export_weights_for_rollout"), ("gen", "update_weights"), ("gen", "generate_probe"),
                   ("train", "compute_log_prob")]
    assert actor._pending_metrics["rollout/logp_diff_max"] == 0.0
    assert actor._pending_metrics["rollout/sync_peak_bytes"] == 64.0


def test_check_sync_by_hand_and_its_bounds():
    train = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])  # the third token is padding
    m = check_sync(train, torch.tensor([[-1.00002, -2.0, 7.0]]), mask, 1e-4, step=1)
    assert m["rollout/logp_diff_max"] == pytest.approx(2e-5, abs=1e-7)
    assert m["rollout/logp_diff_mean"] == pytest.approx(1e-5, abs=1e-7)
    with pytest.raises(RolloutSyncError, match="step 4: .* up to nan"):
        check_sync(train, torch.tensor([[float("nan"), -2.0, 0.0]]), mask, 1e-4, step=4)
    with pytest.raises(RolloutSyncError, match="produced no response tokens"):
        check_sync(train, train, torch.zeros(1, 3), 1e-4, step=2)
    assert tolerance("fp32") == 1e-4 and tolerance("bf16") == 0.5 and tolerance("bf16", 0.1) == 0.1
    assert probe_prompts(50) == probe_prompts(50) and all(0 <= t < 50 for p in probe_prompts(50) for t in p)


def test_an_moe_check_lets_a_few_near_tie_tokens_through_but_not_stale_weights():
    """MoE: one probe token of 16 routed to other experts (0.026 off, as measured on the split) passes;
    stale weights (every token off) and a NaN do not; a dense model stops at the one token."""
    mask = torch.ones(4, 4, dtype=torch.long)
    train = -torch.rand(4, 4, generator=torch.Generator().manual_seed(0)) * 5
    flip = train.clone()
    flip[2, 1] += 0.026
    flip[0, 0] += 3e-7
    m = check_sync(train, flip, mask, 1e-4, step=3, moe=True)
    assert m["rollout/logp_diff_max"] == pytest.approx(0.026, rel=1e-4)
    with pytest.raises(RolloutSyncError, match="step 3: .* up to 0.026"):
        check_sync(train, flip, mask, 1e-4, step=3)  # dense
    four = flip.clone()
    four[1, :3] += 0.5  # 4 of 16 tokens: still a quarter
    check_sync(train, four, mask, 1e-4, step=3, moe=True)
    five = four.clone()
    five[3, 3] += 0.1
    with pytest.raises(RolloutSyncError, match=r"on 5 of 16 probe tokens \(an MoE model may differ on up to a quarter"):
        check_sync(train, five, mask, 1e-4, step=3, moe=True)
    with pytest.raises(RolloutSyncError, match="on 16 of 16 probe tokens"):
        check_sync(train, train + 2e-3, mask, 1e-4, step=3, moe=True)  # stale: every token moved
    nan = train.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(RolloutSyncError, match="up to nan"):
        check_sync(train, nan, mask, 1e-4, step=3, moe=True)


@pytest.mark.parametrize("interval, checked", [(1, [1, 2, 3, 4, 5]), (2, [1, 3, 5]), (3, [1, 4]), (0, [])])
def test_sync_check_interval_checks_the_first_sync_then_every_kth(interval, checked):
    log = []
    actor = colocated(log, engine_logp=[-1.0, -2.0])
    actor.sync_check_interval = interval
    done = []
    for sync in range(1, 6):
        actor.stale = True  # an update happened
        before = len(log)
        actor.sync_rollout_weights()
        calls = [name for _, name in log[before:]]
        assert calls[0] == "sync_rollout_weights"  # the weights always move
        if "generate_probe" in calls:
            assert calls == ["sync_rollout_weights", "generate_probe", "compute_log_prob"]
            done.append(sync)
    assert done == checked
    assert ("timing/sync_check" in actor._pending_metrics) == bool(checked)
    assert actor._pending_metrics["rollout/sync_peak_bytes"] == 1024.0  # sync stats with or without a check


def test_sync_check_interval_reaches_the_facade_and_is_validated():
    from mindspeed_rl.config import load_config
    from mindspeed_rl.config.validate import validate
    from mindspeed_rl.utils.errors import UserInputError

    A = "actor_rollout_ref.actor_rollout"
    cfg = load_config("grpo_trainer_tiny", [f"{A}.rollout_engine=vllm", f"{A}.sync_check_interval=4"])
    assert cfg.actor.rollout.sync_check_interval == 4
    with pytest.raises(UserInputError, match=r"sync_check_interval: -1` must be 0 \(never check\) or a number of "
                                             r"syncs >= 1"):
        validate(load_config("grpo_trainer_tiny", [f"{A}.rollout_engine=vllm", f"{A}.sync_check_interval=-1"]))
