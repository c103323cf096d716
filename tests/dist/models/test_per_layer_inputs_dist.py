"""Gemma 4 E2B / E4B's layout (models/gemma4.py: per-layer inputs, the last layers reading an earlier layer's keys and
values with MLPs twice as wide) over TP on 2 gloo processes, one spawn, on the tiny HF_VARIANTS gemma4_text-ple:

- TP=1 (DP=2, the same batch on both), TP=2, TP=2 + SP and TP=2 + SP + selective recompute: log-probs within 1e-4
  of transformers', the native engine's greedy tokens the same everywhere;
- the weights after one SGD step of the policy loss (= the gradients) the same at TP=2 with and without SP and
  with recompute, and the per-layer parts' the same as TP=1's (the table's rows of each rank; the projections,
  gates and norms whole on every rank, their gradients summed over TP under SP);
- per-layer inputs without KV sharing under full recompute (the inputs reach the layers as the decoder's `context`,
  which megatron's checkpoint carries): the same weights after the step as without recompute.
"""
import pytest
import torch

from testing_utils import HF_VARIANTS, make_tiny_hf, run_gloo
from test_parallel_features_dist import REAL, _batch, _run

pytestmark = pytest.mark.dist

PADDED = 128
NO_SHARING = dict(HF_VARIANTS["gemma4_text-ple"], num_kv_shared_layers=0, use_double_wide_mlp=False)
RUNS = {"tp1": (1, False, None), "tp2": (2, False, None), "sp": (2, True, None), "sp-selective": (2, True, "selective")}


def _job(rank, world_size, hf_dir, plain_dir):
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.builder import build_model_chunks, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.checkpoint import chunk_state_dict, load_weights
    from mindspeed_rl.models.hf_bridge import read_hf_config
    from mindspeed_rl.models.parallel import parallel_config_kwargs

    res = {}
    for key, (tp, sp, recompute) in RUNS.items():
        args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=PADDED)
        init_parallel_state(tp=tp, pp=1, seed=1)
        chunks = build_model_chunks(args, config_overrides=parallel_config_kwargs(sequence_parallel=sp,
                                                                                   recompute_granularity=recompute))
        load_weights(chunks, hf_dir, args)
        res[(key, "loaded")] = {k: v.clone() for k, v in chunk_state_dict(chunks).items()}
        res[key], _ = _run(chunks, args, micro=2)
    for recompute in (None, "full"):
        args = dict(model_config_from_hf(read_hf_config(plain_dir)), padded_vocab_size=PADDED)
        init_parallel_state(tp=2, pp=1, seed=1)
        chunks = build_model_chunks(args, config_overrides=parallel_config_kwargs(
            sequence_parallel=True, recompute_granularity=recompute, recompute_num_layers=2))
        load_weights(chunks, plain_dir, args)
        res[("plain", recompute)], _ = _run(chunks, args, micro=2)
    ps.destroy_model_parallel()
    return res


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from mindspeed_rl.models.forward import position_ids_from_mask

    tmp = tmp_path_factory.mktemp("ple")
    hf = make_tiny_hf("gemma4_text", str(tmp / "hf"), **HF_VARIANTS["gemma4_text-ple"])
    make_tiny_hf("gemma4_text", str(tmp / "plain"), **NO_SHARING)
    b = _batch()
    with torch.no_grad():
        logits = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                    position_ids=position_ids_from_mask(b["attention_mask"])).logits
    ref = torch.log_softmax(logits[:, :-1] / 0.7, -1).gather(-1, b["input_ids"][:, 1:, None]).squeeze(-1)
    per_rank = run_gloo(_job, 2, str(tmp / "hf"), str(tmp / "plain"), timeout_s=400, name="per-layer inputs TP job")
    return per_rank, ref


def _close(a, b, tol, what, where=None):
    diff = (a - b)[where].abs().max().item() if where is not None else (a - b).abs().max().item()
    assert diff <= tol, f"{what}: max |diff| {diff:.3g} > {tol}"


def test_log_probs_and_greedy_tokens_over_tp(results):
    per_rank, ref = results
    for rank, r in enumerate(per_rank):
        for key in RUNS:
            _close(r[key]["lp"][4][0], ref, 1e-4, f"rank {rank} {key} log-probs vs transformers", REAL)
            assert torch.equal(r[key]["greedy"], per_rank[0]["tp1"]["greedy"]), f"rank {rank} {key}: greedy tokens"


def test_gradients_over_tp_sp_and_recompute(results):
    per_rank, _ = results
    for rank, r in enumerate(per_rank):
        base, loaded = r["tp2"]["stepped"], r[("tp2", "loaded")]
        for key in ("sp", "sp-selective"):  # lr 1 SGD: the weights' difference is the gradients' (fp32 sums in
            assert r[key]["stepped"].keys() == base.keys()  # another order: 1e-4 of the step, measured ~1e-5)
            for name, w in r[key]["stepped"].items():
                step = (base[name] - loaded[name]).abs().max().item()
                _close(w, base[name], 1e-4 * step + 1e-6, f"rank {rank} {key}: {name}")
        whole = r["tp1"]["stepped"]
        per_layer = [n for n in base if "per_layer" in n]
        assert len(per_layer) == 3 + 3 * 4, per_layer  # the embedding's table, projection and norm; 3 per layer
        for name in per_layer:
            want = whole[name]
            if name == "embedding.per_layer.embeddings.weight":  # split over TP by rows
                want = want.chunk(2, dim=0)[rank]
            _close(base[name], want, 1e-4 * (base[name] - loaded[name]).abs().max().item() + 1e-6,
                   f"rank {rank} TP=2 vs TP=1: {name}")
        still = [n for n in per_layer if torch.equal(base[n], loaded[n])]
        assert still == [], f"rank {rank}: no gradient reached {still}"


def test_full_recompute_carries_the_per_layer_inputs(results):
    per_rank, _ = results
    for rank, r in enumerate(per_rank):
        off, on = r[("plain", None)]["stepped"], r[("plain", "full")]["stepped"]
        assert on.keys() == off.keys()
        for name, w in on.items():
            _close(w, off[name], 1e-5 * max(1.0, off[name].abs().max().item()), f"rank {rank} full recompute: {name}")
