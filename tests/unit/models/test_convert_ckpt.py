"""convert_ckpt.py: HF -> mg(TP=a,PP=b) -> mg(TP=c,PP=d) -> HF is bit for bit, the manifest and
atomic-write protocol, and one-sentence errors (exit 2, no traceback) for bad input."""

import json
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

from testing_utils import HF_VARIANTS, add_mtp_layer, make_tiny_hf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
import convert_ckpt  # noqa: E402


def _hf_tensors(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name)))
    return out


def _run(*argv):
    return convert_ckpt.main([str(a) for a in argv])


@pytest.mark.parametrize("arch,first,second", [("llama", (2, 2), (1, 1)), ("qwen2", (1, 2), (2, 1)),
                                               ("qwen3", (2, 1), (1, 2)), ("mistral", (2, 1), (1, 1)),
                                               ("mixtral", (2, 1), (1, 1)), ("phi3", (2, 2), (1, 1)),
                                               ("smollm3", (1, 2), (2, 1)), ("granite", (2, 1), (1, 2)),
                                               ("gemma3_text", (2, 2), (1, 1)), ("gemma2", (2, 1), (1, 2)),
                                               ("gemma", (1, 2), (2, 1)), ("olmo3", (2, 2), (1, 1)),
                                               ("exaone4", (1, 2), (2, 1)), ("glm4", (2, 2), (1, 1)),
                                               ("arcee", (2, 1), (1, 2)), ("glm4_moe", (2, 2), (1, 1)),
                                               ("deepseek_v3", (2, 2), (1, 1)), ("deepseek_v2", (2, 1), (1, 2)),
                                               ("minimax_m2", (2, 1), (1, 2)), ("glm4_moe_lite", (2, 1), (1, 2)),
                                               ("ernie4_5_moe", (2, 1), (1, 2)), ("apertus", (2, 2), (1, 1)),
                                               ("qwen3_5_text", (2, 2), (1, 1)), ("qwen3_5_moe_text", (2, 1), (1, 2)),
                                               ("qwen3_next", (2, 2), (1, 1)), ("olmoe", (2, 1), (1, 2)),
                                               ("flex_olmo", (2, 2), (1, 1)), ("hunyuan_v1_dense", (2, 1), (1, 2)),
                                               ("hunyuan_v1_moe", (2, 2), (1, 1)), ("granitemoe", (2, 1), (1, 2)),
                                               ("granitemoeshared", (2, 2), (1, 1)),
                                               ("granitemoehybrid", (1, 2), (2, 1)), ("glm", (2, 1), (1, 2)),
                                               ("helium", (2, 2), (1, 1)), ("stablelm", (2, 1), (1, 2)),
                                               ("starcoder2", (2, 2), (1, 1)), ("nemotron", (2, 1), (1, 2)),
                                               ("cohere2", (2, 2), (1, 1)), ("phi", (2, 1), (1, 2)),
                                               ("gpt_neox", (2, 1), (1, 2)), ("falcon-40b", (2, 1), (1, 2)),
                                               ("olmo-clip", (2, 2), (1, 1)), ("granitemoehybrid-h", (2, 2), (1, 1)),
                                               ("granitemoehybrid-hmoe", (2, 1), (1, 2)), ("nemotron_h", (2, 2), (1, 1)),
                                               ("falcon_h1", (2, 2), (1, 1)), ("lfm2", (2, 2), (1, 1)),
                                               ("lfm2_moe", (2, 2), (1, 1)), ("exaone", (2, 1), (1, 2)),
                                               ("exaone_moe", (2, 2), (1, 1)), ("hy_v3", (2, 2), (1, 1)), ("afmoe", (2, 2), (1, 1)), ("sarvam_moe", (2, 1), (1, 2)), ("sarvam_mla", (2, 2), (1, 1)), ("youtu", (2, 1), (1, 2)), ("mimo", (2, 1), (1, 2)), ("nanochat", (2, 1), (1, 2)), ("vaultgemma", (2, 2), (1, 1)), ("dots1", (2, 2), (1, 1)), ("solar_open", (2, 1), (1, 2)), ("jais2", (2, 1), (1, 2)), ("mellum", (2, 2), (1, 1)), ("hyperclovax", (2, 1), (1, 2)), ("gemma4_text", (2, 2), (1, 1)), ("gemma4_text-kv", (2, 1), (1, 2)), ("gemma4_text-moe", (2, 2), (1, 1)), ("gemma4_text-ple", (2, 1), (1, 1))])
