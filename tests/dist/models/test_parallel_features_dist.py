"""Sequence parallelism and the virtual pipeline on 2 gloo processes, one spawn for both, on a tiny
random 4-layer Qwen3 (q/k norms, GQA; head_dim 32):

- TP=2 + SP against TP=2 without SP, same weights: logits and log-probs (a sequence length that
  is not a multiple of TP, so the padding path runs), the weights after one SGD step of the policy
  loss (= the gradients, the norms' TP all-reduce included), and the native engine's greedy tokens.
- both against transformers' log-probs (the PP=1 reference) within 1e-4.
- PP=2 x VPP=2 (interleaved schedule, 2 chunks per rank) against PP=2 without it: log-probs (a
  micro-batch count the schedule must pad, and one it need not), the weights after one SGD step,
  greedy tokens of the native engine (hidden states go round the pipeline ring once per chunk);
  the HF export of the VPP model is the source checkpoint bit for bit, and its checkpoint loads
  at PP=2 without VPP and back.
"""
import pytest
import torch

from testing_utils import make_tiny_hf, run_gloo

pytestmark = pytest.mark.dist

VOCAB, PADDED, SEQ, P = 120, 128, 15, 6
PROMPTS = [[5, 17, 99], [3, 1, 4, 1, 5, 9, 2, 6, 53], [7], [88, 12, 40, 41, 42]]


def _batch():
    torch.manual_seed(3)
    ids = torch.randint(0, VOCAB, (4, SEQ))  # (B, S); S = 15 is odd: SP pads it to 16
    mask = torch.ones(4, SEQ, dtype=torch.long)
    mask[0, :2] = 0  # a left-padded prompt
    mask[2, 12:] = 0  # a short response
    T = SEQ - P
    rmask = mask[:, P:].float()
    adv = torch.randn(4, T) * rmask
    return {"input_ids": ids, "attention_mask": mask, "response_mask": rmask, "advantages": adv,
            "old_log_probs": -4.0 + 0.1 * torch.randn(4, T)}


def _run(chunks, args, micro):
    """log-probs (on the last stage), greedy tokens, weights after one SGD step of the policy loss."""
    from mindspeed_rl.models.checkpoint import chunk_state_dict
    from mindspeed_rl.models.forward import compute_log_probs
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    b = _batch()
    out = {"lp": {}}
    for mbs in (1, 4):  # 4 micro-batches, and 1 (the interleaved schedule repeats it to PP)
        lp = compute_log_probs(chunks if len(chunks) > 1 else chunks[0], b["input_ids"], b["attention_mask"], mbs,
                               temperature=0.7, vocab_size=VOCAB, with_entropy=True)
        out["lp"][mbs] = lp
    # the output layer on the response positions only (sliced before it; not under SP): same values
    out["lp_response"] = compute_log_probs(chunks if len(chunks) > 1 else chunks[0], b["input_ids"], b["attention_mask"],
                                           2, temperature=0.7, vocab_size=VOCAB, with_entropy=True, from_position=P - 1)
    engine = NativeEngine(chunks if len(chunks) > 1 else chunks[0], vocab_size=VOCAB, max_length=64)
    out["greedy"] = engine.generate(PROMPTS, SamplingParams(do_sample=False, max_new_tokens=8)).responses
    ddp = [wrap_ddp(c, use_distributed_optimizer=False, bucketing=i == 0) for i, c in enumerate(chunks)]
    opt, sched = build_optimizer(ddp, lr=1.0, train_iters=2, clip_grad=1e9, optimizer="sgd",
                                 use_distributed_optimizer=False)
    s = PolicyLossSettings(temperature=0.7, vocab_size=VOCAB, entropy_coeff=0.01)
    for c in chunks:
        c.train()
    out["stats"] = policy_update_step(ddp if len(ddp) > 1 else ddp[0], opt, sched, b, P, micro, s)
    out["stepped"] = {k: v.clone() for k, v in chunk_state_dict(chunks).items()}
    return out, ddp


