"""The GRPO loop with in-process fake roles: a tabular policy learns a bandit, and the loop's
bookkeeping (on-policy reuse, KL in reward, reference overlap, dynamic sampling, metrics) holds."""
import torch

from mindspeed_rl import algorithms as alg
from mindspeed_rl.data import keys as K
from mindspeed_rl.data.batches import concat_rollouts
from mindspeed_rl.trainer.grpo import GRPOSettings, GRPOTrainer
from mindspeed_rl.trainer.metrics import MetricsLogger, read_metrics

V, T, NUM_PROMPTS = 4, 3, 8


class TabularActor:
    """pi(token_t | prompt) = softmax(table[prompt, t]); the 'model' the fake actor trains."""

    def __init__(self, seed=0, lr=0.3):
        torch.manual_seed(seed)
        self.table = torch.nn.Parameter(torch.zeros(NUM_PROMPTS, T, V))
        self.opt = torch.optim.Adam([self.table], lr=lr)
        self.gen = torch.Generator().manual_seed(seed)
        self.synced = 0
        self.updates = []
        self.advantages = []  # (advantages, response_mask) of every update

    def sync_rollout_weights(self):
        self.synced += 1

    def _logp(self, batch):
        logits = self.table[batch[K.PROMPT_IDS][:, -1]]  # (B, T, V)
        return torch.log_softmax(logits, -1).gather(-1, batch[K.RESPONSES].unsqueeze(-1)).squeeze(-1)

    def generate_sequences(self, prompts, n, greedy=False):
        ids = prompts[K.PROMPT_IDS].repeat_interleave(n, 0)  # (B, 1)
        probs = torch.softmax(self.table.detach()[ids[:, -1]], -1)  # (B, T, V)
        flat = probs.reshape(-1, V)
        tokens = flat.argmax(-1) if greedy else torch.multinomial(flat, 1, generator=self.gen).squeeze(-1)
        responses = tokens.reshape(-1, T)
        batch = {K.PROMPT_IDS: ids, K.PROMPT_MASK: torch.ones_like(ids), K.RESPONSES: responses,
                 K.RESPONSE_MASK: torch.ones_like(responses), K.INPUT_IDS: torch.cat([ids, responses], 1),
                 K.ATTENTION_MASK: torch.ones(ids.shape[0], 1 + T, dtype=torch.long),
                 K.GROUP_INDEX: torch.arange(ids.shape[0]) // n,
                 K.LABELS: [l for l in prompts[K.LABELS] for _ in range(n)],
                 K.FINISH_REASON: ["length"] * ids.shape[0]}
        with torch.no_grad():
            batch[K.ROLLOUT_LOG_PROBS] = self._logp(batch)
        return batch

    def compute_log_prob(self, batch):
        with torch.no_grad():
            return self._logp(batch)

    def update_actor(self, batch):
        self.updates.append(sorted(k for k in batch if not k.startswith("_")))
        self.advantages.append((batch[K.ADVANTAGES], batch[K.RESPONSE_MASK]))
        logp = self._logp(batch)
        old = batch.get(K.OLD_LOG_PROBS, logp.detach())
        loss, stats = alg.policy_loss(logp, old, batch[K.ADVANTAGES], batch[K.RESPONSE_MASK])
        if K.REF_LOG_PROBS in batch:
            kl = alg.aggregate_loss(alg.kl_penalty(logp, batch[K.REF_LOG_PROBS], "low_var_kl"),
                                    batch[K.RESPONSE_MASK], "token-mean")
            loss = loss + 0.001 * kl
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return {"actor/pg_loss": float(loss.detach()), **{f"actor/{k}": float(v) for k, v in stats.items()}}

    def save_checkpoint(self, path, step):
        pass


class FrozenReference:
    def __init__(self):
        self.calls = 0

    def compute_ref_log_prob_async(self, batch):
        self.calls += 1
        value = torch.full(batch[K.RESPONSES].shape, -torch.log(torch.tensor(float(V))))

        class Done:
            def get(self_inner):
                return value
        return Done()


class MatchReward:
    """Fraction of response tokens equal to the prompt's label token."""

    def compute_scores(self, batch):
        target = torch.tensor([int(l) for l in batch[K.LABELS]]).unsqueeze(-1)
        return (batch[K.RESPONSES] == target).float().mean(-1), {"reward/failures": 0.0}