def test_round_trip_is_bit_exact(tmp_path, arch, first, second):
    """HF -> mg -> mg -> HF: every tensor back bit for bit under its stored name and layout (Mixtral's
    names, Phi-3's fused q/k/v and gate/up, Gemma 3's norm names, DeepSeek-V3's multi-latent attention,
    MiniMax-M2's q / k norms split over TP and its expert bias beside the router, ERNIE 4.5 MoE's (1, E) expert bias
    and its MoE layers' placement, Apertus's norm names and 0-d xIELU buffers, Qwen3.5's Gated DeltaNet tensors
    grouped by key head over TP and its q_proj holding each head's gate, Qwen3-Next's in_proj_qkvz / in_proj_ba
    fused per key head, OLMoE's and FlexOlmo's q / k norms across heads split over TP, HunYuan's query_layernorm /
    key_layernorm, HunYuan-MoE's gate.wg and shared_mlp, Granite MoE's experts stacked as block_sparse_moe.input_linear /
    output_linear and router.layer, its shared_mlp's gate / up fused as input_linear, Granite 4.0's shared_mlp as its
    only MLP, GPT-NeoX's gpt_neox.* / embed_out and per-head query_key_value, Falcon-40B's ln_attn / ln_mlp and
    query_key_value per key / value head, Granite 4.0-H's Mamba-2 in_proj / conv1d read by part (z / x / dt split over
TP by heads, B / C whole) and written back whole)."""
    make_tiny_hf(arch.split("-")[0], tmp_path / "hf", max_shard_size="100KB" if arch == "qwen2" else None,
                 **HF_VARIANTS.get(arch, {}))
    a, b, back = tmp_path / "mg_a", tmp_path / "mg_b", tmp_path / "hf_back"
    assert _run("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", tmp_path / "hf",
                "--save-dir", a, "--target-tensor-parallel-size", first[0],
                "--target-pipeline-parallel-size", first[1], "--model-type-hf", {"llama": "llama3", "gemma3_text": "gemma3", "deepseek_v3": "deepseek3", "deepseek_v2": "deepseek2", "qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe", "hunyuan_v1_dense": "hunyuan", "hunyuan_v1_moe": "hunyuan_moe", "gemma4_text": "gemma4"}.get(arch.split("-")[0], arch.split("-")[0]),
                "--make-vocab-size-divisible-by", 16) == 0
    manifest = json.loads((a / "iter_0000000" / "manifest.json").read_text())
    assert (manifest["tp"], manifest["pp"], manifest["step"], manifest["vocab_size"]) == (*first, 0, 120)
    assert manifest["model_args"]["padded_vocab_size"] == 128  # 120 rounded up to a multiple of 16 x TP
    assert len([f for f in manifest["files"] if f.startswith("mp_rank_") and f.endswith("model.safetensors")]) == \
        first[0] * first[1]  # (an MoE model adds its expert_rank_* files)
    assert (a / "latest_checkpointed_iteration.txt").read_text() == "0"
    assert not any(p.name.endswith(".tmp") for p in a.iterdir())
    assert _run("--load-model-type", "mg", "--save-model-type", "mg", "--load-dir", a, "--save-dir", b,
                "--target-tensor-parallel-size", second[0], "--target-pipeline-parallel-size", second[1]) == 0
    assert _run("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", b, "--save-dir", back) == 0
    want, got = _hf_tensors(tmp_path / "hf"), _hf_tensors(back)
    if arch == "mimo":  # written back as the Qwen2 it is: its multi-token-prediction layer is not a Qwen2 tensor
        want = {n: t for n, t in want.items() if not n.startswith("model.mtp_layers.")}
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    config = json.loads((back / "config.json").read_text())
    # (Sarvam-105B is written back as the DeepSeek-V3 it is: hf_config.SAME_AS)
    assert config["model_type"] == {"sarvam_mla": "deepseek_v3", "mimo": "qwen2", "dots1": "glm4_moe", "solar_open": "glm4_moe"}.get(arch, arch.split("-")[0])
    assert config["vocab_size"] == 120


