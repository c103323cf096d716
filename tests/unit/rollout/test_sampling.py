"""rollout.sampling and rollout.interface: filtering by hand-worked numbers, log-probs under the
full temperature-scaled distribution, seeded reproducibility, the empirical distribution of draws,
and SamplingParams' plain errors. Pure torch."""

import math

import pytest
import torch

from mindspeed_rl.rollout.interface import RolloutOutput, SamplingParams, prompts_from_batch
from mindspeed_rl.rollout.sampling import apply_top_k, apply_top_p, make_generator, sample_next_token
from mindspeed_rl.utils.errors import UserInputError

NEG = float("-inf")


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [5.0, 4.0, 3.0, 2.0]])
    assert apply_top_k(logits, 2).tolist() == [[NEG, 3.0, 2.0, NEG], [5.0, 4.0, NEG, NEG]]
    assert apply_top_k(logits, 0) is logits and apply_top_k(logits, 4) is logits


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.2, 0.25, 0.05]])  # sorted: 0.5, 0.25, 0.2, 0.05
    logits = probs.log()
    # mass before each sorted token: 0, 0.5, 0.75, 0.95 -> p=0.7 keeps {0.5, 0.25}; p=0.75 keeps the same
    assert torch.isfinite(apply_top_p(logits, 0.7)).tolist() == [[True, False, True, False]]
    assert torch.isfinite(apply_top_p(logits, 0.75)).tolist() == [[True, False, True, False]]
    assert torch.isfinite(apply_top_p(logits, 0.76)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(apply_top_p(logits, 0.01)).tolist() == [[True, False, False, False]]
    assert apply_top_p(logits, 1.0) is logits


def test_log_probs_are_under_the_full_tempered_distribution_not_the_filtered_one():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    full = torch.log_softmax(logits / 0.5, dim=-1)
    tok, lp = sample_next_token(logits, True, temperature=0.5, top_k=1, generator=make_generator(0, logits.device))
    assert tok.tolist() == [0]  # top_k=1 can only draw the argmax
    assert lp.item() == pytest.approx(full[0, 0].item(), abs=1e-7)  # not log(1) = 0
    tok, lp = sample_next_token(logits, False, temperature=2.0)
    assert tok.tolist() == [0]
    assert lp.item() == pytest.approx(torch.log_softmax(logits / 2.0, -1)[0, 0].item(), abs=1e-7)


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(3))
    a = sample_next_token(logits, True, 1.0, generator=make_generator(7, logits.device))[0]
    b = sample_next_token(logits, True, 1.0, generator=make_generator(7, logits.device))[0]
    c = sample_next_token(logits, True, 1.0, generator=make_generator(8, logits.device))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def _l1_bound(num_bins: int, n: int, fail_prob: float) -> float:
    """Bretagnolle-Huber-Carol: P(||p_hat - p||_1 >= lam) <= 2^V exp(-n lam^2 / 2)."""
    return math.sqrt(2.0 / n * (num_bins * math.log(2.0) + math.log(1.0 / fail_prob)))


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (4, 1.0), (0, 0.8)])
def test_empirical_distribution_matches_filtered_softmax(top_k, top_p):
    n, T = 40000, 0.7
    logits = torch.tensor([1.5, 1.0, 0.7, 0.2, 0.0, -0.3, -0.8, -1.2])
    tokens, _ = sample_next_token(logits.expand(n, -1), True, T, top_k, top_p,
                                  make_generator(123, logits.device))
    freq = torch.bincount(tokens, minlength=8).double() / n
    expected = torch.softmax(apply_top_p(apply_top_k(logits[None] / T, top_k), top_p), -1)[0].double()
    tol = _l1_bound(8, n, fail_prob=1e-9)  # ~0.052: a false failure has probability < 1e-9
    assert (freq - expected).abs().sum() < tol
    # the check has power: sampling at T=1 (or ignoring the filter) would be far outside it
    wrong = torch.softmax(logits.double(), -1) if (top_k, top_p) == (0, 1.0) else torch.softmax(logits.double() / T, -1)
    assert (freq - wrong).abs().sum() > 2 * tol


def test_sampling_params_plain_errors():
    with pytest.raises(UserInputError, match="n_samples_per_prompt"):
        SamplingParams(n=0)
    with pytest.raises(UserInputError, match="temperature .* do_sample"):
        SamplingParams(temperature=0.0)
    with pytest.raises(UserInputError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(UserInputError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(UserInputError, match="top_k"):
        SamplingParams(top_k=-1)
    with pytest.raises(UserInputError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    greedy = SamplingParams(do_sample=False, temperature=0.0)  # greedy needs no temperature
    assert greedy.logprob_temperature == 1.0
    assert SamplingParams(do_sample=False, temperature=0.7).logprob_temperature == 1.0
    assert SamplingParams(do_sample=True, temperature=0.7).logprob_temperature == 0.7


def test_from_ray_gpt_maps_the_rollout_keys():
    sp = SamplingParams.from_ray_gpt(n_samples_per_prompt=8, do_sample=True, temperature=0.9, top_p=0.95,
                                     top_k=50, max_new_tokens=64, seq_length=128, seed=5, stop_token_ids=[7])
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, sp.max_total_length, sp.seed,
            sp.stop_token_ids) == (8, 0.9, 0.95, 50, 64, 128, 5, (7,))


def test_prompts_from_batch_and_to_batch():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 1]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompts_from_batch(ids, mask) == [[5, 6], [7, 8, 9, 1]]
    out = RolloutOutput(prompts=ids, prompt_mask=mask, responses=torch.tensor([[3, 0], [4, 2]]),
                        response_mask=torch.tensor([[1, 0], [1, 1]]), log_probs=torch.zeros(2, 2),
                        finish_reason=["eos", "length"], prompt_length=torch.tensor([2, 4]),
                        response_length=torch.tensor([1, 2]))
    batch = out.to_batch()
    assert batch["input_ids"].tolist() == [[0, 0, 5, 6, 3, 0], [7, 8, 9, 1, 4, 2]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]
    assert out.num_prompt_tokens == 6 and out.num_response_tokens == 3
