"""models.checkpoint (one process): resume is exact (model + Adam state + scheduler + rng + step),
the stage parameter list matches a built model, the architecture is checked against the manifest,
and a live model exports to a HF directory that transformers loads with equal logits."""

import json
import os
import random

import pytest
import torch

from testing_utils import HF_VARIANTS, add_mtp_layer, make_tiny_hf

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=8, padded_vocab_size=40, max_position_embeddings=32,
            add_qkv_bias=True, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)


def _trained(seed, use_distributed_optimizer, bf16_stochastic=False):
    """bf16_stochastic: a bf16 model whose main-to-model copy rounds stochastically (its random bits
    follow the scheduler's step, which the checkpoint restores; its seed is the run's, not the init's)."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp

    init_parallel_state(1, 1, seed=seed)
    dtype = torch.bfloat16 if bf16_stochastic else torch.float32
    ddp = wrap_ddp(build_gpt_model(ARGS, params_dtype=dtype), use_distributed_optimizer=use_distributed_optimizer)
    opt, sched = build_optimizer([ddp], lr=1e-2, train_iters=10, lr_warmup_fraction=0.3, clip_grad=1.0,
                                 use_distributed_optimizer=use_distributed_optimizer, params_dtype=dtype,
                                 stochastic_rounding=bf16_stochastic, seed=5)
    return ddp, opt, sched


def _step(ddp, opt, sched, seed):
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from tests.unit.models.test_train_step import P, make_batch

    return policy_update_step(ddp, opt, sched, make_batch(seed), P, 2, PolicyLossSettings())


@pytest.mark.parametrize("distributed,bf16_stochastic", [(True, False), (False, False), (True, True), (False, True)])
def test_resume_is_exact(gloo_world1, tmp_path, distributed, bf16_stochastic):
    from mindspeed_rl.models.checkpoint import load_checkpoint, read_manifest, save_checkpoint

    ddp, opt, sched = _trained(7, distributed, bf16_stochastic)
    for i in range(2):
        _step(ddp, opt, sched, i)
    random.seed(3)
    save_checkpoint(str(tmp_path), 2, ddp, ARGS, opt, sched, vocab_size=37)
    expected_rand = random.random()
    after = [_step(ddp, opt, sched, 2)["actor/lr"], [p.detach().clone() for p in ddp.module.parameters()]]

    ddp2, opt2, sched2 = _trained(99, distributed, bf16_stochastic)  # different init: everything must come from disk
    assert load_checkpoint(str(tmp_path), ddp2, ARGS, opt2, sched2) == 2
    assert random.random() == expected_rand
    lr = _step(ddp2, opt2, sched2, 2)["actor/lr"]
    assert lr == after[0]
    for a, b in zip(after[1], ddp2.module.parameters()):
        torch.testing.assert_close(b.detach(), a, rtol=0, atol=0)
    m = read_manifest(str(tmp_path))
    assert (m["step"], m["tp"], m["pp"], m["dp"], m["vocab_size"], m["distributed_optimizer"]) == (2, 1, 1, 1, 37, distributed)
    optim = "mp_rank_00_000/optim_dp000.pt" if distributed else "mp_rank_00_000/optim.pt"
    assert set(m["files"]) == {"mp_rank_00_000/model.safetensors", optim, "mp_rank_00_000/rng_dp000.pt",
                               "mp_rank_00_000/optim_state_dp000.safetensors"}
    assert m["optimizer_state"] == "per_parameter"
    assert sorted(os.listdir(tmp_path)) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


@pytest.mark.parametrize("distributed", [True, False])
def test_a_checkpoint_of_the_earlier_format_still_resumes_exactly(gloo_world1, tmp_path, distributed):
    """Before 2026-11-30 the optimizer's state was saved as laid out (its torch state dicts; the
    distributed optimizer's shards per DP rank): such checkpoints still resume at their layout."""
    from mindspeed_rl.models.checkpoint import MANIFEST, load_checkpoint, save_checkpoint

    ddp, opt, sched = _trained(7, distributed, False)
    _step(ddp, opt, sched, 0)
    path = tmp_path / "iter_0000001"
    save_checkpoint(str(tmp_path), 1, ddp, ARGS, opt, sched)
    here = path / "mp_rank_00_000"  # rewritten as the earlier version wrote it
    (here / "optim_state_dp000.safetensors").unlink()
    if distributed:
        shards = [{"inner": o.optimizer.state_dict(), "grad_scaler": None,
                   "main_params": [p.detach().clone() for g in o.optimizer.param_groups for p in g["params"]]}
                  for o in getattr(opt, "chained_optimizers", [opt])]
        torch.save({"shards": shards, "scheduler": sched.state_dict()}, here / "optim_dp000.pt")
    else:
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, here / "optim.pt")
    m = json.loads((path / MANIFEST).read_text())
    m.pop("optimizer_state")
    m["files"] = {str(f.relative_to(path)): f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name != MANIFEST}
    (path / MANIFEST).write_text(json.dumps(m))
    _step(ddp, opt, sched, 1)
    ddp2, opt2, sched2 = _trained(99, distributed, False)
    assert load_checkpoint(str(tmp_path), ddp2, ARGS, opt2, sched2) == 1
    _step(ddp2, opt2, sched2, 1)
    for a, b in zip(ddp.module.parameters(), ddp2.module.parameters()):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("distributed", [True, False])