def test_multi_token_prediction_layers_through_convert_ckpt(tmp_path):
    """DeepSeek-V3's MTP layer (after the last layer; not a megatron parameter here): HF -> HF keeps it,
    HF -> mg -> HF copies it back from --hf-cfg-dir's checkpoint, and without that directory the export's
    config.json says num_nextn_predict_layers 0 instead of announcing a layer it lacks."""
    make_tiny_hf("deepseek_v3", tmp_path / "hf")
    mtp = add_mtp_layer(str(tmp_path / "hf"))
    hf_to_hf = ("--load-model-type", "hf", "--save-model-type", "hf", "--load-dir", tmp_path / "hf")
    assert _run(*hf_to_hf, "--save-dir", tmp_path / "same") == 0
    assert _run("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", tmp_path / "hf",
                "--save-dir", tmp_path / "mg", "--target-tensor-parallel-size", 2) == 0
    mg_to_hf = ("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp_path / "mg")
    assert _run(*mg_to_hf, "--save-dir", tmp_path / "back", "--hf-cfg-dir", tmp_path / "hf") == 0
    assert _run(*mg_to_hf, "--save-dir", tmp_path / "bare") == 0
    want = _hf_tensors(tmp_path / "hf")
    for kept in ("same", "back"):
        got = _hf_tensors(tmp_path / kept)
        assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in mtp), kept
        assert json.loads((tmp_path / kept / "config.json").read_text())["num_nextn_predict_layers"] == 1
    assert set(_hf_tensors(tmp_path / "bare")) == set(want) - set(mtp)
    assert json.loads((tmp_path / "bare" / "config.json").read_text())["num_nextn_predict_layers"] == 0


def test_megatron_files_hold_only_their_shards(tmp_path):
    make_tiny_hf("qwen3", tmp_path / "hf")
    assert _run("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", tmp_path / "hf",
                "--save-dir", tmp_path / "mg", "--target-tensor-parallel-size", 2,
                "--target-pipeline-parallel-size", 2, "--params-dtype", "bf16") == 0
    step = tmp_path / "mg" / "iter_0000000"
    first = load_file(step / "mp_rank_01_000" / "model.safetensors")
    last = load_file(step / "mp_rank_00_001" / "model.safetensors")
    assert "embedding.word_embeddings.weight" in first and "decoder.layers.0.mlp.linear_fc1.weight" in first
    assert "decoder.layers.1.mlp.linear_fc1.weight" in last and "output_layer.weight" in last  # global numbers
    assert first["decoder.layers.0.mlp.linear_fc1.weight"].shape == (128, 64)  # (2 * 128 / TP, h)
    assert first["embedding.word_embeddings.weight"].dtype == torch.bfloat16


def _write_mg(tmp_path):
    make_tiny_hf("llama", tmp_path / "hf")
    assert _run("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", tmp_path / "hf",
                "--save-dir", tmp_path / "mg") == 0
    return tmp_path / "mg" / "iter_0000000"


