"""The colocated reference held inside the actor worker (issue 15): when it applies, that its
log-probs come back with the generated batch (one call, no extra round trip), that it starts from the
actor's initial weights without disturbing the actor's RNG, and the worker-side phase timings."""
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.distributed.worker_group import DPLayout
from mindspeed_rl.trainer.grpo import outside_workers
from mindspeed_rl.trainer.roles import ActorFacade, ActorReferenceFacade
from mindspeed_rl.workers.actor import ActorRolloutWorker, reference_in_actor
from testing_utils import FakeGroup


def cfg(ref_pool=(), tp=(1, 1), pp=(1, 1), infer=0, vpp=(None, None), ep=(1, 1), sp=(False, False)):
    from mindspeed_rl.config.schema import ParallelConfig

    def role(i):
        par = ParallelConfig(tensor_model_parallel_size=tp[i], pipeline_model_parallel_size=pp[i],
                             virtual_pipeline_model_parallel_size=vpp[i], expert_model_parallel_size=ep[i],
                             sequence_parallel=sp[i])
        return SimpleNamespace(parallel=par, arch=SimpleNamespace(num_layers=4), num_gpus_for_infer=infer)
    return SimpleNamespace(resource_pool=SimpleNamespace(ref=list(ref_pool)), actor=role(0), ref=role(1))


@pytest.mark.parametrize("kwargs,inside", [
    ({}, True),                              # colocated, same layout
    ({"ref_pool": [1]}, False),              # its own devices: its own worker group
    ({"tp": (2, 1)}, False),                 # one megatron parallel state per process
    ({"pp": (2, 2)}, True),
    ({"pp": (1, 2)}, False),
    ({"infer": 1}, False),                   # train/infer split
    ({"pp": (2, 2), "vpp": (2, 2)}, True),   # the reference is built as the same chunks
    ({"pp": (2, 2), "vpp": (2, None)}, False),
    ({"ep": (2, 1)}, False),
    ({"tp": (2, 2), "sp": (True, False)}, True),  # SP is the model's config, not the process's state
])
def test_when_the_reference_lives_in_the_actor(kwargs, inside):
    assert reference_in_actor(cfg(**kwargs)) is inside


def test_ref_log_probs_come_with_the_generated_batch_and_cost_no_extra_call():
    log = []
    ref = torch.tensor([[-0.5, -0.25]])
    group = FakeGroup("actor", log, {
        "generate_sequences": lambda p, n, greedy, *with_ref: {K.PROMPT_IDS: p[K.PROMPT_IDS],
                                                               **({K.REF_LOG_PROBS: ref} if with_ref else {})}})
    actor = ActorFacade(group, DPLayout.pure(1))
    actor.ref_with_generation = True
    batch = actor.generate_sequences({K.PROMPT_IDS: torch.zeros(1, 2)}, 1)
    assert torch.equal(ActorReferenceFacade(group, DPLayout.pure(1)).compute_ref_log_prob_async(batch).get(), ref)
    assert log == [("actor", "generate_sequences")]  # no compute_ref_log_prob call
    assert K.REF_LOG_PROBS not in actor.generate_sequences({K.PROMPT_IDS: torch.zeros(1, 2)}, 1, greedy=True)


def bare_worker():
    w = ActorRolloutWorker.__new__(ActorRolloutWorker)  # no Ray, no process group
    w.cfg = SimpleNamespace(run=SimpleNamespace(seed=1), ref=SimpleNamespace(micro_batch_size=2))
    w.device, w.model, w.engine, w.calls, w.ref_offload = torch.device("cpu"), torch.nn.Linear(1, 1), None, 0, False
    w._sampling = lambda n, greedy, seed: None
    w.rank_info = lambda: {"dp_rank": 0}
    return w