def prompt_stream(batch_prompts=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(0, NUM_PROMPTS, (batch_prompts, 1), generator=g)
        yield {K.PROMPT_IDS: ids, K.PROMPT_MASK: torch.ones_like(ids),
               K.LABELS: [str(int(i) % V) for i in ids[:, 0]]}


def run(tmp_path, steps=40, **overrides):
    settings = GRPOSettings(train_iters=steps, n_samples_per_prompt=8, **overrides)
    actor, ref = TabularActor(), FrozenReference()
    logger = MetricsLogger(str(tmp_path), steps, tensorboard_dir=str(tmp_path / "tb"), console=False)
    trainer = GRPOTrainer(settings, actor, ref, MatchReward(), prompt_stream(), logger,
                          val_batches=lambda: iter([next(prompt_stream(seed=1))]))
    history = trainer.fit()
    logger.close()
    return history, actor, ref


def test_reward_rises_and_metrics_are_written(tmp_path):
    history, actor, ref = run(tmp_path, steps=40, test_freq=10)
    first = sum(h["grpo/score/mean"] for h in history[:5]) / 5
    last = sum(h["grpo/score/mean"] for h in history[-5:]) / 5
    assert first < 0.45 and last > 0.85, (first, last)
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, 41))
    for key in ("grpo/score/mean", "grpo/score/max", "grpo/score/min", "actor/pg_loss", "actor/pg_clipfrac",
                "response_length/mean", "prompt_length/mean", "timing/step", "timing/gen", "timing/reward",
                "timing/adv", "timing/update_actor", "perf/throughput"):
        assert key in rows[0], key
    assert "val/score/mean" in rows[9] and "val/score/mean" not in rows[8]
    assert actor.synced == 40
    for row, (adv, mask) in zip(rows, actor.advantages):  # rows the policy loss learns nothing from
        mask = mask.bool()
        assert row["grpo/zero_advantage_frac"] == float(((adv == 0) | ~mask).all(-1).float().mean())
    assert any(0 < r["grpo/zero_advantage_frac"] < 1 for r in rows)  # some groups scored alike, others not
    # exactly on-policy by default: no old log-probs recomputed, no reference needed (no KL)
    assert K.OLD_LOG_PROBS not in actor.updates[0] and ref.calls == 0


def test_off_policy_and_kl_paths(tmp_path):
    history, actor, ref = run(tmp_path, steps=3, on_policy=False, use_kl_loss=True, use_kl_in_reward=True,
                              kl_coef=0.1, kl_ctrl_type="adaptive", target_kl=0.01, horizon=100)
    assert K.OLD_LOG_PROBS in actor.updates[0] and K.REF_LOG_PROBS in actor.updates[0]
    assert ref.calls == 3
    assert history[0]["actor/reward_kl_penalty_coeff"] == 0.1
    assert history[1]["actor/reward_kl_penalty_coeff"] != 0.1  # the adaptive controller moved


def test_dynamic_sampling_keeps_only_varying_groups(tmp_path):
    history, actor, _ = run(tmp_path, steps=2, dynamic_sampling=True, max_num_gen_batches=3)
    assert 1 <= history[0]["dapo/gen_rounds"] <= 3
    assert 0 < history[0]["dapo/kept_fraction"] <= 1


def test_concat_repads_prompts_left_and_responses_right():
    a = {K.PROMPT_IDS: torch.tensor([[0, 5]]), K.RESPONSES: torch.tensor([[7]]),
         K.INPUT_IDS: torch.tensor([[0, 5, 7]]), K.SCORES: torch.tensor([1.0]), K.LABELS: ["x"]}
    b = {K.PROMPT_IDS: torch.tensor([[6]]), K.RESPONSES: torch.tensor([[8, 9]]),
         K.INPUT_IDS: torch.tensor([[6, 8, 9]]), K.SCORES: torch.tensor([0.0]), K.LABELS: ["y"]}
    out = concat_rollouts([a, b])
    assert out[K.PROMPT_IDS].tolist() == [[0, 5], [0, 6]]
    assert out[K.RESPONSES].tolist() == [[7, 0], [8, 9]]
    assert out[K.INPUT_IDS].tolist() == [[0, 5, 7, 0], [0, 6, 8, 9]]
    assert out[K.LABELS] == ["x", "y"]
