"""The reward-model and split roles as Ray worker groups on a local Ray (4 logical NPUs, gloo):
- RewardModelWorker at TP=2 scores like transformers' Qwen2ForSequenceClassification (1e-4);
- train/infer split, training on 2 ranks (TP=2, PP=2, or an MoE actor at EP=2: each rank holds half
  of the experts) and generation on 2 others (the actor's TP: one TP=2 group, or two DP ranks):
  after a sync the generation ranks hold the training
  weights bit for bit (also after an update), and the training ranks' log-probs of the generated
  batch match the sampler's within 1e-5."""

import pytest
import ray
import torch

from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.data import keys as K
from mindspeed_rl.distributed.plan import make_plan
from mindspeed_rl.distributed.pools import create_pools, remove_pools

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]
A = "actor_rollout_ref.actor_rollout"


def test_reward_model_worker_tp2_matches_transformers(ray_session, tmp_path):
    from mindspeed_rl.distributed.worker_group import DPLayout, WorkerGroup
    from mindspeed_rl.trainer.roles import RewardModelFacade
    from mindspeed_rl.workers.reward_model import RewardModelWorker
    from tests.unit.models.test_reward_model import hf_scores
    from tests.unit.workers.tiny_rm import make_tiny_task_rm

    hf = make_tiny_task_rm(str(tmp_path / "rm"))
    cfg = build_config(compose_yaml("grpo_trainer_tiny", [
        "resource_pool.reward=[2]", f"reward.load={tmp_path / 'rm'}", "reward.tensor_model_parallel_size=2",
        "reward.micro_batch_size=2"]), "t")
    plan = {p.role: p for p in make_plan(cfg)}
    pools = create_pools([plan["actor_rollout"], plan["reward"]], "NPU", timeout_s=60)
    group = None
    try:
        group = WorkerGroup("reward", RewardModelWorker, pools["reward"], plan["reward"], args=(cfg,),
                            ready_timeout_s=300, call_timeout_s=120)
        rm = RewardModelFacade(group, DPLayout.from_rank_info(group.run_all("rank_info")))
        g = torch.Generator().manual_seed(3)
        ids = torch.randint(1, 13, (6, 12), generator=g)  # real tokens avoid 0, transformers' pad id
        mask = torch.ones(6, 12, dtype=torch.long)
        mask[0, :4], mask[1, :7], mask[2, 9:], mask[4, :2], mask[4, 10:] = 0, 0, 0, 0, 0  # left, right, both
        ids = ids * mask
        ours = rm.compute_rm_score_async({K.INPUT_IDS: ids, K.ATTENTION_MASK: mask}).get()
        theirs = hf_scores(hf, ids, mask)
        print(f"reward model TP=2 vs transformers: max |diff| = {(ours - theirs).abs().max():.2e}")
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
        assert ours.dtype == torch.float32 and ours.shape == (6,) and ours.std() > 0.01
    finally:
        if group is not None:
            group.shutdown()
        remove_pools(pools)


def _rollout_weights_equal_training(actor, train_group, gen_group):
    """Training's exported HF tensors == every generation rank's own (TP-gathered) weights."""
    refs = [r for rank_refs in train_group.run_all("export_weights_for_rollout") for r in rank_refs]
    sent = {k: v for ref in refs for k, v in ray.get(ref, timeout=60).items()}
    for name, tensor in sent.items():  # each tensor shipped alone, not the parameter buffer it views
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size(), name
    for rank_weights in gen_group.run_all("hf_weights"):
        assert sorted(rank_weights) == sorted(sent)
        for name, tensor in sent.items():
            assert torch.equal(rank_weights[name], tensor), name
    return sent


MOE_EP2 = ("training.num_experts=4", "training.moe_ffn_hidden_size=64", "training.moe_router_topk=2",
           f"{A}.expert_model_parallel_size=2")


@pytest.mark.parametrize("tp,pp,extra", [(2, 1, ()), (1, 2, ()), (1, 1, MOE_EP2)],
                         ids=["train-tp2-gen-tp2", "train-pp2-gen-dp2", "train-moe-ep2-gen-dp2"])
def test_split_sync_bit_exact_and_logprobs_agree(ray_session, tp, pp, extra):
    from mindspeed_rl.data.loader import build_prompt_loader
    from mindspeed_rl.data.tokenizer import load_tokenizer
    from mindspeed_rl.trainer.launch import _with_group_ids
    from mindspeed_rl.trainer.roles import build_roles

    cfg = build_config(compose_yaml("grpo_trainer_tiny", [
        "resource_pool.actor_rollout=[4]", f"{A}.tensor_model_parallel_size={tp}",
        f"{A}.pipeline_model_parallel_size={pp}", f"{A}.num_gpus_for_train=2", f"{A}.num_gpus_for_infer=2",
        "training.global_batch_size=4", f"{A}.ppo_mini_batch_size=4", f"{A}.micro_batch_size=8",
        f"{A}.use_kl_loss=false", *extra]), "t")
    plan = make_plan(cfg)
    pools = create_pools(plan, "NPU", timeout_s=60)
    groups = []
    try:
        roles = build_roles(cfg, plan, pools, needs_reference=False, groups=groups)
        actor = roles.actor
        train_group, gen_group = actor.group, actor.rollout.group
        assert (train_group.world_size, gen_group.world_size, roles.world_size) == (2, 2, 4)
        assert [s.bundle for s in gen_group.slots] == [2, 3]  # the pool's last two devices

        actor.sync_rollout_weights()
        print(f"first sync (export + object store + load, TP{tp} PP{pp} -> 2 ranks): {actor.rollout.last_sync_s:.3f} s")
        before = _rollout_weights_equal_training(actor, train_group, gen_group)

        tok = load_tokenizer(cfg.run.tokenizer_name_or_path)
        loader = build_prompt_loader(cfg.data.data_path, tok, 4, cfg.data.max_prompt_length, "error", 1)
        prompts = next(_with_group_ids(iter(loader)))
        batch = actor.generate_sequences(prompts, n=4)
        assert batch[K.RESPONSES].shape[0] == 16
        logp = actor.compute_log_prob(batch)
        diff = ((logp - batch[K.ROLLOUT_LOG_PROBS]).abs() * batch[K.RESPONSE_MASK]).max()
        print(f"training vs rollout log-probs after sync: max |diff| = {diff:.2e}")
        assert diff <= 1e-5

        g = torch.Generator().manual_seed(0)
        batch[K.ADVANTAGES] = torch.randn(batch[K.RESPONSES].shape, generator=g) * batch[K.RESPONSE_MASK]
        stats = actor.update_actor(batch)
        assert "timing/sync_weights" in stats and stats["rollout/logp_diff_max"] == pytest.approx(float(diff))
        assert actor.rollout.stale
        actor.sync_rollout_weights()
        after = _rollout_weights_equal_training(actor, train_group, gen_group)
        assert any(not torch.equal(before[k], after[k]) for k in before)  # the update moved weights
    finally:
        for group in groups:
            group.shutdown()
        remove_pools(pools)
