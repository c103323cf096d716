"""hf_bridge: safetensors directory reading (single file, sharded index), one-sentence errors,
HF -> megatron layouts and back, TP shards."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from testing_utils import make_tiny_hf
from mindspeed_rl.models.builder import model_config_from_hf
from mindspeed_rl.models.hf_bridge import DictReader, SafetensorsReader, read_hf_config, to_hf
from mindspeed_rl.models.hf_bridge.mapping import Dims, hf_names, read_shard
from mindspeed_rl.utils.errors import UserInputError


@pytest.fixture(scope="module")
def qwen3_sharded(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("qwen3"))
    hf = make_tiny_hf("qwen3", out, max_shard_size="100KB")
    return out, {k: v.detach().clone() for k, v in hf.state_dict().items()}


def _full_mcore(reader, args, layers):
    """Full (TP=1) megatron state dict built through read_shard."""
    dims, tied = Dims.from_args(args), not args["untie_embeddings_and_output_weights"]
    names = ["embedding.word_embeddings.weight", "decoder.final_layernorm.weight"]
    names += [] if tied else ["output_layer.weight"]
    for i in range(layers):
        names += [f"decoder.layers.{i}.{n}" for n in (
            "input_layernorm.weight", "self_attention.linear_qkv.weight", "self_attention.q_layernorm.weight",
            "self_attention.k_layernorm.weight", "self_attention.linear_proj.weight",
            "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight")]
    return {n: read_shard(reader, *hf_names(n, None, tied), dims, 1, 0) for n in names}


def test_sharded_index_round_trips_through_megatron_layout(qwen3_sharded):
    hf_dir, hf_sd = qwen3_sharded
    assert os.path.isfile(os.path.join(hf_dir, "model.safetensors.index.json"))
    args = model_config_from_hf(read_hf_config(hf_dir))
    args["padded_vocab_size"] = 128
    mcore = _full_mcore(SafetensorsReader(hf_dir), args, layers=2)
    # (ng*(q+2)*hn, h) = (2*(2+2)*32, 64); padded vocab rows are zero
    assert mcore["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (256, 64)
    assert mcore["embedding.word_embeddings.weight"][120:].abs().sum() == 0
    back = to_hf(mcore, args, vocab_size=120)
    assert set(back) == set(hf_sd)
    for name, tensor in hf_sd.items():
        torch.testing.assert_close(back[name], tensor, rtol=0, atol=0, msg=name)


def test_tp_shards_are_slices_of_the_megatron_tensor(qwen3_sharded):
    hf_dir, hf_sd = qwen3_sharded
    args = model_config_from_hf(read_hf_config(hf_dir))
    args["padded_vocab_size"] = 128
    dims, reader = Dims.from_args(args), DictReader(hf_sd)
    full = _full_mcore(reader, args, layers=1)
    for name in ("decoder.layers.0.self_attention.linear_qkv.weight", "embedding.word_embeddings.weight"):
        shards = [read_shard(reader, *hf_names(name, None, False), dims, 2, r) for r in range(2)]
        torch.testing.assert_close(torch.cat(shards), full[name])  # column parallel: dim 0
    fc1 = [read_shard(reader, *hf_names("decoder.layers.0.mlp.linear_fc1.weight", None, False), dims, 2, r)
           for r in range(2)]
    gate, up = full["decoder.layers.0.mlp.linear_fc1.weight"].chunk(2)
    torch.testing.assert_close(fc1[1], torch.cat([gate.chunk(2)[1], up.chunk(2)[1]]))  # [gate_r | up_r]
    proj = [read_shard(reader, *hf_names("decoder.layers.0.self_attention.linear_proj.weight", None, False),
                       dims, 2, r) for r in range(2)]
    torch.testing.assert_close(torch.cat(proj, dim=1), full["decoder.layers.0.self_attention.linear_proj.weight"])


def test_missing_shard_is_named(qwen3_sharded, tmp_path):
    hf_dir, _ = qwen3_sharded
    with open(os.path.join(hf_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserInputError, match=r"shard file\(s\) model-0000\d-of-0000\d.safetensors.* missing"):
        SafetensorsReader(str(tmp_path))


def test_missing_tensor_and_shape_mismatch_are_named(tmp_path):
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4),
               "model.layers.0.self_attn.o_proj.weight": torch.zeros(4, 6)}, str(tmp_path / "model.safetensors"))
    reader = SafetensorsReader(str(tmp_path))
    dims = Dims(hidden=4, ffn=8, heads=2, groups=2, head_dim=2, vocab_padded=8)
    with pytest.raises(UserInputError, match="tensor model.norm.weight is not in the checkpoint"):
        read_shard(reader, "replicated", ("model.norm.weight",), dims, 1, 0)
    with pytest.raises(UserInputError, match=r"o_proj.weight in .*model.safetensors has shape \[4, 6\], but "
                                             r"config.json implies \[4, 4\]"):
        read_shard(reader, "row", ("model.layers.0.self_attn.o_proj.weight",), dims, 1, 0)


def test_not_a_checkpoint_directory(tmp_path):
    with pytest.raises(UserInputError, match="has neither model.safetensors nor"):
        SafetensorsReader(str(tmp_path))
    with pytest.raises(UserInputError, match="has no config.json"):
        read_hf_config(str(tmp_path))
