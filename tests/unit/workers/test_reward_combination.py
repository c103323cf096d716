"""workers.reward: rule verifiers + reward model, combined per sequence with hand-worked numbers;
the reward model is started before the rules run (so the two overlap) and its scores are reported."""
import pytest
import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.workers.reward import Reward, RuleRewardScorer, combine_scores


def tiny_batch():
    """Four tiny-task responses (token id of digit d is d + 1, <eos> is 0) to "7x3=" / "2x2="."""
    responses = torch.tensor([[8, 8, 8, 0], [8, 8, 0, 0], [3, 3, 0, 0], [5, 3, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    return {K.RESPONSES: responses, K.RESPONSE_MASK: mask, K.LABELS: ["777", "777", "22", "22"],
            K.FINISH_REASON: ["eos", "eos", "eos", "length"]}


class FakeRewardModel:
    """compute_rm_score_async records when it was started; get() records when it was read."""

    def __init__(self, scores, log):
        self.scores, self.log = scores, log

    def compute_rm_score_async(self, batch):
        self.log.append("rm started")
        rm = self

        class Pending:
            def get(self):
                rm.log.append("rm read")
                return rm.scores

        return Pending()


class LoggingRules(RuleRewardScorer):
    def __init__(self, log, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = log

    def compute_scores(self, batch):
        self.log.append("rules")
        return super().compute_scores(batch)


@pytest.fixture(scope="module")
def tokenizer():
    from mindspeed_rl.data import tiny_task
    from mindspeed_rl.data.tokenizer import load_tokenizer

    return load_tokenizer(tiny_task.TOKENIZER_DIR)


def test_combine_scores_by_hand():
    rules, rm = torch.tensor([1.0, 0.5, 0.0]), torch.tensor([2.0, -4.0, 0.25])
    assert torch.equal(combine_scores(rules, rm, 0.5), torch.tensor([2.0, -1.5, 0.125]))
    assert torch.equal(combine_scores(rules, None, 0.5), rules)
    assert torch.equal(combine_scores(None, rm, 2.0), torch.tensor([4.0, -8.0, 0.5]))
    assert combine_scores(None, rm.double(), 1.0).dtype == torch.float32
    with pytest.raises(ValueError, match="shape"):
        combine_scores(rules, rm[:2], 1.0)
    with pytest.raises(ValueError):
        combine_scores(None, None, 1.0)


def test_rules_and_reward_model_overlap_and_add(tokenizer):
    # tiny_repeat: "777" -> 1, "77" vs "777" -> 2/3, "22" -> 1, "4222" vs "22" -> 1 match / 4 positions;
    # weight 2; missing_eos_penalty 0.5 on the 4th row (cut at the length limit); rm weight 0.25
    log = []
    rules = LoggingRules(log, tokenizer, ["tiny_repeat"], [2.0], missing_eos_penalty=0.5)
    rm = FakeRewardModel(torch.tensor([0.5, -1.0, 3.0, 0.0]), log)
    scores, metrics = Reward(rules, rm, reward_model_weight=0.25).compute_scores(tiny_batch())
    expected = torch.tensor([2 * 1.0 + 0.125, 2 * 2 / 3 - 0.25, 2 * 1.0 + 0.75, 2 * 0.25 - 0.5 + 0.0])
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-6)
    assert log == ["rm started", "rules", "rm read"]  # the model scores while the rules run
    assert metrics["reward/rm_score/mean"] == pytest.approx(0.625)
    assert metrics["reward/rm_score/max"] == 3.0 and metrics["reward/rm_score/min"] == -1.0
    assert metrics["reward/tiny_repeat/mean"] == pytest.approx((1 + 2 / 3 + 1 + 0.25) / 4)
    assert metrics["reward/missing_eos"] == 1


def test_reward_model_alone_gets_the_missing_eos_penalty():
    log = []
    rm = FakeRewardModel(torch.tensor([0.5, -1.0, 3.0, 0.0]), log)
    scores, metrics = Reward(None, rm, reward_model_weight=2.0, missing_eos_penalty=0.5).compute_scores(tiny_batch())
    assert torch.equal(scores, torch.tensor([1.0, -2.0, 6.0, -0.5]))
    assert metrics["reward/missing_eos"] == 1 and metrics["reward/rm_score/mean"] == pytest.approx(0.625)
    assert not any(k.startswith("reward/tiny") for k in metrics)


def test_rules_alone_are_the_rule_scorer(tokenizer):
    rules = RuleRewardScorer(tokenizer, ["tiny_repeat"], [1.0], missing_eos_penalty=0.5)
    scores, metrics = Reward(rules).compute_scores(tiny_batch())
    direct, direct_metrics = rules.compute_scores(tiny_batch())
    assert torch.equal(scores, direct) and metrics == direct_metrics
    assert "reward/rm_score/mean" not in metrics
    with pytest.raises(ValueError, match="rule verifiers, a reward model or both"):
        Reward(None, None)
