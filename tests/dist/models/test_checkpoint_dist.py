"""Checkpoints, HF export, reward model and gradients on 2 gloo processes:
- a checkpoint saved at (TP, PP) = (2, 1) loads at (1, 2) and vice versa, with HF-equal logits;
- a live TP=2 or PP=2 model exports to a HF directory equal to the source, which
  transformers.from_pretrained loads (in a clean process) with equal logits;
- resume with the distributed optimizer is exact at TP=2 and at DP=2;
- reward scores at TP=2 and PP=2 match Qwen2ForSequenceClassification;
- one backward pass at TP=2 gives HF's gradients (mapped through the bridge) to 1e-4 relative."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from testing_utils import make_tiny_hf, run_gloo

pytestmark = pytest.mark.dist
VOCAB, PADDED = 120, 128


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 20), generator=g)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[0, :6], mask[1, 15:] = 0, 0  # left padding, right padding
    return ids * mask, mask


def _logits(model, ids, mask):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from mindspeed_rl.models.forward import forward_microbatches

    out = forward_microbatches(model, ids, mask, 2, post_fn=lambda o, mb: gather_from_tensor_model_parallel_region(o))
    return torch.cat(out)[..., :VOCAB] if ps.is_pipeline_last_stage() else None


def _hf_grads(model, args):
    """This chunk's parameter gradients, TP-merged and mapped to HF names (on every TP rank)."""
    from mindspeed_rl.models.checkpoint import chunk_state_dict
    from mindspeed_rl.models.hf_bridge.sharding import kind_of, mcore_to_hf
    from mindspeed_rl.models.hf_export import gather_tp

    tied = not args.get("untie_embeddings_and_output_weights", False)
    names = list(chunk_state_dict(model))
    out = {}
    for name, p in zip(names, [t for k, t in model.state_dict(keep_vars=True).items() if not k.endswith("_extra_state")]):
        out.update(mcore_to_hf(name, gather_tp(p.grad, kind_of(name, tied)), args, VOCAB))
    return out


def _job(rank, world, dirs, work):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask, vocab_parallel_log_probs
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.hf_export import export_hf

    res = {}
    ids, mask = _batch()
    for arch in ("llama", "qwen2"):
        config = read_hf_config(dirs[arch])
        args = dict(model_config_from_hf(config), padded_vocab_size=PADDED)
        for tp, pp in ((2, 1), (1, 2)):  # HF -> live model -> our checkpoint and a HF export
            init_parallel_state(tp, pp)
            model = build_gpt_model(args).eval()
            load_hf_checkpoint(model, dirs[arch], args)
            save_checkpoint(f"{work}/{arch}_tp{tp}pp{pp}", 3, model, args, vocab_size=VOCAB, hf_config=config)
            export_hf(model, args, f"{work}/{arch}_hf_tp{tp}pp{pp}", VOCAB, hf_config=config, tokenizer_dir=dirs[arch])
        for tp, pp, src in ((1, 2, "tp2pp1"), (2, 1, "tp1pp2"), (2, 1, "tp2pp1")):  # re-shard on load
            init_parallel_state(tp, pp)
            model = build_gpt_model(args).eval()
            assert load_checkpoint(f"{work}/{arch}_{src}", model, args) == 3
            res[(arch, tp, pp, src)] = _logits(model, ids, mask)
        init_parallel_state(2, 1)  # gradient parity: one backward pass at TP=2
        model = build_gpt_model(args)
        load_hf_checkpoint(model, dirs[arch], args)
        logits = model(ids, position_ids_from_mask(mask), attention_mask_4d(mask))  # (B, S, V/TP)
        lp, _ = vocab_parallel_log_probs(logits[:, :-1], ids[:, 1:], vocab_size=VOCAB)
        (-(lp * (mask[:, 1:] * mask[:, :-1])).sum()).backward()
        res[(arch, "grads")] = _hf_grads(model, args)
    res.update(_reward(dirs["rm"]))
    res.update(_resume(rank))
    return res


def _reward(rm_dir):
    from mindspeed_rl.models.builder import init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.reward_model import build_reward_model, compute_scores, reward_args
    from tests.unit.models.test_reward_model import padded_batch

    args = reward_args(dict(model_config_from_hf(read_hf_config(rm_dir)), padded_vocab_size=PADDED))
    out = {}
    for tp, pp in ((2, 1), (1, 2)):
        init_parallel_state(tp, pp)
        model = build_reward_model(args).eval()
        load_hf_checkpoint(model, rm_dir, args)
        out[("rm", tp, pp)] = compute_scores(model, *padded_batch(), micro_batch_size=2)
    return out