def _job(rank, world_size, hf_dir, tmp):
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.builder import build_model_chunks, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.checkpoint import chunk_state_dict, load_checkpoint, load_weights, save_checkpoint
    from mindspeed_rl.models.hf_bridge import read_hf_config
    from mindspeed_rl.models.hf_export import export_hf
    from mindspeed_rl.models.parallel import parallel_config_kwargs

    args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=PADDED)
    res = {}
    for sp in (False, True):
        init_parallel_state(tp=2, pp=1, seed=1)
        chunks = build_model_chunks(args, config_overrides=parallel_config_kwargs(sequence_parallel=sp))
        load_weights(chunks, hf_dir, args)
        res[("sp", sp)], _ = _run(chunks, args, micro=2)
    for vpp in (1, 2):
        init_parallel_state(tp=1, pp=2, seed=1, vpp=vpp)
        overrides = parallel_config_kwargs(virtual_pipeline_size=vpp)
        chunks = build_model_chunks(args, config_overrides=overrides)
        load_weights(chunks, hf_dir, args)
        res[("vpp", vpp, "layers")] = [[layer.layer_number - 1 for layer in c.decoder.layers] for c in chunks]
        if vpp == 2:  # before the update: the export is the source checkpoint
            export_hf(chunks, args, f"{tmp}/export", VOCAB, hf_config=read_hf_config(hf_dir))
        res[("vpp", vpp)], ddp = _run(chunks, args, micro=1)
        if vpp == 2:
            save_checkpoint(f"{tmp}/ckpt", 1, ddp, args)
    # the VPP checkpoint at PP=2 without VPP (re-sharded by global layer names), and back
    init_parallel_state(tp=1, pp=2, seed=1)
    plain = build_model_chunks(args)
    load_checkpoint(f"{tmp}/ckpt/iter_0000001", plain, args, load_rng=False)
    res["ckpt_pp2"] = chunk_state_dict(plain)
    init_parallel_state(tp=1, pp=2, seed=1, vpp=2)
    again = build_model_chunks(args, config_overrides=parallel_config_kwargs(virtual_pipeline_size=2))
    load_checkpoint(f"{tmp}/ckpt/iter_0000001", again, args, load_rng=False)
    res["ckpt_vpp2"] = chunk_state_dict(again)
    ps.destroy_model_parallel()
    return res


_MASK = _batch()["attention_mask"].bool()
REAL = _MASK[:, 1:] & _MASK[:, :-1]  # log-prob positions whose token and context are real


@pytest.fixture(scope="module", params=["qwen3", "gemma3_text", "qwen3_5_text", "gemma4_text"])
def results(tmp_path_factory, request):
    """gemma3_text: its post norms' gradients under SP (all-reduced over TP like the other norms'),
    sliding and full layers spread over the virtual pipeline chunks; qwen3_5_text: Gated DeltaNet layers
    (the gated norm's weight, whole on both TP ranks, its gradient summed over TP in the graph) and
    output-gated attention under SP, the DeltaNet layers on one rank's chunks, the attention on the other's;
    gemma4_text: layers of two shapes (the sliding ones' own head dim and key / value heads, the full ones' keys as
    values) under SP, on one rank's chunks each, their layer scalars through the checkpoint at PP 2 / VPP 2."""
    from mindspeed_rl.models.forward import position_ids_from_mask

    tmp = tmp_path_factory.mktemp("parallel")
    hf = make_tiny_hf(request.param, str(tmp / "hf"), num_hidden_layers=4)
    b = _batch()
    with torch.no_grad():  # transformers' log-probs of the same tokens: the PP=1 reference
        logits = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                    position_ids=position_ids_from_mask(b["attention_mask"])).logits
    ref = torch.log_softmax(logits[:, :-1] / 0.7, -1).gather(-1, b["input_ids"][:, 1:, None]).squeeze(-1)
    per_rank = run_gloo(_job, 2, str(tmp / "hf"), str(tmp), timeout_s=400, name="SP / VPP job")
    return per_rank, tmp, ref


def _merged(per_rank, key):
    """Megatron names (global layers) -> stepped weights over both pipeline ranks."""
    return {name: w for r in per_rank for name, w in r[key]["stepped"].items()}


def _close(a, b, tol, what, where=None):
    diff = (a - b)[where].abs().max().item() if where is not None else (a - b).abs().max().item()
    assert diff <= tol, f"{what}: max |diff| {diff:.3g} > {tol}"