def test_a_param_group_step_count_resumes(gloo_world1, tmp_path, distributed):
    """Apex's and Transformer Engine's fused Adam count steps in the param group, not per parameter
    (torch's Adam ignores the key): the count is saved with each parameter and comes back."""
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint

    ddp, opt, sched = _trained(7, distributed, False)
    _step(ddp, opt, sched, 0)
    for o in getattr(opt, "chained_optimizers", [opt]):
        for group in o.optimizer.param_groups:
            group["step"] = 5
    save_checkpoint(str(tmp_path), 1, ddp, ARGS, opt, sched)
    ddp2, opt2, sched2 = _trained(99, distributed, False)
    load_checkpoint(str(tmp_path), ddp2, ARGS, opt2, sched2)
    steps = [g.get("step") for o in getattr(opt2, "chained_optimizers", [opt2]) for g in o.optimizer.param_groups]
    assert steps and all(s == 5 and isinstance(s, int) for s in steps), steps


def _rewrite_state(path, edit):
    """Apply edit(tensors, slices, scalars) to the checkpoint's optimizer state file (the manifest's sizes follow)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from mindspeed_rl.models.checkpoint import MANIFEST

    file = path / "mp_rank_00_000" / "optim_state_dp000.safetensors"
    with safe_open(str(file), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    slices, scalars = json.loads(meta["slices"]), json.loads(meta["scalars"])
    edit(tensors, slices, scalars)
    save_file(tensors, str(file), metadata={"slices": json.dumps(slices), "scalars": json.dumps(scalars)})
    m = json.loads((path / MANIFEST).read_text())
    m["files"]["mp_rank_00_000/optim_state_dp000.safetensors"] = file.stat().st_size
    (path / MANIFEST).write_text(json.dumps(m))


def test_missing_or_partial_optimizer_state_is_named(gloo_world1, tmp_path):
    from mindspeed_rl.models import optimizer_state
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint
    from mindspeed_rl.utils.errors import UserInputError

    ddp, opt, sched = _trained(7, False)
    _step(ddp, opt, sched, 0)
    save_checkpoint(str(tmp_path), 1, ddp, ARGS, opt, sched)
    path, name = tmp_path / "iter_0000001", "decoder.final_layernorm.weight"

    def drop(tensors, slices, scalars):
        for key in [k for k in tensors if k.endswith("/" + name)]:
            del tensors[key]
        del slices[name]

    def shorten(tensors, slices, scalars):
        for key in [k for k in tensors if k.endswith("/" + name)]:
            tensors[key] = tensors[key][:-1].clone()
        slices[name][1] -= 1

    _rewrite_state(path, shorten)
    with pytest.raises(UserInputError, match=rf"optimizer state of {name} in .*mp_rank_00_000 covers 31 of its 32 "
                                             r"elements; a DP rank's optim_state file is missing"):
        load_checkpoint(str(tmp_path), ddp, ARGS, opt, sched)
    _rewrite_state(path, drop)
    with pytest.raises(UserInputError, match=rf"mp_rank_00_000 holds no optimizer state for {name}; .*start from its "
                                             r"weights alone with actor_rollout_ref.actor_rollout.load: .*iter_0000001"):
        load_checkpoint(str(tmp_path), ddp, ARGS, opt, sched)

    def differ(tensors, slices, scalars):  # the step counts another layout would have to share
        scalars[next(iter(scalars))]["step"] = 7.0

    _rewrite_state(path, differ)
    with pytest.raises(UserInputError, match=r"optimizer step counts differ \(\{'step': \[1.0, 7.0\]\}\), so they cannot be "
                                             r"re-sharded; resume at the saved TP/PP/DP, or start from its weights alone"):
        optimizer_state._SliceIndex(str(path)).shared_scalars()


def test_architecture_mismatch_and_layout_change_are_named(gloo_world1, tmp_path):
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint
    from mindspeed_rl.utils.errors import UserInputError

    ddp, opt, sched = _trained(7, True)
    _step(ddp, opt, sched, 0)
    save_checkpoint(str(tmp_path), 1, ddp, ARGS, opt, sched)
    with pytest.raises(UserInputError, match=r"iter_0000001 was saved with num_query_groups 2 but the model config says 4"):
        load_checkpoint(str(tmp_path), ddp, dict(ARGS, num_query_groups=4), opt, sched)
    manifest = tmp_path / "iter_0000001" / "manifest.json"  # pretend it was saved at DP=2 by a version whose
    m = json.loads(manifest.read_text())                     # optimizer state was laid out per TP/PP/DP
    manifest.write_text(json.dumps({k: v for k, v in dict(m, dp=2).items() if k != "optimizer_state"}))
    with pytest.raises(UserInputError, match=r"optimizer state for TP=1 PP=1 VPP=1 DP=2 but this run is TP=1 PP=1 VPP=1 DP=1; .*no_load_optim"):
        load_checkpoint(str(tmp_path), ddp, ARGS, opt, sched)
    assert load_checkpoint(str(tmp_path), ddp, ARGS, opt, sched, load_optimizer=False) == 1
    manifest.write_text(json.dumps(dict(m, dp=2)))  # per-parameter state: any DP
    assert load_checkpoint(str(tmp_path), ddp, ARGS, opt, sched) == 1


def test_load_weights_takes_either_format(gloo_world1, tmp_path):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.checkpoint import chunk_state_dict, load_weights, save_checkpoint
    from mindspeed_rl.models.hf_bridge import read_hf_config

    make_tiny_hf("qwen3", str(tmp_path / "hf"))
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path / "hf"))), padded_vocab_size=128)
    init_parallel_state(1, 1, seed=1)
    model = build_gpt_model(args)
    assert load_weights(model, str(tmp_path / "hf"), args) == 0
    save_checkpoint(str(tmp_path / "mg"), 4, model, args, vocab_size=120)
    init_parallel_state(1, 1, seed=2)
    other = build_gpt_model(args)
    assert load_weights(other, str(tmp_path / "mg" / "iter_0000004"), args) == 4
    for (name, a), b in zip(chunk_state_dict(model).items(), chunk_state_dict(other).values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma3_text", "olmo2", "qwen3_5_text", "granitemoehybrid-h",
                                  "nemotron_h", "falcon_h1", "falcon_h1-nonorm", "lfm2", "gemma4_text-ple"])
def test_stage_param_names_match_the_model(gloo_world1, tmp_path, arch):
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.checkpoint import chunk_state_dict
    from mindspeed_rl.models.hf_bridge import read_hf_config
    from mindspeed_rl.models.hf_bridge.sharding import stage_param_names

    make_tiny_hf(arch.split("-")[0], str(tmp_path), **HF_VARIANTS.get(arch, {}))
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    assert list(chunk_state_dict(build_gpt_model(args))) == stage_param_names(args, 1, 0)


def load_exported(out):
    """transformers model from an exported directory. from_config + the safetensors files rather than
    from_pretrained: in a process where megatron's initialize_model_parallel ran, transformers 5.x
    from_pretrained leaves the rotary inv_freq buffer uninitialised (see tests/dist/models/
    test_checkpoint_dist.py, which runs from_pretrained in a clean process)."""
    import transformers
    from safetensors.torch import load_file

    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(out)).eval()
    tensors = {}
    for name in os.listdir(out):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(out, name)))
    if model.config.model_type == "gpt_neox":  # transformers 5 names embed_out lm_head, renaming it when it loads
        tensors = {("lm_head." + k[len("embed_out."):] if k.startswith("embed_out.") else k): v for k, v in tensors.items()}
    if model.config.model_type == "nemotron_h":  # saved as its releases are (backbone.*, experts one by one), renamed
        # and stacked as transformers loads them
        import re

        tensors = {("model." + k[len("backbone."):] if k.startswith("backbone.") else k): v for k, v in tensors.items()}
        expert = re.compile(r"^(.*\.mixer\.experts)\.(\d+)\.(up|down)_proj\.weight$")
        stacked = {}
        for k in sorted(k for k in tensors if expert.match(k)):
            m = expert.match(k)
            stacked.setdefault(f"{m.group(1)}.{m.group(3)}_proj", {})[int(m.group(2))] = tensors.pop(k)
        tensors.update({k: torch.stack([v[e] for e in sorted(v)]) for k, v in stacked.items()})
    if model.config.model_type == "exaone":  # saved under its releases' names, renamed as transformers loads them
        import re

        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        for rule in get_checkpoint_conversion_mapping("exaone"):
            tensors = {re.sub(rule.source_patterns[0], rule.target_patterns[0], k): v for k, v in tensors.items()}
    if model.config.model_type == "lfm2_moe":  # saved as its releases are (experts one by one, w1 / w3 / w2), stacked
        # as transformers loads them: gate_up_proj (E, 2f, h) with each expert's w1 then w3, down_proj (E, h, f)
        import re

        expert = re.compile(r"^(.*\.feed_forward\.experts)\.(\d+)\.(w1|w2|w3)\.weight$")
        parts = {}
        for k in [k for k in tensors if expert.match(k)]:
            m = expert.match(k)
            parts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = tensors.pop(k)
        for prefix, p in parts.items():
            experts = sorted({e for e, _ in p})
            tensors[prefix + ".gate_up_proj"] = torch.stack([torch.cat([p[(e, "w1")], p[(e, "w3")]]) for e in experts])
            tensors[prefix + ".down_proj"] = torch.stack([p[(e, "w2")] for e in experts])
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied: lm_head is the embedding
    return model


@pytest.mark.parametrize("arch,synthesize", [("llama", True), ("qwen2", False), ("qwen3", True),
                                             ("gemma3_text", True), ("gemma2", True), ("phi3-partial", True),
                                             ("mixtral", True), ("olmo2", True), ("olmo3", True), ("stablelm", True),
                                             ("starcoder2", True), ("nemotron", True),
                                             ("cohere2", True), ("phi", True),
                                             ("gpt_neox", True), ("gpt_neox-seq", True), ("falcon", True),
                                             ("falcon-40b", True), ("falcon-11b", True), ("falcon-seq", False),
                                             ("olmo-clip", True), ("granitemoehybrid-h", True),
                                             ("granitemoehybrid-hmoe", True), ("nemotron_h", True),
                                             ("nemotron_h-moe", True), ("falcon_h1", True),
                                             ("falcon_h1-nonorm", True), ("lfm2", True), ("lfm2-idxs", True),
                                             ("lfm2_moe", True), ("exaone", False),
                                             ("exaone_moe", True), ("hyperclovax", True), ("hy_v3", False), ("afmoe", False), ("afmoe", True), ("sarvam_moe", False), ("jais2", True), ("mellum", False), ("mellum", True), ("gemma4_text", False), ("gemma4_text", True), ("gemma4_text-kv", True), ("gemma4_text-moe", True), ("gemma4_text-ple", True), ("youtu", True), ("mimo", False), ("nanochat", True), ("nanochat", False), ("vaultgemma", True), ("vaultgemma", False)])
def test_live_export_loads_in_transformers(gloo_world1, tmp_path, arch, synthesize):
    """synthesize: config.json written from the Megatron args (a yaml-built model or a Megatron
    checkpoint): Gemma 3 / 2 in their own config.json, partial rotary as Phi-3's, and the tensors
    under the names of the model type written (Mixtral's experts were written under the canonical names
    before, which transformers did not load); Granite 4.0-H's in_proj / conv1d put together whole from their parts, in
    the config.json written from the Mamba-2 keys (hf_granite_config.granite_hybrid_export_config)."""
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.hf_export import export_hf

    hf = make_tiny_hf(arch.split("-")[0], str(tmp_path / "hf"), **HF_VARIANTS.get(arch, {}))
    (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")  # stands in for the tokenizer files
    config = read_hf_config(str(tmp_path / "hf"))
    args = dict(model_config_from_hf(config), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path / "hf"), args)
    out = export_hf(model, args, str(tmp_path / "out"), vocab_size=120, hf_config=None if synthesize else config,
                    tokenizer_dir=str(tmp_path / "hf"))
    assert os.path.isfile(os.path.join(out, "tokenizer_config.json"))
    if arch in ("mixtral", "granitemoehybrid-hmoe", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe", "mellum"):  # transformers 5 converts experts in from_pretrained: the files
        from safetensors.torch import load_file

        assert json.loads(open(os.path.join(out, "config.json")).read())["model_type"] == arch.split("-")[0]
        want, got = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(os.path.join(out, "model.safetensors"))
        assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in want)
        return
    again = load_exported(out)
    assert type(again) is type(hf)
    ids = torch.randint(0, 120, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, hf(input_ids=ids).logits, rtol=0, atol=1e-5)
    for name, tensor in hf.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_keep_last_n_and_trainer_state(gloo_world1, tmp_path):
    from mindspeed_rl.models.checkpoint import complete_checkpoints, latest_complete, read_manifest, read_trainer_state, save_checkpoint

    ddp, opt, sched = _trained(7, True)
    for step in (1, 2, 3):
        save_checkpoint(str(tmp_path), step, ddp, ARGS, opt, sched, trainer_state={"step": step, "loader": {"position": step}},
                        manifest_extra={"config_hash": "abc"}, keep_last_n=2)
    assert [s for s, _ in complete_checkpoints(str(tmp_path))] == [2, 3]
    assert latest_complete(str(tmp_path)).endswith("iter_0000003")
    assert read_trainer_state(str(tmp_path)) == {"step": 3, "loader": {"position": 3}}
    m = read_manifest(str(tmp_path))
    assert m["config_hash"] == "abc" and "trainer_state.json" in m["files"]


KILL_AT_WRITE = r"""
import os, signal, sys, datetime, torch
sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r})
from testing_utils import free_port
os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(free_port())
torch.distributed.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
from tests.unit.models.test_checkpoint import _trained, ARGS
from mindspeed_rl.models import checkpoint as ckpt
ddp, opt, sched = _trained(7, True)
ckpt.save_checkpoint({save!r}, 1, ddp, ARGS, opt, sched, trainer_state={{"step": 1}})
where = {where!r}
if where == "files":  # die while the rank files are being written
    real = ckpt.save_file
    def dying(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        os.kill(os.getpid(), signal.SIGKILL)
    ckpt.save_file = dying
else:  # die after the rename, before latest_checkpointed_iteration.txt is updated
    real_replace = os.replace
    def dying_replace(src, dst):
        real_replace(src, dst)
        if not src.endswith(".tmp") or "latest" in src:
            return
        os.kill(os.getpid(), signal.SIGKILL)
    ckpt.os.replace = dying_replace
ckpt.save_checkpoint({save!r}, 2, ddp, ARGS, opt, sched, trainer_state={{"step": 2}})
print("not killed")
"""


@pytest.mark.parametrize("where", ["files", "rename"])
def test_sigkill_during_checkpoint_write(gloo_world1, tmp_path, where):
    """A process SIGKILLed while writing step 2: step 1 stays loadable; the partial step 2 is
    ignored (killed in the files) or complete and found (killed between rename and LATEST)."""
    import subprocess
    import sys
    from pathlib import Path

    from mindspeed_rl.models.checkpoint import latest_complete, load_checkpoint, read_trainer_state

    root = Path(__file__).resolve().parents[3]
    save = str(tmp_path / "ckpt")
    script = KILL_AT_WRITE.format(tests=str(root / "tests"), root=str(root), save=save, where=where)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == -9, proc.stdout + proc.stderr[-2000:]
    names = sorted(os.listdir(save))
    latest = open(os.path.join(save, "latest_checkpointed_iteration.txt")).read()
    assert latest == "1"  # the pointer never moved
    if where == "files":
        assert "iter_0000002.tmp" in names and "iter_0000002" not in names
        expected = 1
    else:
        assert "iter_0000002" in names  # renamed = complete: every file matches the manifest
        expected = 2
    path = latest_complete(save)
    assert read_trainer_state(path)["step"] == expected
    ddp, opt, sched = _trained(99, True)
    assert load_checkpoint(path, ddp, ARGS, opt, sched) == expected


def test_export_keeps_the_multi_token_prediction_layers(gloo_world1, tmp_path):
    """DeepSeek-V3 and GLM-4.5 store num_nextn_predict_layers multi-token-prediction layers after the
    last layer; RL does not train them. An export copies them unchanged from the checkpoint the run
    started from (bit for bit, in their own shard, and transformers still loads the directory); without
    that checkpoint config.json says 0 instead of announcing layers the export lacks."""
    from safetensors.torch import load_file

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.hf_bridge.checkpoint_io import SafetensorsReader
    from mindspeed_rl.models.hf_export import MTP_FILE, export_hf

    hf = tmp_path / "hf"
    make_tiny_hf("deepseek_v3", str(hf))
    weights = load_file(str(hf / "model.safetensors"))
    mtp = add_mtp_layer(str(hf))
    config = read_hf_config(str(hf))
    assert config["num_nextn_predict_layers"] == 1  # transformers' DeepSeek-V3 default
    args = dict(model_config_from_hf(config), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(hf), args)

    out = export_hf(model, args, str(tmp_path / "out"), vocab_size=120, hf_config=config, mtp_source=str(hf))
    copied = load_file(os.path.join(out, MTP_FILE))  # under the names the checkpoint stores them
    assert set(copied) == set(mtp) and all(torch.equal(copied[n], t) for n, t in mtp.items())
    index = json.loads(open(os.path.join(out, "model.safetensors.index.json")).read())["weight_map"]
    assert {n for n, f in index.items() if f == MTP_FILE} == set(mtp) and len(index) == len(weights) + len(mtp)
    assert json.loads(open(os.path.join(out, "config.json")).read())["num_nextn_predict_layers"] == 1
    import transformers

    transformers.AutoModelForCausalLM.from_pretrained(out)  # loads (transformers skips the MTP layer)

    bare = export_hf(model, args, str(tmp_path / "bare"), vocab_size=120, hf_config=config)
    assert json.loads(open(os.path.join(bare, "config.json")).read())["num_nextn_predict_layers"] == 0
    assert not any(n.startswith("model.layers.2.") for n in SafetensorsReader(bare).weight_map)
