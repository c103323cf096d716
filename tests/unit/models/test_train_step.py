"""The policy update through Megatron (DDP, micro-batches, optimizer) takes exactly the gradient of
the mini-batch loss computed directly with autograd, whatever the micro-batch size."""
import pytest
import torch

from mindspeed_rl import algorithms as alg
from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step, response_log_probs

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=8, padded_vocab_size=40, max_position_embeddings=32,
            add_qkv_bias=True, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)
P, T, B = 3, 4, 4


def make_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (B, P + T), generator=g)
    attn = torch.ones(B, P + T, dtype=torch.long)
    attn[0, 0] = 0  # a left-padded prompt
    rmask = torch.ones(B, T)
    rmask[1, 2:] = 0  # a short response (right padding)
    attn[1, P + 2:] = 0
    return {"input_ids": ids, "attention_mask": attn, "response_mask": rmask,
            "advantages": torch.randn(B, T, generator=g) * rmask,
            "old_log_probs": -3.7 + 0.1 * torch.randn(B, T, generator=g),
            "ref_log_probs": -3.7 + 0.1 * torch.randn(B, T, generator=g)}


@pytest.mark.parametrize("mode,micro", [("token-mean", 1), ("token-mean", 2), ("seq-mean-token-mean", 2),
                                        ("seq-mean-token-sum-norm", 4)])
