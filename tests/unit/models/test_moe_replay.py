"""MoE routing replay mechanics (models/moe_replay.py) on one process: forced experts are the ones
used, gates are megatron's, the router keeps its gradient, unrecorded tokens route by themselves,
and replaying the model's own routing changes nothing."""
import pytest
import torch

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, padded_vocab_size=40,
            max_position_embeddings=32, normalization="RMSNorm", swiglu=True, disable_bias_linear=True,
            num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=16)


def _model(**extra):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state

    init_parallel_state(1, 1)
    torch.manual_seed(0)
    return build_gpt_model(dict(ARGS, **extra))


def _inputs(b=2, s=6):
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask

    g = torch.Generator().manual_seed(3)
    ids, mask = torch.randint(0, 40, (b, s), generator=g), torch.ones(b, s, dtype=torch.long)
    return ids, position_ids_from_mask(mask), attention_mask_4d(mask)


def _record(model, ids, pos, mask):
    """The model's own routing as the rollout would record it: (b, s, L, k)."""
    from mindspeed_rl.models.moe_replay import RoutingRecorder

    rec = RoutingRecorder(model, ids.shape[0], ids.shape[1])
    rec.at(torch.arange(ids.shape[0]), 0)
    with rec, torch.no_grad():
        model(ids, pos, mask)
    return rec.result(torch.ones(ids.shape, dtype=torch.long))


def _router_outputs(model):
    """Captures (probs, routing_map) of every router call, layer by layer."""
    from mindspeed_rl.models.moe_replay import moe_routers

    seen = []
    handles = [r.register_forward_hook(lambda m, i, o: seen.append((o[0].detach(), o[1])))
               for _, r in moe_routers(model)]
    return seen, handles


@pytest.mark.parametrize("pre_softmax", [False, True])
def test_replayed_gates_equal_megatrons_when_the_choice_is_the_routers_own(gloo_world1, pre_softmax):
    from megatron.core.transformer.moe import moe_utils

    from mindspeed_rl.models.moe_replay import replayed_routing

    logits = torch.randn(10, 4, generator=torch.Generator().manual_seed(1))
    fn = getattr(moe_utils, "topk_routing_with_score_function", None) or moe_utils.topk_softmax_with_capacity
    ref_probs, ref_map = fn(logits, 2, use_pre_softmax=pre_softmax)[:2]
    own = torch.topk(torch.softmax(logits, -1) if pre_softmax else logits, 2, dim=1).indices.sort(1).values
    probs, routing_map = replayed_routing(logits, own, 2, use_pre_softmax=pre_softmax)
    assert torch.equal(routing_map, ref_map)
    torch.testing.assert_close(probs, ref_probs, rtol=0, atol=1e-7)
    # another choice: exactly those experts, gates renormalised over them (or the softmax's entries)
    forced = torch.tensor([[0, 3]] * 10)
    probs, routing_map = replayed_routing(logits, forced, 2, use_pre_softmax=pre_softmax)
    assert routing_map.nonzero()[:, 1].view(10, 2).tolist() == forced.tolist()
    want = torch.softmax(logits, -1)[:, [0, 3]] if pre_softmax else torch.softmax(logits[:, [0, 3]], -1)
    torch.testing.assert_close(probs[:, [0, 3]], want)
    assert (probs[:, [1, 2]] == 0).all()


def test_forced_experts_are_used_and_the_router_keeps_its_gradient(gloo_world1):
    from mindspeed_rl.models.moe_replay import moe_routers, replay_routing

    model = _model()
    ids, pos, mask = _inputs()
    b, s = ids.shape
    forced = torch.zeros(b, s, 2, 2, dtype=torch.int16)
    forced[..., 0], forced[..., 1] = 1, 3  # every token of both layers to experts 1 and 3
    forced[1, 4:] = -1  # not recorded: these tokens route by themselves
    seen, handles = _router_outputs(model)
    with replay_routing(model, forced):
        out = model(ids, pos, mask)
    for h in handles:
        h.remove()
    assert len(seen) == 2
    for probs, routing_map in seen:  # token order of the router: (s, b) flattened
        used = routing_map.view(s, b, 4)
        assert used[:, 0].nonzero()[:, 1].view(s, 2).tolist() == [[1, 3]] * s
        assert used[:4, 1].nonzero()[:, 1].view(4, 2).tolist() == [[1, 3]] * 4
        assert used[4:, 1].sum(-1).tolist() == [2, 2]  # own top-2 for the unrecorded tokens
        torch.testing.assert_close(probs.view(s, b, 4).sum(-1), torch.ones(s, b))  # renormalised top-k
    out.float().sum().backward()
    for _, router in moe_routers(model):
        grad = router.weight.grad
        assert grad is not None and grad.abs().sum() > 0
        assert grad[[1, 3]].abs().sum() > 0  # the replayed experts' logits get gradient through the gates
    # the patch is scoped: outside the block the routers choose again
    seen, handles = _router_outputs(model)
    with torch.no_grad():
        model(ids, pos, mask)
    for h in handles:
        h.remove()
    assert not all(bool((m.view(s, b, 4)[..., [1, 3]].sum(-1) == 2).all()) for _, m in seen)