def test_the_worker_scores_its_samples_with_the_reference_and_times_each_phase(monkeypatch):
    import mindspeed_rl.rollout.interface as interface

    generated = {K.PROMPT_IDS: torch.ones(2, 1, dtype=torch.long), K.RESPONSES: torch.ones(2, 3, dtype=torch.long)}
    monkeypatch.setattr(interface, "generate_batch", lambda engine, prompts, n, params: dict(generated))
    w = bare_worker()
    w.ref_model = "the reference"
    seen = []
    w._response_log_probs = lambda model, batch, mbs=None: seen.append((model, mbs)) or torch.full((2, 3), -1.0)
    w._update_actor = lambda batch: {"actor/pg_loss": 0.5}
    out = w.generate_sequences({K.PROMPT_IDS: torch.ones(1, 1)}, 2, False, True)
    assert seen == [("the reference", 2)] and torch.equal(out[K.REF_LOG_PROBS], torch.full((2, 3), -1.0))
    stats = w.update_actor({})
    assert stats["actor/pg_loss"] == 0.5
    phases = ("gen", "ref", "update_actor")
    assert {k for k in stats if k.startswith(("timing/", "perf/"))} == {
        *(f"timing/{p}_worker" for p in phases), *(f"timing/{p}_worker_cpu" for p in phases),
        *(f"perf/{p}_minor_faults" for p in phases)}
    assert all(stats[k] >= 0 for k in stats)
    assert {k for k in w.update_actor({}) if k.startswith("timing/")} == {
        "timing/update_actor_worker", "timing/update_actor_worker_cpu"}  # drained


def test_without_the_reference_the_worker_says_so():
    w = bare_worker()
    w.ref_model = None
    with pytest.raises(RuntimeError, match="without the reference"):
        w.compute_ref_log_prob({K.INPUT_IDS: torch.ones(1, 2)})


def test_outside_workers_is_the_step_minus_what_the_workers_and_the_driver_timed():
    m = {"timing/step": 1.0, "timing/reward": 0.05, "timing/adv": 0.01, "timing/ref": 0.0,
         "timing/gen_worker": 0.5, "timing/ref_worker": 0.1, "timing/update_actor_worker": 0.3}
    assert outside_workers(m)["timing/outside_workers"] == pytest.approx(0.04)
    separate = {"timing/step": 1.0, "timing/ref": 0.2, "timing/gen_worker": 0.5, "timing/update_actor_worker": 0.25}
    assert outside_workers(separate)["timing/outside_workers"] == pytest.approx(0.05)  # its wait counts as work
    assert outside_workers({"timing/step": 1.0}) == {}


def test_the_reference_starts_from_the_actors_weights_and_leaves_the_rng_alone(gloo_world1):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state

    args = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, padded_vocab_size=40,
                max_position_embeddings=32, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)
    init_parallel_state(1, 1, seed=3)
    w = bare_worker()
    w.model, w.vocab_size = build_gpt_model(args), 40
    from mindspeed_rl.config.schema import ParallelConfig

    role = SimpleNamespace(params_dtype="fp32", load=None, parallel=ParallelConfig(), param_offload=None,
                           use_torch_compile=False)
    w.cfg = SimpleNamespace(run=SimpleNamespace(platform="cpu"), ref=role, actor=SimpleNamespace(load=None))
    import mindspeed_rl.workers.actor as actor

    original = actor.model_args
    actor.model_args = lambda role_cfg, vocab: dict(args)
    try:
        before = torch.get_rng_state()
        ref = w._build_reference()
        assert torch.equal(before, torch.get_rng_state())
    finally:
        actor.model_args = original
    for (name, a), b in zip(w.model.state_dict().items(), ref.state_dict().values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
    assert not any(p.requires_grad for p in ref.parameters()) and w.ref_offload is False


def test_engine_stats_become_metrics_with_wall_times_under_timing():
    """A resumed run is compared with an uninterrupted one on every metric but timing/ and perf/
    (tests/e2e/test_long_runs_e2e.py): the engine's seconds and rate go there, its counts stay."""
    from mindspeed_rl.workers.actor import engine_metrics

    stats = {"rollout/time_s": 0.5, "rollout/prefill_s": 0.1, "rollout/decode_s": 0.4, "rollout/decode_steps": 63.0,
             "rollout/kv_cache_gb": 0.01, "rollout/compiled_decode": 1.0, "rollout/tokens_per_s": 2000.0}
    assert engine_metrics(stats) == {
        "timing/rollout_time": 0.5, "timing/rollout_prefill": 0.1, "timing/rollout_decode": 0.4,
        "rollout/decode_steps": 63.0, "rollout/kv_cache_gb": 0.01, "rollout/compiled_decode": 1.0,
        "perf/rollout_tokens_per_s": 2000.0}
    w = bare_worker()
    w.engine = SimpleNamespace(last_stats=stats)
    w.phase_s = {}
    w._rollout_stats = engine_metrics(stats)
    drained = w.drain_timings()
    assert drained["timing/rollout_decode"] == 0.4 and drained["rollout/compiled_decode"] == 1.0
    assert w.drain_timings() == {}  # drained once