def test_update_equals_direct_gradient(gloo_world1, mode, micro):
    init_parallel_state(1, 1, seed=7)
    s = PolicyLossSettings(loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01,
                           temperature=0.7, clip_ratio_low=0.1, clip_ratio_high=0.1)
    model = build_gpt_model(ARGS)
    batch = make_batch()
    # direct: the whole mini-batch at once, plain autograd
    logits = model(batch["input_ids"], position_ids_from_mask(batch["attention_mask"]),
                   attention_mask_4d(batch["attention_mask"]))
    logp, ent = response_log_probs(logits, batch["input_ids"], P, s.temperature, None, with_entropy=True)
    rm = batch["response_mask"]
    loss = alg.policy_loss(logp, batch["old_log_probs"], batch["advantages"], rm, 0.1, 0.1, None, mode)[0]
    loss = loss + 0.1 * alg.aggregate_loss(alg.kl_penalty(logp, batch["ref_log_probs"], "low_var_kl"), rm, mode)
    loss = loss - 0.01 * alg.aggregate_loss(ent, rm, mode)
    loss.backward()
    lr = 0.5
    expected = {n: (p.detach() - lr * p.grad).clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    ddp = wrap_ddp(model, use_distributed_optimizer=False)  # megatron: the distributed optimizer is Adam-only
    opt, sched = build_optimizer([ddp], lr=lr, train_iters=10, clip_grad=1e9, optimizer="sgd",
                                 use_distributed_optimizer=False)
    stats = policy_update_step(ddp, opt, sched, batch, P, micro, s)
    worst = max((p.detach() - expected[n]).abs().max().item() for n, p in model.named_parameters())
    assert worst < 1e-6, worst
    assert abs(stats["actor/pg_loss"] + 0.1 * stats["actor/kl_loss"] - 0.01 * stats["actor/entropy"]
               - loss.item()) < 1e-5
    assert stats["actor/grad_norm"] > 0 and stats["actor/update_skipped"] == 0.0


def test_adam_distributed_optimizer_and_warmup(gloo_world1):
    init_parallel_state(1, 1, seed=7)
    ddp = wrap_ddp(build_gpt_model(ARGS), use_distributed_optimizer=True)
    opt, sched = build_optimizer([ddp], lr=1e-2, train_iters=4, lr_warmup_fraction=0.5, clip_grad=1.0)
    before = [p.detach().clone() for p in ddp.module.parameters()]
    lrs = [policy_update_step(ddp, opt, sched, make_batch(i), P, 2, PolicyLossSettings())["actor/lr"]
           for i in range(3)]
    assert lrs[0] == 0.0 and 0 < lrs[1] < lrs[2] == 1e-2  # linear warmup over 2 steps, then constant
    assert any((p.detach() - b).abs().max() > 0 for p, b in zip(ddp.module.parameters(), before))


@pytest.mark.parametrize("poison", ["advantages", "old_log_probs"])
def test_non_finite_loss_skips_the_update(gloo_world1, poison):
    """A NaN/inf anywhere in the loss leaves weights, optimizer state and lr schedule untouched."""
    init_parallel_state(1, 1, seed=7)
    ddp = wrap_ddp(build_gpt_model(ARGS), use_distributed_optimizer=True)
    opt, sched = build_optimizer([ddp], lr=1e-2, train_iters=4, clip_grad=1.0)
    policy_update_step(ddp, opt, sched, make_batch(0), P, 2, PolicyLossSettings())  # a good step first
    before = [p.detach().clone() for p in ddp.module.parameters()]
    steps_before = sched.num_steps
    batch = make_batch(1)
    batch[poison][2, 1] = float("nan")
    stats = policy_update_step(ddp, opt, sched, batch, P, 2, PolicyLossSettings())
    assert stats["actor/update_skipped"] == 1.0
    assert all(torch.equal(p.detach(), b) for p, b in zip(ddp.module.parameters(), before))
    assert sched.num_steps == steps_before
    good = policy_update_step(ddp, opt, sched, make_batch(2), P, 2, PolicyLossSettings())  # recovers
    assert good["actor/update_skipped"] == 0.0
    assert all(torch.isfinite(p).all() for p in ddp.module.parameters())


@pytest.mark.parametrize("tis_mode", ["token", "sequence"])
def test_tis_weighs_each_token_loss(gloo_world1, tis_mode):
    """TIS through the update: the gradient equals autograd of the policy loss with each token's
    loss multiplied by min(exp(old - rollout), cap), and its stats are reported."""
    init_parallel_state(1, 1, seed=7)
    s = PolicyLossSettings(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, tis_mode=tis_mode, tis_cap=1.5)
    model = build_gpt_model(ARGS)
    batch = make_batch(seed=1)
    g = torch.Generator().manual_seed(5)
    batch["rollout_log_probs"] = batch["old_log_probs"] + 0.3 * torch.randn(B, T, generator=g)
    logits = model(batch["input_ids"], position_ids_from_mask(batch["attention_mask"]),
                   attention_mask_4d(batch["attention_mask"]))
    logp, _ = response_log_probs(logits, batch["input_ids"], P, 1.0, None, with_entropy=False)
    rm = batch["response_mask"]
    w = alg.tis_weights(batch["old_log_probs"], batch["rollout_log_probs"], rm, tis_mode, 1.5)
    assert (w[rm > 0] != 1.0).all() and (w == 1.5).any()  # weights differ from 1 and some hit the cap
    ratio = torch.exp(logp - batch["old_log_probs"])
    adv = batch["advantages"]
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)
    loss = (per_token * w * rm).sum() / rm.sum()  # token-mean of the weighted token losses, by hand
    loss.backward()
    expected = {n: (p.detach() - 0.5 * p.grad).clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=0.5, train_iters=10, clip_grad=1e9, optimizer="sgd",
                                 use_distributed_optimizer=False)
    stats = policy_update_step(ddp, opt, sched, {k: v for k, v in batch.items() if k != "ref_log_probs"}, P, 2, s)
    worst = max((p.detach() - expected[n]).abs().max().item() for n, p in model.named_parameters())
    assert worst < 1e-6, worst
    assert abs(stats["actor/pg_loss"] - loss.item()) < 1e-5
    halves = [float((w[i:i + 2] * rm[i:i + 2]).sum() / rm[i:i + 2].sum()) for i in (0, 2)]  # micro-batch means
    assert stats["actor/tis_weight_mean"] == pytest.approx(sum(halves) / 2, abs=1e-5)


@pytest.mark.parametrize("mode,micro,zero_rows", [("token-mean", 1, [1, 3]), ("seq-mean-token-mean", 2, [0, 2]),
                                                   ("token-mean", 2, [2]), ("token-mean", 2, [0, 1, 2, 3])])
