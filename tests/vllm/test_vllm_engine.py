"""The vLLM engine in-process against the training model (megatron) on random Llama and Qwen2:
greedy tokens equal the native engine's, sampled log-probs equal the training forward's, a weight
update streamed in shuffled chunks that split layers equals a fresh engine, one that leaves frozen layers out
equals a full one, and the sync check fires on corrupted weights. Head dim 32: vLLM's CPU attention has no kernel for 16."""
import json
import os
import random

import pytest
import torch

import testing_utils
from mindspeed_rl.rollout.interface import SamplingParams
from mindspeed_rl.rollout.sync_check import RolloutSyncError, check_sync, probe_batch

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17], [3, 1]]
HF_VOCAB = 120


def _megatron(hf_dir, seed=0, params_dtype=torch.float32):
    """The training model (megatron, TP 1, in `params_dtype`) loaded from a HF directory, and its args."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    if not torch.distributed.is_initialized():  # a closed vLLM engine tears down the process's group
        import datetime
        import os

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # (unset when no test before this one made a group)
        os.environ["MASTER_PORT"] = str(testing_utils.free_port())
        torch.distributed.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=128)  # padded like training
    init_parallel_state(1, 1, seed=seed)
    model = build_gpt_model(args, params_dtype=params_dtype)
    load_hf_checkpoint(model, hf_dir, args)
    return model.eval(), args


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, tmp_path_factory, gloo_world1):
    """(arch, HF dir, megatron model, args, engine synced from the megatron model)."""
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine
    from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors

    arch = request.param
    out = tmp_path_factory.mktemp(arch)
    old = dict(testing_utils.TINY_HF)
    testing_utils.TINY_HF.update(hidden_size=128)
    try:
        testing_utils.make_tiny_hf(arch, str(out))
    finally:
        testing_utils.TINY_HF.clear()
        testing_utils.TINY_HF.update(old)
    model, args = _megatron(str(out))
    hf_config = json.loads((out / "config.json").read_text())
    engine = VLLMEngine(hf_config, vocab_size=HF_VOCAB, max_length=128, eos_token_ids=[0], pad_token_id=0,
                        seed=0, bucket_bytes=64 * 1024)
    engine.update_weights(gathered_hf_tensors(model, args))  # the product's path: padded rows cut by the engine
    extra = []  # engines a test builds: closed with this one (closing an engine tears down vLLM's
    yield arch, out, model, args, engine, hf_config, extra  # process-wide groups, used by every engine)
    for e in extra + [engine]:
        e.close()


def _training_log_probs(model, out, temperature):
    """The training forward's log-probs of a RolloutOutput's response tokens (B, T)."""
    from mindspeed_rl.models.forward import compute_log_probs

    batch = out.to_batch()
    lp, _ = compute_log_probs(model, batch["input_ids"], batch["attention_mask"], 4, temperature, HF_VOCAB)
    P, T = out.prompts.shape[1], out.responses.shape[1]
    return lp[:, P - 1:P - 1 + T] * out.response_mask


def test_greedy_equals_native_greedy_token_for_token(setup):
    from mindspeed_rl.rollout.native import NativeEngine

    arch, _, model, _, engine, _, _ = setup
    greedy = SamplingParams(do_sample=False, max_new_tokens=24, ignore_eos=True)
    native = NativeEngine(model, vocab_size=HF_VOCAB, max_length=128).generate(PROMPTS, greedy)
    ours = engine.generate(PROMPTS, greedy)
    assert torch.equal(ours.responses, native.responses), arch
    assert torch.equal(ours.prompts, native.prompts) and torch.equal(ours.response_mask, native.response_mask)
    # greedy log-probs are the model's own distribution (T = 1) on both engines
    assert (ours.log_probs - native.log_probs).abs().max() <= 1e-4


def test_sampled_log_probs_equal_the_training_forward(setup):
    arch, _, model, _, engine, _, _ = setup
    for temperature in (1.0, 0.7):
        out = engine.generate(PROMPTS, SamplingParams(n=4, temperature=temperature, max_new_tokens=20, seed=3,
                                                      ignore_eos=True))
        assert out.responses.shape == (16, 20) and out.temperature == temperature
        diff = (_training_log_probs(model, out, temperature) - out.log_probs).abs().max()
        print(f"{arch} T={temperature}: max |vLLM - training| log-prob = {diff:.2e}")
        assert diff <= 1e-4, (arch, temperature, float(diff))
    again = engine.generate(PROMPTS, SamplingParams(n=4, temperature=0.7, max_new_tokens=20, seed=3, ignore_eos=True))
    assert torch.equal(again.responses, out.responses)  # same seed, same samples


def test_stop_tokens_end_a_response_and_stay_in_it(setup):
    _, _, _, _, engine, _, _ = setup
    free = engine.generate(PROMPTS[:1], SamplingParams(do_sample=False, max_new_tokens=12, ignore_eos=True))
    stop = int(free.responses[0, 3])  # the 4th greedy token becomes a stop token
    first = free.responses[0].tolist().index(stop)
    out = engine.generate(PROMPTS[:1], SamplingParams(do_sample=False, max_new_tokens=12, stop_token_ids=(stop,)))
    assert out.response_length.tolist() == [first + 1] and out.finish_reason == ["eos"]
    assert out.responses[0, first].item() == stop and free.finish_reason == ["length"]


def test_update_in_shuffled_chunks_splitting_layers_equals_a_fresh_engine(setup, tmp_path):
    """New weights (another seed) streamed in chunks of 3 tensors in shuffled order: q/k/v and
    gate/up of one layer land in different chunks; the engine then equals one built from them."""
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    arch, _, _, _, engine, hf_config, extra = setup
    old = dict(testing_utils.TINY_HF)
    testing_utils.TINY_HF.update(hidden_size=128)
    try:
        hf = testing_utils.make_tiny_hf(arch, str(tmp_path), seed=1)
    finally:
        testing_utils.TINY_HF.clear()
        testing_utils.TINY_HF.update(old)
    state = {k: v for k, v in hf.state_dict().items() if not (k == "lm_head.weight" and hf_config.get("tie_word_embeddings"))}
    items = list(state.items())
    random.Random(0).shuffle(items)
    chunks = [items[i:i + 3] for i in range(0, len(items), 3)]
    where = {name: i for i, chunk in enumerate(chunks) for name, _ in chunk}
    split = [layer for layer in range(2) if len({where[f"model.layers.{layer}.self_attn.{p}_proj.weight"]
                                                  for p in "qkv"}) > 1]
    assert split, "the shuffle must put a layer's q/k/v in different chunks"
    sp = [SamplingParams(do_sample=False, max_new_tokens=16, ignore_eos=True),
          SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=11, ignore_eos=True)]
    before = engine.generate(PROMPTS, sp[0])
    engine.update_weights_chunks(chunks)
    assert engine.last_sync["tensors"] == len(items) and engine.last_sync["peak_bytes"] > 0
    fresh = VLLMEngine(hf_config, vocab_size=HF_VOCAB, max_length=128, eos_token_ids=[0], seed=0)
    extra.append(fresh)
    fresh.update_weights(state.items())
    for params in sp:
        a, b = engine.generate(PROMPTS, params), fresh.generate(PROMPTS, params)
        assert torch.equal(a.responses, b.responses) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(engine.generate(PROMPTS, sp[0]).responses, before.responses)  # the update took


def test_sync_check_fires_on_corrupted_weights(setup):
    """The probe after a sync: the true weights pass at 1e-4; one corrupted tensor (layer 1's k_proj
    scaled by 3) stops with the sentence naming the step and the largest difference."""
    from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors

    arch, _, model, args, engine, _, _ = setup
    engine.update_weights(gathered_hf_tensors(model, args))
    out = probe_batch(engine, HF_VOCAB, True, 1.0, 128)

    def train_lp(batch):
        from mindspeed_rl.models.forward import compute_log_probs

        lp, _ = compute_log_probs(model, batch["input_ids"], batch["attention_mask"], 2, 1.0, HF_VOCAB)
        P, T = batch["prompts"].shape[1], batch["responses"].shape[1]
        return lp[:, P - 1:P - 1 + T] * batch["response_mask"]

    ok = check_sync(train_lp(out), out["rollout_log_probs"], out["response_mask"], 1e-4, step=7)
    assert ok["rollout/logp_diff_max"] <= 1e-4
    corrupted = ((n, t * 3 if n == "model.layers.1.self_attn.k_proj.weight" else t)
                 for n, t in gathered_hf_tensors(model, args))
    engine.update_weights(corrupted)
    bad = probe_batch(engine, HF_VOCAB, True, 1.0, 128)
    with pytest.raises(RolloutSyncError, match=r"^step 7: after the weight sync, the log-probs of the rollout engine "
                                               r"on the probe differ from the training forward by up to [0-9.e-]+ "):
        check_sync(train_lp(bad), bad["rollout_log_probs"], bad["response_mask"], 1e-4, step=7)
    engine.update_weights(gathered_hf_tensors(model, args))  # leave the shared engine as it was


def test_frozen_tensors_left_out_after_a_learning_sync_equal_a_full_update(setup, tmp_path):
    """freeze_parameters: a learning sync (each tensor alone) records the vLLM layers each feeds; the embedding and
    layer 0's attention (q / k / v / o and, Qwen2, the q / k / v biases) are then left out, but never part of a fused
    layer (q alone, or q / k / v without their biases). An update without them (new weights for every other tensor)
    generates what a fresh engine given all the new weights, the frozen ones unchanged, does."""
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    arch, _, _, _, _, hf_config, extra = setup
    states = []
    old = dict(testing_utils.TINY_HF)
    testing_utils.TINY_HF.update(hidden_size=128)
    try:
        for seed in (3, 4):
            hf = testing_utils.make_tiny_hf(arch, str(tmp_path / str(seed)), seed=seed)
            states.append({k: v for k, v in hf.state_dict().items()
                           if not (k == "lm_head.weight" and hf_config.get("tie_word_embeddings"))})
    finally:
        testing_utils.TINY_HF.clear()
        testing_utils.TINY_HF.update(old)
    attention = {n for n in states[0] if n.startswith("model.layers.0.self_attn.")}
    frozen = attention | {"model.embed_tokens.weight"}
    learner = VLLMEngine(hf_config, vocab_size=HF_VOCAB, max_length=128, eos_token_ids=[0], seed=0)
    extra.append(learner)
    learner.update_weights(states[0].items(), learn_layers=True)
    assert set(learner.layers_fed) == set(states[0])
    qkv = {f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"}
    assert learner.skippable({"model.layers.0.self_attn.q_proj.weight"}) == set()
    assert learner.skippable(qkv) == (qkv if arch == "llama" else set())  # Qwen2's biases are in the fused layer
    assert learner.skippable(frozen) == frozen
    new = {n: states[0][n] if n in frozen else t for n, t in states[1].items()}
    learner.update_weights((n, t) for n, t in new.items() if n not in frozen)
    assert learner.last_sync["tensors"] == len(new) - len(frozen)
    fresh = VLLMEngine(hf_config, vocab_size=HF_VOCAB, max_length=128, eos_token_ids=[0], seed=0)
    extra.append(fresh)
    fresh.update_weights(new.items())
    for params in (SamplingParams(do_sample=False, max_new_tokens=16, ignore_eos=True),
                   SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=11, ignore_eos=True)):
        a, b = learner.generate(PROMPTS, params), fresh.generate(PROMPTS, params)
        assert torch.equal(a.responses, b.responses) and torch.equal(a.log_probs, b.log_probs)


def test_threads_sleep_and_close(setup, caplog):
    """The training side keeps torch.set_num_threads; CPU sleep/wake are no-ops said once."""
    _, _, _, _, engine, _, _ = setup
    assert not os.path.exists(engine._dir)  # the config dir is gone once vLLM has read it (no /tmp leak)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads)
    with caplog.at_level("INFO"):
        engine.sleep()
        engine.sleep()
    assert sum("no sleep mode on cpu" in r.getMessage() for r in caplog.records) == 1
    engine.wake_up()
    assert engine.generate(PROMPTS[:1], SamplingParams(do_sample=False, max_new_tokens=2)).responses.shape[1] >= 1


def test_a_tokenizer_with_more_ids_than_the_model_has_rows(setup):
    """Added tokens past a checkpoint's vocab_size (bench/grpo_step.py: 2049 ids, 2048 rows): the
    actor's engine holds the model's rows, so its first weight sync loads without vLLM's embedding
    loader asserting, and the sync-check probe draws its prompt ids from those rows only."""
    from types import SimpleNamespace

    from mindspeed_rl.rollout.vllm_engine import build_vllm_engine
    from mindspeed_rl.rollout.weight_buckets import RolloutSkip
    from mindspeed_rl.workers.actor import ActorRolloutWorker

    _, out, model, args, _, _, extra = setup
    tokenizer_ids, rows = 4096, args["padded_vocab_size"]  # a probe over 4096 ids surely draws one >= 128
    rollout = SimpleNamespace(infer_tensor_parallel_size=1, gpu_memory_utilization=0.3, vllm_kv_cache_gb=1,
                              num_samples_per_step=4, enforce_eager=True, do_sample=True, temperature=1.0)
    cfg = SimpleNamespace(actor=SimpleNamespace(load=str(out), params_dtype="fp32", rollout=rollout),
                          run=SimpleNamespace(seq_length=128, seed=0, platform="cpu"))
    engine = build_vllm_engine(cfg, args, SimpleNamespace(pad_token_id=0, eos_token_id=0), tokenizer_ids)
    extra.append(engine)
    assert engine.vocab_size == rows
    # the actor's own methods on a stand-in holding what they read (a whole actor needs Ray and a trainer)
    actor = SimpleNamespace(engine_kind="vllm", engine=engine, model=model, args=args, cfg=cfg,
                            vocab_size=tokenizer_ids, rollout_skip=RolloutSkip())
    sync = ActorRolloutWorker.sync_rollout_weights(actor)
    assert sync["timing/sync_weights"] > 0 and engine.last_sync["tensors"] > 0
    probe = ActorRolloutWorker.generate_probe(actor)
    prompt_ids = probe["prompts"][probe["prompts"] != 0]
    assert prompt_ids.numel() > 0 and int(probe["prompts"].max()) < rows
    assert int(probe["responses"].max()) < rows and probe["response_mask"].sum() > 0
