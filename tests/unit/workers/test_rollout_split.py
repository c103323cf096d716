"""ray_gpt's train/infer split without Ray: which ranks train and which generate, where each call
goes, when weights move, and the HF-named weight stream (names, values, buckets) at TP=1."""
import pytest
import torch

from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.data import keys as K
from mindspeed_rl.distributed.plan import make_plan
from mindspeed_rl.distributed.worker_group import DPLayout
from mindspeed_rl.trainer.roles import ActorFacade, RolloutFacade, job_placement, logp_diff_metrics
from testing_utils import FakeGroup

A = "actor_rollout_ref.actor_rollout"


def actor_plan(name, *overrides):
    return {p.role: p for p in make_plan(build_config(compose_yaml(name, list(overrides)), "t"))}["actor_rollout"]


def test_job_placement_tiny_split():
    p = actor_plan("grpo_trainer_tiny", "resource_pool.actor_rollout=[2]", f"{A}.num_gpus_for_train=1",
                   f"{A}.num_gpus_for_infer=1")
    train, gen = job_placement(p, "train"), job_placement(p, "generate")
    assert [(r.rank, r.node, r.local) for r in train.ranks] == [(0, 0, 0)]
    assert [(r.rank, r.node, r.local) for r in gen.ranks] == [(0, 0, 1)]  # its own world, the pool's 2nd device
    assert (gen.tp, gen.pp, gen.dp) == (1, 1, 1) and p.world_size == 2


def test_job_placement_qwen25_7b_two_nodes():
    """train 8 on node 0 (TP2 PP2 DP2), generate 6 on node 1 at the actor's TP: TP2 x DP3, no PP."""
    p = actor_plan("grpo_trainer_qwen25_7b")
    train, gen = job_placement(p, "train"), job_placement(p, "generate")
    assert [(r.node, r.local) for r in train.ranks] == [(0, i) for i in range(8)]
    assert [(r.rank, r.node, r.local) for r in gen.ranks] == [(i, 1, i) for i in range(6)]
    assert (train.tp, train.pp, train.dp) == (2, 2, 2) and (gen.tp, gen.pp, gen.dp) == (2, 1, 3)