def _resume(rank):
    """Distributed optimizer: save after one step, continue one step; a fresh model loading the
    checkpoint and taking the same step must end at the same parameters (TP=2; DP=2)."""
    import tempfile

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import ARGS, P, make_batch

    out = {}
    with tempfile.TemporaryDirectory() as d:
        d = [d]
        torch.distributed.broadcast_object_list(d)  # one directory for both ranks
        for tp in (2, 1):
            def fresh(seed):
                init_parallel_state(tp, 1, seed=seed)
                ddp = wrap_ddp(build_gpt_model(ARGS), use_distributed_optimizer=True)
                return (ddp, *build_optimizer([ddp], lr=1e-2, train_iters=10, clip_grad=1.0))

            def step(parts, i):
                batch = make_batch(i)
                if tp == 1:  # DP=2: each rank its half
                    batch = {k: v[rank * 2:(rank + 1) * 2] for k, v in batch.items()}
                policy_update_step(*parts, batch, P, 1, PolicyLossSettings())

            parts = fresh(7)
            step(parts, 0)
            save_checkpoint(f"{d[0]}/tp{tp}", 1, parts[0], ARGS, parts[1], parts[2])
            step(parts, 1)
            again = fresh(99)
            load_checkpoint(f"{d[0]}/tp{tp}", again[0], ARGS, again[1], again[2])
            step(again, 1)
            out[("resume", tp)] = max((a - b).abs().max().item()
                                      for a, b in zip(parts[0].module.parameters(), again[0].module.parameters()))
        torch.distributed.barrier()
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from tests.unit.models.test_reward_model import hf_scores, make_tiny_rm, padded_batch

    from mindspeed_rl.models.forward import position_ids_from_mask

    base = tmp_path_factory.mktemp("ckpt_dist")
    dirs, hf = {}, {}
    for arch in ("llama", "qwen2"):
        dirs[arch] = str(base / arch)
        hf[arch] = make_tiny_hf(arch, dirs[arch])
        (base / arch / "tokenizer_config.json").write_text("{}")
    dirs["rm"] = str(base / "rm")
    rm_scores = hf_scores(make_tiny_rm(dirs["rm"]), *padded_batch())
    per_rank = run_gloo(_job, 2, dirs, str(base / "work"), timeout_s=300, name="checkpoint dist job")
    ids, mask = _batch()
    ref = {}
    for arch, model in hf.items():  # HF logits and gradients of the same loss
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-(lp * (mask[:, 1:] * mask[:, :-1])).sum()).backward()
        ref[arch] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    return per_rank, ref, rm_scores, dirs, base / "work"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_checkpoint_reshards_on_load(results, arch):
    per_rank, ref, *_ = results
    _, mask = _batch()
    for key in ((arch, 1, 2, "tp2pp1"), (arch, 2, 1, "tp1pp2"), (arch, 2, 1, "tp2pp1")):
        got = [r[key] for r in per_rank if r[key] is not None]
        assert len(got) == (1 if key[2] == 2 else 2)
        for logits in got:
            diff = (logits - ref[arch][0])[mask.bool()].abs().max().item()
            assert diff <= 1e-4, f"{key}: {diff}"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_live_export_equals_the_source(results, arch):
    *_, dirs, work = results
    want = load_file(os.path.join(dirs[arch], "model.safetensors"))
    for layout in ("tp2pp1", "tp1pp2"):
        out = work / f"{arch}_hf_{layout}"
        got = {}
        for f in out.glob("*.safetensors"):
            got.update(load_file(f))
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), layout
        assert (out / "tokenizer_config.json").exists() and (out / "config.json").exists()
        assert (out / "model.safetensors.index.json").exists() == (layout == "tp1pp2")


def test_transformers_from_pretrained_loads_the_export(results, tmp_path):
    _, ref, _, _, work = results
    ids, mask = _batch()
    torch.save((ids, mask), tmp_path / "batch.pt")
    code = (f"import torch, transformers; ids, mask = torch.load({str(tmp_path / 'batch.pt')!r}); "
            f"m = transformers.AutoModelForCausalLM.from_pretrained({str(work / 'llama_hf_tp1pp2')!r}).eval(); "
            "pos = (mask.cumsum(-1) - 1).clamp(min=0); "
            f"torch.save(m(input_ids=ids, attention_mask=mask, position_ids=pos).logits.detach(), {str(tmp_path / 'out.pt')!r})")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120, capture_output=True)
    logits = torch.load(tmp_path / "out.pt")
    assert (logits - ref["llama"][0])[mask.bool()].abs().max() <= 1e-5
    assert json.loads((work / "llama_hf_tp1pp2" / "config.json").read_text())["model_type"] == "llama"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tp2_gradients_match_transformers(results, arch):
    per_rank, ref, *_ = results
    want = ref[arch][1]
    for r in per_rank:
        got = r[(arch, "grads")]
        assert set(got) == set(want)
        for name, g in want.items():
            rel = ((got[name] - g).abs().max() / g.abs().max()).item()
            assert rel <= 1e-4, f"{arch} {name}: relative error {rel}"


def test_reward_scores_at_tp2_and_pp2(results):
    per_rank, _, rm_scores, *_ = results
    for tp, pp in ((2, 1), (1, 2)):
        got = [r[("rm", tp, pp)] for r in per_rank if r[("rm", tp, pp)] is not None]
        assert len(got) == (1 if pp == 2 else 2)
        for scores in got:
            torch.testing.assert_close(scores, rm_scores, rtol=0, atol=1e-4)


def test_distributed_optimizer_resume_is_exact(results):
    for r in results[0]:
        assert r[("resume", 2)] == 0.0 and r[("resume", 1)] == 0.0