def test_sequence_parallel_equals_tp_without_it(results):
    per_rank, _, ref = results
    for rank, r in enumerate(per_rank):
        off, on = r[("sp", False)], r[("sp", True)]
        for mbs in (1, 4):
            for i in range(2):  # log-probs, entropy
                _close(on["lp"][mbs][i], off["lp"][mbs][i], 1e-5, f"rank {rank} SP log-probs[{i}] mbs {mbs}", REAL)
        assert torch.equal(on["greedy"], off["greedy"]), f"rank {rank}: SP changes the engine's greedy tokens"
        _close(on["lp"][4][0], ref, 1e-4, f"rank {rank} TP=2 + SP log-probs vs transformers", REAL)
        assert on["stepped"].keys() == off["stepped"].keys()
        for name, w in on["stepped"].items():  # lr 1 SGD: the weight difference is the gradient difference
            ref_w = off["stepped"][name]  # relative past 1: Qwen3.5's DeltaNet steps move weights up to ~25
            _close(w, ref_w, 1e-5 * max(1.0, ref_w.abs().max().item()), f"rank {rank} SP gradient of {name}")
        assert abs(on["stats"]["actor/pg_loss"] - off["stats"]["actor/pg_loss"]) < 1e-6


def test_virtual_pipeline_equals_plain_pipeline(results):
    per_rank, _, ref = results
    # chunk v of rank r holds layer v * PP + r (4 layers, PP 2, VPP 2)
    assert [r[("vpp", 2, "layers")] for r in per_rank] == [[[0], [2]], [[1], [3]]]
    assert [r[("vpp", 1, "layers")] for r in per_rank] == [[[0, 1]], [[2, 3]]]
    last = per_rank[1]
    plain, inter = last[("vpp", 1)], last[("vpp", 2)]
    for mbs in (1, 4):
        for i in range(2):
            _close(inter["lp"][mbs][i], plain["lp"][mbs][i], 1e-5, f"VPP log-probs[{i}] mbs {mbs}", REAL)
    _close(inter["lp"][4][0], ref, 1e-4, "PP=2 x VPP=2 log-probs vs transformers", REAL)
    assert per_rank[0][("vpp", 2)]["lp"][1] is None  # not the last stage: nothing to return
    for r in per_rank:
        assert torch.equal(r[("vpp", 2)]["greedy"], plain["greedy"]), "VPP changes the engine's greedy tokens"
    stepped, ref = _merged(per_rank, ("vpp", 2)), _merged(per_rank, ("vpp", 1))
    assert stepped.keys() == ref.keys()
    for name, w in stepped.items():
        _close(w, ref[name], 1e-6, f"VPP gradient of {name}")
    assert abs(inter["stats"]["actor/pg_loss"] - plain["stats"]["actor/pg_loss"]) < 1e-6


def test_response_only_logits_equal_full_logits(results):
    """compute_log_probs(from_position=P-1) (the actor's call: the output layer sees the response
    columns only) equals the full pass there and is 0 before, at TP=2 with and without SP, PP=2, VPP=2."""
    per_rank, _, _ = results
    runs = [(f"rank {r} sp {sp}", per_rank[r][("sp", sp)]) for r in (0, 1) for sp in (False, True)]
    runs += [(f"PP=2 VPP={v}", per_rank[1][("vpp", v)]) for v in (1, 2)]
    for what, run in runs:
        for i in range(2):  # log-probs, entropy
            part, full = run["lp_response"][i], run["lp"][4][i]
            _close(part[:, P - 1:], full[:, P - 1:], 1e-5, f"{what}: response-only log-probs[{i}]", REAL[:, P - 1:])
            assert not part[:, :P - 1].any(), f"{what}: columns before the response are not 0"


def test_virtual_pipeline_export_and_checkpoint_round_trip(results):
    from safetensors.torch import load_file

    per_rank, tmp, _ = results
    import glob

    def tensors(d):
        out = {}
        for f in glob.glob(f"{d}/*.safetensors"):
            out.update(load_file(f))
        return out

    src, exported = tensors(tmp / "hf"), tensors(tmp / "export")
    assert src.keys() == exported.keys()
    for name, t in src.items():
        assert torch.equal(t, exported[name]), f"{name} differs after HF -> PP2 x VPP2 -> HF"
    stepped = _merged(per_rank, ("vpp", 2))  # saved at VPP 2, loaded at VPP 1 (re-sharded) and at VPP 2
    for key in ("ckpt_pp2", "ckpt_vpp2"):
        loaded = {name: w for r in per_rank for name, w in r[key].items()}
        assert loaded.keys() == stepped.keys(), key
        for name, w in loaded.items():
            assert torch.equal(w, stepped[name]), f"{key}: {name}"
    for r in per_rank:  # and each rank holds what its layout says
        assert r["ckpt_vpp2"].keys() == r[("vpp", 2)]["stepped"].keys()
        assert r["ckpt_pp2"].keys() == r[("vpp", 1)]["stepped"].keys()
