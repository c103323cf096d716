"""Activation recompute (MindSpeed-LLM / Megatron keys) changes memory, not maths: one policy
update with full (uniform, block) or selective recompute leaves the same weights (SGD: the same
gradients) and losses as without, within 1e-6; and full recompute holds fewer activations
between forward and backward (measured with autograd's saved-tensor hooks)."""
import pytest
import torch

from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
from mindspeed_rl.models.parallel import parallel_config_kwargs
from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

from test_train_step import ARGS, P, make_batch

ARGS4 = dict(ARGS, num_layers=4)


def _update(recompute: dict, state=None):
    init_parallel_state(1, 1, seed=7)
    model = build_gpt_model(ARGS4, config_overrides=parallel_config_kwargs(**recompute))
    if state is not None:
        model.load_state_dict(state, strict=False)
    state = {k: v.clone() for k, v in model.state_dict().items() if v is not None}  # _extra_state: None
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=0.5, train_iters=10, clip_grad=1e9, optimizer="sgd",
                                 use_distributed_optimizer=False)
    s = PolicyLossSettings(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, temperature=0.7)
    model.train()
    stats = policy_update_step(ddp, opt, sched, make_batch(), P, 2, s)
    return model, stats, state


@pytest.mark.parametrize("recompute", [
    dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
    dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=3),
    dict(recompute_granularity="selective"),
])
def test_recompute_leaves_losses_and_gradients_unchanged(gloo_world1, recompute):
    plain, plain_stats, state = _update({})
    model, stats, _ = _update(recompute, state)
    config = model.config
    assert config.recompute_granularity == recompute["recompute_granularity"]
    assert config.recompute_method == recompute.get("recompute_method")
    worst = max((p.detach() - dict(plain.named_parameters())[n].detach()).abs().max().item()
                for n, p in model.named_parameters())
    assert worst <= 1e-6, worst
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert abs(stats[key] - plain_stats[key]) <= 1e-6, (key, stats[key], plain_stats[key])


def test_full_recompute_holds_fewer_activations(gloo_world1):
    """Bytes autograd keeps from forward to backward: with full recompute only each checkpointed
    group's input (and the head's tensors), without it every layer's intermediates."""
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask

    def held(recompute):
        init_parallel_state(1, 1, seed=7)
        model = build_gpt_model(ARGS4, config_overrides=parallel_config_kwargs(**recompute)).train()
        b = make_batch()
        total = []

        def pack(t):
            total.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = model(b["input_ids"], position_ids_from_mask(b["attention_mask"]),
                           attention_mask_4d(b["attention_mask"]))
        logits.float().logsumexp(-1).sum().backward()
        return sum(total)

    none = held({})
    full = held(dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1))
    assert full < 0.5 * none, (full, none)