def test_zero_advantage_rows_are_not_run(gloo_world1, mode, micro, zero_rows):
    """With the policy loss as the only term, rows whose advantages are all 0 are left out of the
    forward/backward, and the update still takes exactly the gradient of the whole mini-batch's
    loss (whose denominator counts those rows). With a KL loss every row runs."""
    init_parallel_state(1, 1, seed=7)
    s = PolicyLossSettings(loss_agg_mode=mode, clip_ratio_low=0.1, clip_ratio_high=0.1)
    model = build_gpt_model(ARGS)
    batch = make_batch(seed=3)
    batch["advantages"][zero_rows] = 0.0
    logits = model(batch["input_ids"], position_ids_from_mask(batch["attention_mask"]),
                   attention_mask_4d(batch["attention_mask"]))
    logp, _ = response_log_probs(logits, batch["input_ids"], P, 1.0, None, with_entropy=False)
    loss = alg.policy_loss(logp, batch["old_log_probs"], batch["advantages"], batch["response_mask"],
                           0.1, 0.1, None, mode)[0]
    loss.backward()
    expected = {n: (p.detach() - 0.5 * p.grad).clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    seen = []
    model.embedding.register_forward_hook(  # rows that go through the model
        lambda m, args, kwargs, out: seen.append((args or [kwargs["input_ids"]])[0].shape[0]), with_kwargs=True)
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=0.5, train_iters=10, clip_grad=1e9, optimizer="sgd",
                                 use_distributed_optimizer=False)
    stats = policy_update_step(ddp, opt, sched, batch, P, micro, s)
    ran = max(1, B - len(zero_rows))  # at TP = PP = 1 the last micro-batch is just smaller; at least one row
    assert sum(seen) == ran and stats["actor/rows_not_run"] == B - ran
    worst = max((p.detach() - expected[n]).abs().max().item() for n, p in model.named_parameters())
    assert worst < 1e-6, worst
    assert abs(stats["actor/pg_loss"] - loss.item()) < 1e-6

    from mindspeed_rl.models.train_step import rows_to_run
    fixed = rows_to_run(batch, s, [ddp], 2, 1, free=False)  # under PP / SP / EP: whole micro-batches
    kept = [r for r in range(B) if r not in zero_rows]
    if len(zero_rows) >= 2:
        assert fixed.tolist() == (kept + list(zero_rows))[:max(2, len(kept))]
    else:
        assert fixed is None  # 3 rows matter: 2 whole micro-batches of 2 are all 4 rows

    seen.clear()  # a KL loss needs every row's log-probs: nothing is left out
    policy_update_step(ddp, opt, sched, batch, P, micro, PolicyLossSettings(loss_agg_mode=mode, use_kl_loss=True))
    assert sum(seen) == B


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_update_without_entropy_equals_log_softmax_gradient_with_clipping(gloo_world1, temperature):
    """Without an entropy term the update takes the log-probs from forward.token_log_probs (its own
    backward) and megatron clips through megatron_fixes' l2 norm and scale: the step must equal plain
    autograd through torch.log_softmax + gather, clipped to norm 0.5 by hand."""
    init_parallel_state(1, 1, seed=7)
    s = PolicyLossSettings(use_kl_loss=True, kl_loss_coef=0.1, temperature=temperature)
    model = build_gpt_model(ARGS)
    batch = make_batch(3)
    logits = model(batch["input_ids"], position_ids_from_mask(batch["attention_mask"]),
                   attention_mask_4d(batch["attention_mask"]))
    z = logits[:, P - 1: P - 1 + T].float() / temperature
    logp = torch.log_softmax(z, -1).gather(-1, batch["input_ids"][:, P:, None]).squeeze(-1)
    rm = batch["response_mask"]
    loss = alg.policy_loss(logp, batch["old_log_probs"], batch["advantages"], rm, 0.2, 0.2, None, "token-mean")[0]
    loss = loss + 0.1 * alg.aggregate_loss(alg.kl_penalty(logp, batch["ref_log_probs"], "low_var_kl"), rm,
                                           "token-mean")
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
    clip = min(1.0, 0.5 / (float(norm) + 1e-6))
    assert clip < 1  # the clipping path runs
    lr = 0.5
    expected = {n: (p.detach() - lr * clip * p.grad).clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=lr, train_iters=10, clip_grad=0.5, optimizer="sgd",
                                 use_distributed_optimizer=False)
    stats = policy_update_step(ddp, opt, sched, batch, P, 2, s)
    worst = max((p.detach() - expected[n]).abs().max().item() for n, p in model.named_parameters())
    assert worst < 1e-6, worst
    assert abs(stats["actor/grad_norm"] - float(norm)) < 1e-5 * float(norm)