def test_logp_diff_metrics_only_count_response_tokens():
    train = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]])
    rollout = torch.tensor([[-1.0, -2.5, -3.0], [-0.25, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the 9.0 sits on padding
    m = logp_diff_metrics(train, rollout, mask)
    assert m == {"rollout/logp_diff_max": 0.5, "rollout/logp_diff_mean": pytest.approx(0.75 / 5)}
    assert logp_diff_metrics(train, rollout, torch.zeros(2, 3)) == {}


def split_actor(log):
    train = FakeGroup("train", log, {
        "export_weights_for_rollout": lambda: ["ref"],
        "compute_log_prob": lambda b: torch.tensor([[-1.0, -2.0]]),
        "update_actor": lambda b: {"actor/pg_loss": [0.5, 1.5]}})
    gen = FakeGroup("gen", log, {
        "update_weights": lambda refs, timeout: 7,
        "generate_sequences": lambda prompts, n, greedy: {"n": n, "greedy": greedy}})
    return ActorFacade(train, DPLayout.pure(1), rollout=RolloutFacade(gen, DPLayout.pure(1)))


def test_split_calls_go_to_their_group_and_weights_move_only_after_updates():
    log = []
    actor = split_actor(log)
    actor.sync_rollout_weights()  # first step: the generation ranks have no weights yet
    assert log == [("train", "export_weights_for_rollout"), ("gen", "update_weights")]
    actor.sync_rollout_weights()  # nothing changed since: no second transfer
    assert actor.generate_sequences({K.PROMPT_IDS: torch.zeros(2, 3)}, 4) == {"n": 4, "greedy": False}
    assert log[2:] == [("gen", "generate_sequences")]
    batch = {K.PROMPT_IDS: 0, K.INPUT_IDS: 0, K.ATTENTION_MASK: 0, K.RESPONSES: 0,
             K.RESPONSE_MASK: torch.tensor([[1, 1]]), K.ROLLOUT_LOG_PROBS: torch.tensor([[-1.0, -2.25]])}
    actor.compute_log_prob(batch)
    stats = actor.update_actor({K.ADVANTAGES: 0})
    assert log[3:] == [("train", "compute_log_prob"), ("train", "update_actor")]
    assert stats["actor/pg_loss"] == 1.0 and stats["rollout/logp_diff_max"] == 0.25
    assert stats["timing/sync_weights"] >= 0.0
    # validation right after an update generates with the new weights: generate syncs first
    actor.generate_sequences({K.PROMPT_IDS: torch.zeros(1, 2)}, 1, greedy=True)
    assert log[5:] == [("train", "export_weights_for_rollout"), ("gen", "update_weights"),
                       ("gen", "generate_sequences")]
    assert "timing/sync_weights" in actor.update_actor({}) and "timing/sync_weights" not in actor.update_actor({})


def test_split_checkpoint_carries_the_generation_ranks_sampling_counter(tmp_path, monkeypatch):
    """Split-mode resume is bitwise only if the generation ranks continue their sampling seeds."""
    import json

    log, saved = [], {}
    gen_calls = {"calls": 5}
    actor = split_actor(log)
    actor.rollout.group.answers.update({
        "sampling_state": lambda: [dict(gen_calls), dict(gen_calls)],
        "load_sampling_state": lambda state: gen_calls.update(state)})

    def save(path, step, state, keep, h):
        saved.update(state)
        (tmp_path / "trainer_state.json").write_text(json.dumps(state))
        (tmp_path / "manifest.json").write_text("{}")
        return path
    actor.group.answers.update({"save_checkpoint": lambda *a: [save(*a)],
                                "load_checkpoint": lambda path: [{"step": 3}]})
    actor.save_checkpoint(str(tmp_path), 3, {"step": 3})
    assert saved == {"step": 3, "rollout": {"calls": 5}}
    gen_calls["calls"] = 0  # a fresh generation group after a restart
    from mindspeed_rl.models import checkpoint as ckpt
    monkeypatch.setattr(ckpt, "read_trainer_state", lambda path: json.loads((tmp_path / "trainer_state.json").read_text()))
    assert actor.load_checkpoint(str(tmp_path)) == {"step": 3}
    assert gen_calls == {"calls": 5} and actor.rollout.stale
    actor.rollout.group.answers["sampling_state"] = lambda: [{"calls": 1}, {"calls": 2}]
    with pytest.raises(RuntimeError, match="disagree"):
        actor.save_checkpoint(str(tmp_path), 4, {})


def test_colocated_actor_never_syncs():
    log = []
    train = FakeGroup("train", log, {"generate_sequences": lambda p, n, g: {"n": n},
                                     "update_actor": lambda b: {"actor/pg_loss": [2.0]}})
    actor = ActorFacade(train, DPLayout.pure(1))
    actor.sync_rollout_weights()
    actor.generate_sequences({K.PROMPT_IDS: torch.zeros(1, 2)}, 2)
    assert log == [("train", "generate_sequences")] and "timing/sync_weights" not in actor.update_actor({})


# ---------------------------------------------------------------------------------------------
# the HF-named weight stream of a live model (TP=1 here; TP=2 and the Ray path: tests/dist/workers)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_gathered_hf_tensors_are_the_hf_state_dict(arch, gloo_world1, tmp_path):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.rollout.weights import load_hf_tensors
    from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors, hf_buckets
    from testing_utils import make_tiny_hf

    hf = make_tiny_hf(arch, str(tmp_path))
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)  # HF vocab 120
    init_parallel_state(1, 1)
    model = build_gpt_model(args)
    load_hf_checkpoint(model, str(tmp_path), args)
    named = dict(gathered_hf_tensors(model, args))
    expected = {k: v for k, v in hf.state_dict().items() if not (k == "lm_head.weight" and arch == "qwen2")}
    assert sorted(named) == sorted(expected)  # qwen2 is tied: no lm_head; llama is not
    for name, tensor in expected.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            assert named[name].shape == (128, 64)  # padding rows travel too
            assert torch.equal(named[name][:120], tensor) and not named[name][120:].any()
        else:
            assert torch.equal(named[name], tensor), name
    # a second model (another seed) takes the stream, bucketed, and ends up equal
    sizes = [sum(t.numel() * t.element_size() for t in b.values()) for b in hf_buckets(named.items(), 0.05)]
    assert len(sizes) > 1 and all(s >= 0.05 * 2 ** 20 for s in sizes[:-1])
    init_parallel_state(1, 1, seed=99)
    other = build_gpt_model(args)
    assert not torch.equal(other.embedding.word_embeddings.weight, model.embedding.word_embeddings.weight)
    stream = (item for bucket in hf_buckets(named.items(), 0.05) for item in bucket.items())
    assert load_hf_tensors(other, stream, args) == len(model.state_dict()) - sum(
        k.endswith("_extra_state") for k in model.state_dict())
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        if not name.endswith("_extra_state"):
            assert torch.equal(a, b), name


def test_a_batch_that_does_not_split_over_dp_is_padded_then_trimmed():
    """A last validation batch of 3 prompts on 2 DP ranks: 4 go out, the 3 prompts' samples come back."""
    seen = []

    def generate(prompts, n, greedy):  # one call per DP rank
        seen.append(prompts)
        ids = prompts[K.PROMPT_IDS].repeat_interleave(n, 0)
        return {K.PROMPT_IDS: ids, K.RESPONSES: 10 * ids, K.LABELS: [str(int(i)) for i in ids]}

    actor = ActorFacade(FakeGroup("train", [], {"generate_sequences": generate}), DPLayout.pure(2))
    prompts = {K.PROMPT_IDS: torch.tensor([[1], [2], [3]]), K.LABELS: ["a", "b", "c"]}
    out = actor.generate_sequences(prompts, 2)
    assert [s[K.PROMPT_IDS].flatten().tolist() for s in seen] == [[1, 2], [3, 3]]
    assert [s[K.LABELS] for s in seen] == [["a", "b"], ["c", "c"]]
    assert out[K.RESPONSES].flatten().tolist() == [10, 10, 20, 20, 30, 30] and len(out[K.LABELS]) == 6
    assert actor.generate_sequences({K.PROMPT_IDS: torch.tensor([[1], [2]])}, 2)[K.RESPONSES].shape[0] == 4


def test_dp_ranks_responses_of_different_widths_are_joined_at_the_widest():
    """Each DP rank stops at its own longest response (and pads its prompts to its own longest):
    the facade joins them re-padded, as a plain torch.cat of (B, T1) and (B, T2) cannot."""
    from mindspeed_rl.data import keys as K
    from mindspeed_rl.distributed.worker_group import DPLayout
    from mindspeed_rl.trainer.roles import ActorFacade
    from testing_utils import FakeGroup

    def generate(prompts, n, greedy):  # rank 0 answers 1 token, rank 1 answers 3
        p = prompts[K.PROMPT_IDS]
        t = 1 if int(p[0, -1]) == 5 else 3
        resp = torch.full((len(p), t), 9)
        return {K.PROMPT_IDS: p, K.RESPONSES: resp, K.RESPONSE_MASK: torch.ones_like(resp),
                K.INPUT_IDS: torch.cat([p, resp], 1), K.FINISH_REASON: ["stop"] * len(p)}

    actor = ActorFacade(FakeGroup("actor", [], {"generate_sequences": generate}), DPLayout.pure(2))
    out = actor.generate_sequences({K.PROMPT_IDS: torch.tensor([[1, 5], [2, 6]])}, 1)
    assert out[K.RESPONSES].tolist() == [[9, 0, 0], [9, 9, 9]]
    assert out[K.RESPONSE_MASK].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert out[K.INPUT_IDS].tolist() == [[1, 5, 9, 0, 0], [2, 6, 9, 9, 9]]
    assert out[K.FINISH_REASON] == ["stop", "stop"]