def test_replaying_the_models_own_routing_changes_nothing_and_a_changed_model_routes_as_recorded(gloo_world1):
    from mindspeed_rl.models.forward import attention_mask_4d, compute_log_probs, position_ids_from_mask
    from mindspeed_rl.models.moe_replay import moe_routers

    model = _model().eval()
    ids, pos, mask = _inputs(b=4, s=7)
    attn = torch.ones(ids.shape, dtype=torch.long)
    attn[0, :2] = 0  # left padding: trimmed and sorted micro-batches must carry the routing along
    routed = _record(model, ids, position_ids_from_mask(attn), attention_mask_4d(attn))
    assert routed.shape == (4, 7, 2, 2) and routed.dtype == torch.int16 and (routed >= 0).all()
    with torch.no_grad():
        own, _ = compute_log_probs(model, ids, attn, 1)
        replayed, _ = compute_log_probs(model, ids, attn, 1, routed_experts=routed)
    real = (attn[:, 1:] * attn[:, :-1]).bool()
    assert torch.equal(own[real], replayed[real])
    with torch.no_grad():  # another router: its own routing differs, the replayed one is the recorded one
        for _, router in moe_routers(model):
            router.weight.add_(torch.randn_like(router.weight))
    seen, handles = _router_outputs(model)
    with torch.no_grad():
        moved, _ = compute_log_probs(model, ids, torch.ones_like(attn), 4, routed_experts=routed)
    for h in handles:
        h.remove()
    for layer, (_, routing_map) in enumerate(seen):
        got = routing_map.view(7, 4, 4).transpose(0, 1).int().topk(2, -1).indices.sort(-1).values
        assert torch.equal(got, routed[:, :, layer].long())
    assert _record(model, ids, pos, mask).ne(routed).any()  # the changed router would route otherwise
    assert moved.isfinite().all()


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_native_engine_records_the_routing_of_every_token_it_ran(gloo_world1, use_kv_cache):
    """The rollout's routing equals a full forward's over the generated sequences at every real token
    but each response's last (never run); padding is -1; batches of different widths join padded."""
    from mindspeed_rl.data import keys as K
    from mindspeed_rl.data.batches import concat_rollouts
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    model = _model().eval()
    engine = NativeEngine(model, vocab_size=40, max_length=16, eos_token_ids=(5,), use_kv_cache=use_kv_cache,
                          max_batch_size=2, record_routing=True)
    out = engine.generate([[3, 4, 9], [7, 1], [2, 8, 6, 11, 12]], SamplingParams(n=1, do_sample=True, seed=4,
                                                                                max_new_tokens=6))
    batch = out.to_batch()
    ids, attn, routed = batch[K.INPUT_IDS], batch[K.ATTENTION_MASK], batch[K.ROUTED_EXPERTS]
    assert routed.shape == (*ids.shape, 2, 2)
    full = _record(model, ids, position_ids_from_mask(attn), attention_mask_4d(attn))
    P = batch[K.PROMPT_IDS].shape[1]
    last = P + batch[K.RESPONSE_LENGTH] - 1  # (B,) the last response token of each row
    ran = attn.bool().clone()
    ran[torch.arange(len(last)), last] = False
    assert torch.equal(routed[ran], full[ran])
    assert (routed[~attn.bool()] == -1).all()
    # two rollouts of other widths join like input_ids: -1 where the other is padded
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    cut = {K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS, K.ROUTED_EXPERTS, K.RESPONSES, K.RESPONSE_MASK,
           K.ROLLOUT_LOG_PROBS}  # one response column less
    small = {k: v[:1, :-1] if k in cut else v[:1] for k, v in tensors.items()}
    joined = concat_rollouts([tensors, small])
    assert joined[K.ROUTED_EXPERTS].shape == (4, ids.shape[1], 2, 2)
    assert torch.equal(joined[K.ROUTED_EXPERTS][3, :-1], routed[0, :-1])
    assert (joined[K.ROUTED_EXPERTS][3, -1] == -1).all()


def test_the_policy_update_replays_the_routing_through_sorted_trimmed_micro_batches(gloo_world1):
    """policy_update_step with routed_experts takes exactly the gradient of the direct forward under
    the same forced routing (rows sorted by length and trimmed per micro-batch carry their routing)."""
    from mindspeed_rl import algorithms as alg
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
    from mindspeed_rl.models.moe_replay import replay_routing
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step, response_log_probs

    P, T, B = 3, 4, 4
    model = _model()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 40, (B, P + T), generator=g)
    attn = torch.ones(B, P + T, dtype=torch.long)
    attn[0, :2] = 0  # left padding: row 0 is the shortest, so sorting moves it
    attn[1, P + 2:] = 0
    rmask = attn[:, P:].float()
    forced = torch.randint(0, 4, (B, P + T, 2, 1), generator=g).to(torch.int16)
    forced = torch.cat([forced, (forced + 1 + torch.randint(0, 3, forced.shape, generator=g).to(torch.int16)) % 4], -1)
    forced[2, -1] = -1  # a token not recorded routes by itself
    batch = {"input_ids": ids, "attention_mask": attn, "response_mask": rmask, "routed_experts": forced,
             "advantages": torch.randn(B, T, generator=g) * rmask}
    s = PolicyLossSettings()
    with replay_routing(model, forced):
        logits = model(ids, position_ids_from_mask(attn), attention_mask_4d(attn))
    logp, _ = response_log_probs(logits, ids, P, 1.0, None, with_entropy=False)
    loss = alg.policy_loss(logp, logp.detach(), batch["advantages"], rmask, 0.2, 0.2, None, "token-mean")[0]
    loss.backward()
    lr = 0.5
    expected = {n: (p.detach() - lr * p.grad).clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=lr, train_iters=10, clip_grad=1e9, optimizer="sgd",
                                 use_distributed_optimizer=False)
    policy_update_step(ddp, opt, sched, batch, P, 1, s)
    worst = max((p.detach() - expected[n]).abs().max().item() for n, p in model.named_parameters())
    assert worst < 1e-6, worst
    assert any(n.endswith("router.weight") for n in expected)