def test_incomplete_checkpoint_is_refused(tmp_path, capsys):
    step = _write_mg(tmp_path)
    model = step / "mp_rank_00_000" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:1000])  # a truncated copy
    assert _run("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp_path / "mg",
                "--save-dir", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "model.safetensors is 1000 bytes but manifest.json records" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_interrupted_save_leaves_no_latest(tmp_path):
    from mindspeed_rl.models.checkpoint import begin_write, is_megatron_checkpoint, resolve
    from mindspeed_rl.utils.errors import UserInputError

    tmp = begin_write(str(tmp_path), 5)  # a save that crashed before finish_write
    assert tmp.endswith("iter_0000005.tmp") and not is_megatron_checkpoint(str(tmp_path))
    with pytest.raises(UserInputError, match="has no manifest.json"):
        resolve(tmp)


@pytest.mark.parametrize("change,flags,match", [
    (None, ["--target-tensor-parallel-size", "3"], "tensor_model_parallel_size 3 does not divide num_attention_heads 4"),
    (None, ["--target-pipeline-parallel-size", "3"], "num_layers 2 is not divisible by pipeline_model_parallel_size 3"),
    (None, ["--model-type-hf", "qwen3"], "--model-type-hf qwen3 disagrees with model_type 'llama'"),
    ({"model_type": "deepseek_v32"}, [], "model_type .deepseek_v32. is not supported"),
    ({"hidden_act": "gelu"}, [], "config.json: config.json hidden_act 'gelu' is not supported"),
    ({"vocab_size": 100}, [], r"model.embed_tokens.weight in .* has shape \[120, 64\], which does not fit"),
    ({"intermediate_size": 96}, [], r"gate_proj.weight in .* has shape \[128, 64\], but config.json implies \[96, 64\]"),
])
def test_bad_input_is_one_sentence(tmp_path, capsys, change, flags, match):
    make_tiny_hf("llama", tmp_path / "hf")
    if change:
        path = tmp_path / "hf" / "config.json"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), **change)))
    capsys.readouterr()  # drop save_pretrained's progress bar
    code = _run("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", tmp_path / "hf",
                "--save-dir", tmp_path / "mg", *flags)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    import re
    assert re.search(match, err), err
    assert not (tmp_path / "mg" / "latest_checkpointed_iteration.txt").exists()


def test_corrupt_safetensors_shard_is_named(tmp_path, capsys):
    make_tiny_hf("qwen2", tmp_path / "hf", max_shard_size="100KB")
    shard = sorted((tmp_path / "hf").glob("model-*.safetensors"))[1]
    shard.write_bytes(b"\x00" * 64)
    assert _run("--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", tmp_path / "hf",
                "--save-dir", tmp_path / "mg") == 2
    err = capsys.readouterr().err
    assert f"{shard} is not a readable safetensors file" in err and "download it again" in err
    assert _run("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", tmp_path / "nowhere",
                "--save-dir", tmp_path / "x") == 2
    assert "does not exist" in capsys.readouterr().err


def test_virtual_pipeline_target_round_trip(tmp_path, capsys):
    """--num-layers-per-virtual-pipeline-stage: each PP rank's file holds the layers of its chunks
    (4 layers, PP 2, 1 layer per chunk: rank 0 layers 0 and 2, rank 1 layers 1 and 3), and the
    checkpoint converts back to HF bit for bit; a size that does not divide is one sentence."""
    make_tiny_hf("qwen3", tmp_path / "hf", num_hidden_layers=4)
    mg, back = tmp_path / "mg", tmp_path / "back"
    common = ["--load-model-type", "hf", "--save-model-type", "mg", "--load-dir", tmp_path / "hf",
              "--target-pipeline-parallel-size", 2]
    assert _run(*common, "--save-dir", mg, "--num-layers-per-virtual-pipeline-stage", 1) == 0
    assert "TP=1 PP=2 VPP=2" in capsys.readouterr().out
    step = mg / "iter_0000000"
    assert json.loads((step / "manifest.json").read_text())["vpp"] == 2
    for pp_rank, layers in ((0, {0, 2}), (1, {1, 3})):
        names = load_file(step / f"mp_rank_00_{pp_rank:03d}" / "model.safetensors").keys()
        assert {int(n.split(".")[2]) for n in names if n.startswith("decoder.layers.")} == layers
    assert ("embedding.word_embeddings.weight" in names) is False and "output_layer.weight" in names
    assert _run("--load-model-type", "mg", "--save-model-type", "hf", "--load-dir", mg, "--save-dir", back) == 0
    src, out = _hf_tensors(tmp_path / "hf"), _hf_tensors(back)
    assert src.keys() == out.keys() and all(torch.equal(src[k], out[k]) for k in src)
    assert _run(*common, "--save-dir", tmp_path / "bad", "--num-layers-per-virtual-pipeline-stage", 3) == 2
    err = capsys.readouterr().err
    assert "--num-layers-per-virtual-pipeline-stage 3 x --target-pipeline-parallel-size 2 must divide num_layers 4" in err
