"""freeze_parameters (models/freeze.py): the frozen parameters get no gradient buffer and no optimizer state and keep
their values through Adam steps with weight decay; the others train exactly as without freezing. Patterns are
checked against the model's names before any worker starts (test_broken_configs holds the sentences)."""
import pytest
import torch

from testing_utils import HF_VARIANTS, make_tiny_hf
from test_train_step import P, make_batch

from mindspeed_rl.models.freeze import freeze, matches, patterns_problem


def _train(args, hf_dir, patterns, steps=1, optimizer="adam"):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.checkpoint import chunk_state_dict
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    init_parallel_state(1, 1, seed=7)
    model = build_gpt_model(args)
    load_hf_checkpoint(model, hf_dir, args)
    before = {k: v.clone() for k, v in chunk_state_dict(model).items()}
    frozen = freeze([model], patterns)
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    # (no clipping: the global gradient norm would count the frozen ones' gradients without freezing)
    opt, sched = build_optimizer([ddp], lr=1e-2, train_iters=4, clip_grad=1e9, weight_decay=0.1,
                                 use_distributed_optimizer=False, optimizer=optimizer)
    s = PolicyLossSettings(temperature=0.7, vocab_size=120)
    for step in range(steps):
        batch = make_batch(step)
        batch["input_ids"] = batch["input_ids"] % 120
        policy_update_step(ddp, opt, sched, batch, P, 2, s)
    states = {id(p) for o in getattr(opt, "chained_optimizers", [opt]) for p in o.optimizer.state}
    named = dict(model.named_parameters())
    return frozen, before, chunk_state_dict(model), {n for n, p in named.items() if id(p) in states}, \
        {n for n, p in named.items() if hasattr(p, "main_grad")}


def test_frozen_parameters_keep_their_values_and_the_rest_trains_as_before(gloo_world1, tmp_path):
    """Gemma 4 E2B's layout (gemma4_text-ple): its per-layer table frozen, every decoder layer's MLP too (a pattern with
    a wildcard over layers) and the word embedding, tied to the output layer. Adam with weight decay leaves the frozen
    ones as they were; SGD (its step is the gradient) moves the others as it does without freezing."""
    from mindspeed_rl.models.builder import model_config_from_hf
    from mindspeed_rl.models.hf_bridge import read_hf_config

    make_tiny_hf("gemma4_text", str(tmp_path), **HF_VARIANTS["gemma4_text-ple"])
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    patterns = ["embedding.per_layer.embeddings.weight", "decoder.layers.*.mlp.linear_fc?.weight",
                "embedding.word_embeddings.weight"]
    frozen, before, after, with_state, with_grad = _train(args, str(tmp_path), patterns)
    assert frozen == 1 + 2 * 4 + 1 and "output_layer.weight" not in after
    names = [n for n in after if matches(n, patterns)]
    assert len(names) == frozen
    for n in names:
        assert torch.equal(after[n], before[n]), n
    assert not set(names) & with_state and not set(names) & with_grad
    # a frozen parameter changes nothing upstream of its own update, so the others' gradients are the ones they have
    # without freezing (up to fp32 rounding: a frozen output layer's input gradient is another kernel's; Adam's
    # normalized step would magnify that where a gradient is near 0, SGD's does not)
    _, _, sgd, _, _ = _train(args, str(tmp_path), patterns, optimizer="sgd")
    _, _, plain, _, _ = _train(args, str(tmp_path), [], optimizer="sgd")
    trained = [n for n in after if n not in names]
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in trained
    for n in trained:
        step, plain_step = sgd[n] - before[n], plain[n] - before[n]
        torch.testing.assert_close(step, plain_step, rtol=0, atol=1e-6 * before[n].abs().max().item() + 1e-5 * plain_step.abs().max().item(), msg=n)
        assert not torch.equal(after[n], before[n]) or n.endswith("layer_scalar"), n
    for n in names:
        assert torch.equal(sgd[n], before[n]) and not torch.equal(plain[n], before[n]), n  # (SGD would move them)


