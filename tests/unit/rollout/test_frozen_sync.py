"""Frozen parameters (freeze_parameters) go to a rollout engine with its own weights once: the first sync records
each frozen megatron tensor's HF names, the engines say which of them they can do without, and later syncs neither
gather nor send those. The vLLM side (whole layers only) runs in tests/vllm/test_vllm_engine.py; here the rule that
picks them, the training side's gathers and the native engine's partial load."""
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.rollout.vllm_engine import VLLMEngine
from mindspeed_rl.utils.errors import UserInputError


def _skippable(layers_fed, names):
    engine = SimpleNamespace(layers_fed=layers_fed, skipped=frozenset())
    return VLLMEngine.skippable(engine, names)


L0 = "model.layers.0."
FED = {  # HF name -> the vLLM layers it fed (as a learning sync records them): q / k / v fused, gate / up fused
    "model.embed_tokens.weight": frozenset({"model.embed_tokens"}),
    **{f"{L0}self_attn.{p}_proj.weight": frozenset({f"{L0}self_attn.qkv_proj"}) for p in "qkv"},
    f"{L0}self_attn.q_proj.bias": frozenset({f"{L0}self_attn.qkv_proj"}),
    f"{L0}self_attn.o_proj.weight": frozenset({f"{L0}self_attn.o_proj"}),
    **{f"{L0}mlp.{p}_proj.weight": frozenset({f"{L0}mlp.gate_up_proj"}) for p in ("gate", "up")},
    f"{L0}mlp.down_proj.weight": frozenset({f"{L0}mlp.down_proj"}),
    "model.layers.0.mlp.experts.3.down_proj.weight": frozenset({f"{L0}mlp.experts"}),
    "odd.weight": frozenset({"model.embed_tokens", f"{L0}mlp.down_proj"}),  # one tensor feeding two layers
    "model.norm.weight": frozenset(),  # a tensor vLLM took without a layer of its own
}


def test_only_whole_vllm_layers_are_left_out():
    qkv = {f"{L0}self_attn.{p}_proj.weight" for p in "qkv"}
    assert _skippable(FED, {f"{L0}self_attn.o_proj.weight"}) == {f"{L0}self_attn.o_proj.weight"}
    assert _skippable(FED, qkv) == set()  # the q bias is sent: the fused layer would be finished half-loaded
    assert _skippable(FED, qkv | {f"{L0}self_attn.q_proj.bias"}) == qkv | {f"{L0}self_attn.q_proj.bias"}
    assert _skippable(FED, {f"{L0}mlp.gate_proj.weight"}) == set()
    # the embedding shares no layer with a sent tensor only if "odd" (which also feeds down_proj) is left out too,
    # and down_proj then must be: the closure takes all three or none
    assert _skippable(FED, {"model.embed_tokens.weight", "odd.weight"}) == set()
    three = {"model.embed_tokens.weight", "odd.weight", f"{L0}mlp.down_proj.weight"}
    assert _skippable(FED, three) == three
    assert _skippable(FED, {"model.layers.0.mlp.experts.3.down_proj.weight", "model.norm.weight"}) == {
        "model.norm.weight"}  # never experts (vLLM's CPU experts are prepacked again after every sync)
    assert _skippable(FED, {"not.learned.weight"}) == set()  # (a tensor grouped before vLLM saw it)


def test_nothing_is_left_out_without_a_learning_sync_or_with_a_model_that_does_not_say():
    assert _skippable(None, {"model.embed_tokens.weight"}) == set()
    assert _skippable({**FED, "model.norm.weight": None}, {"model.embed_tokens.weight"}) == set()


def _tiny_frozen_llama(tmp_path, patterns):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.freeze import freeze
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from testing_utils import make_tiny_hf

    make_tiny_hf("llama", str(tmp_path))
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args)
    load_hf_checkpoint(model, str(tmp_path), args)
    freeze([model], patterns)
    return model, args


def test_training_side_records_then_leaves_out_what_it_is_told(gloo_world1, tmp_path):
    from mindspeed_rl.rollout.weight_buckets import RolloutSkip, frozen_names, gathered_hf_tensors

    model, args = _tiny_frozen_llama(tmp_path, ["embedding.*", "decoder.layers.0.self_attention.linear_qkv.*"])
    assert frozen_names(model) == {"embedding.word_embeddings.weight",
                                   "decoder.layers.0.self_attention.linear_qkv.weight"}
    skip = RolloutSkip(record=True)
    full = dict(gathered_hf_tensors(model, args, skip))
    assert skip.hf_names == {"embedding.word_embeddings.weight": ("model.embed_tokens.weight",),
                             "decoder.layers.0.self_attention.linear_qkv.weight": tuple(
                                 f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")}
    frozen = skip.frozen_hf_names()
    skip.record, skip.skip = False, frozenset(frozen)
    later = dict(gathered_hf_tensors(model, args, skip))
    assert sorted(later) == sorted(set(full) - frozen)
    assert all(torch.equal(later[n], full[n]) for n in later)
    # told to leave out only q (k and v sent): the tensor is gathered and q alone is left out
    skip.skip = frozenset({"model.layers.0.self_attn.q_proj.weight"})
    assert sorted(dict(gathered_hf_tensors(model, args, skip))) == sorted(set(full) - skip.skip)


def test_native_engine_keeps_what_does_not_come_when_told(gloo_world1, tmp_path):
    from mindspeed_rl.models.builder import build_gpt_model
    from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors
    from mindspeed_rl.rollout.weights import load_hf_tensors

    model, args = _tiny_frozen_llama(tmp_path, ["embedding.*"])
    named = dict(gathered_hf_tensors(model, args))
    other = build_gpt_model(args)
    load_hf_tensors(other, named.items(), args)  # the first sync: everything
    kept = other.embedding.word_embeddings.weight.detach().clone()
    with torch.no_grad():
        model.decoder.layers[0].mlp.linear_fc2.weight.add_(1.0)  # an update (the embedding is frozen)
    later = {n: t for n, t in gathered_hf_tensors(model, args) if n != "model.embed_tokens.weight"}
    with pytest.raises(UserInputError, match="missing HF tensors: model.embed_tokens.weight"):
        load_hf_tensors(build_gpt_model(args), later.items(), args)  # without being told: refused
    load_hf_tensors(other, later.items(), args, absent={"model.embed_tokens.weight"})
    assert torch.equal(other.embedding.word_embeddings.weight, kept)
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        if not name.endswith("_extra_state"):
            assert torch.equal(a, b), name