def test_patterns_are_checked_against_the_names():
    names = ["embedding.word_embeddings.weight", "decoder.layers.0.self_attention.linear_qkv.weight",
             "decoder.final_layernorm.weight"]
    assert patterns_problem(["embedding.*", "decoder.layers.0.*"], names) is None
    err = patterns_problem(["embedding.per_layer.*"], names, "actor.freeze_parameters")
    assert err.startswith("`actor.freeze_parameters`: 'embedding.per_layer.*' matches no parameter") and \
        "embedding.word_embeddings.weight" in err
    assert "freezes every parameter" in patterns_problem(["*"], names)
    assert "must be a list of parameter-name patterns" in patterns_problem("embedding.*", names)
    assert patterns_problem(["decoder.*"], names) is None


@pytest.mark.parametrize("distributed", [True, False])
def test_a_run_with_frozen_parameters_resumes_exactly(gloo_world1, tmp_path, distributed):
    """Saved with frozen parameters and resumed with the same patterns: the step after resuming equals the step
    without the break (weights bit for bit, frozen ones from the checkpoint's weights); resumed with fewer frozen, the
    parameter with no saved optimizer state is named with the reason and the way out."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from mindspeed_rl.utils.errors import UserInputError
    from test_checkpoint import ARGS

    patterns = ["embedding.word_embeddings.weight", "decoder.layers.1.*"]

    def trained(seed, frozen):
        init_parallel_state(1, 1, seed=seed)
        model = build_gpt_model(ARGS)
        freeze([model], frozen)
        ddp = wrap_ddp(model, use_distributed_optimizer=distributed)
        opt, sched = build_optimizer([ddp], lr=1e-2, train_iters=10, weight_decay=0.1,
                                     use_distributed_optimizer=distributed)
        return ddp, opt, sched

    def step(ddp, opt, sched, seed):
        policy_update_step(ddp, opt, sched, make_batch(seed), P, 2, PolicyLossSettings())

    ddp, opt, sched = trained(7, patterns)
    initial = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}
    for i in range(2):
        step(ddp, opt, sched, i)
    save_checkpoint(str(tmp_path), 2, ddp, ARGS, opt, sched, vocab_size=37)
    step(ddp, opt, sched, 2)
    after = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}
    frozen = [n for n in after if matches(n, patterns)]
    assert frozen and all(torch.equal(after[n], initial[n]) for n in frozen)

    ddp2, opt2, sched2 = trained(99, patterns)  # another init: the frozen weights too must come from disk
    assert load_checkpoint(str(tmp_path), ddp2, ARGS, opt2, sched2) == 2
    step(ddp2, opt2, sched2, 2)
    for n, p in ddp2.module.named_parameters():
        assert torch.equal(p.detach(), after[n]), n

    ddp3, opt3, sched3 = trained(99, patterns[:1])
    with pytest.raises(UserInputError, match=r"holds no optimizer state for decoder\.layers\.1\..*its run froze "
                                             r"decoder\.layers\.1\..*\(freeze_parameters\).*start from its weights"):
        load_checkpoint(str(tmp_path), ddp3, ARGS, opt3, sched3)


def test_frozen_tp_partial_parameters_are_not_summed_over_tp():
    """Apertus's xIELU scalars hold a part of their gradient per TP rank (models/xielu.py); a frozen one has no
    gradient to sum, so it is left out of that list."""
    from mindspeed_rl.models.xielu import tp_partial_grads

    chunk = torch.nn.Module()
    chunk.alpha_p, chunk.alpha_n = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    for p in (chunk.alpha_p, chunk.alpha_n):
        p.tp_partial_grad = True
    chunk.alpha_n.requires_grad_(False)
    assert tp_partial_grads([chunk]) == [chunk.alpha_p]
