"""hf_bridge: safetensors directory reading (single file, sharded index), one-sentence errors,
HF -> megatron layouts and back, TP shards."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from testing_utils import HF_VARIANTS, make_tiny_hf
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
    (tmp_path / "pytorch_model.bin").write_bytes(b"")  # the older format: named, with the one-line conversion
    with pytest.raises(UserInputError, match=r"holds PyTorch .bin weights \(pytorch_model.bin\), which load: does not "
                                             r"read .*\.save_pretrained\('.*-safetensors'\)"):
        SafetensorsReader(str(tmp_path))


def test_mixtral_names_are_renamed_at_the_boundary_and_named_in_messages(tmp_path):
    """A Mixtral checkpoint stores the router and experts as block_sparse_moe.gate / experts.E.w1,w3,w2:
    the reader serves them under the canonical names (sharded index too), and a wrong or missing
    tensor is named as the checkpoint stores it."""
    from mindspeed_rl.models.hf_bridge.names import canonical_name, stored_name

    for canonical, stored in [("model.layers.3.mlp.experts.12.gate_proj.weight", "model.layers.3.block_sparse_moe.experts.12.w1.weight"),
                              ("model.layers.0.mlp.experts.1.up_proj.weight", "model.layers.0.block_sparse_moe.experts.1.w3.weight"),
                              ("model.layers.0.mlp.experts.0.down_proj.weight", "model.layers.0.block_sparse_moe.experts.0.w2.weight"),
                              ("model.layers.10.mlp.gate.weight", "model.layers.10.block_sparse_moe.gate.weight")]:
        assert stored_name(canonical, "mixtral") == stored and canonical_name(stored, "mixtral") == canonical
        assert stored_name(canonical, "qwen3_moe") == canonical and canonical_name(stored, None) == stored
    for dense in ("model.layers.1.mlp.gate_proj.weight", "model.layers.1.self_attn.q_proj.weight", "lm_head.weight"):
        assert stored_name(dense, "mixtral") == dense == canonical_name(dense, "mixtral")

    hf = make_tiny_hf("mixtral", str(tmp_path / "hf"), max_shard_size="100KB")
    reader = SafetensorsReader(str(tmp_path / "hf"))
    assert not any("block_sparse_moe" in k for k in reader.weight_map)
    w1 = reader.read("model.layers.1.mlp.experts.2.gate_proj.weight")
    gate_up = dict(hf.named_parameters())["model.layers.1.mlp.experts.gate_up_proj"]  # (E, 2f, h) in memory
    assert torch.equal(w1, gate_up[2].chunk(2, dim=0)[0].detach())
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path / "hf"))), padded_vocab_size=128)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"], args["norm_topk_prob"]) == (4, 2, 128, True)
    with pytest.raises(UserInputError, match=r"tensor model.layers.0.block_sparse_moe.experts.0.w1.weight in \S+ has "
                                             r"shape \[128, 64\], but config.json implies \[64, 64\]"):
        read_shard(reader, *hf_names("decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight", 0, False),
                   Dims.from_args(dict(args, moe_ffn_hidden_size=64)), 1, 0)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserInputError, match=r"tensor model.layers.1.block_sparse_moe.experts.3.w2.weight is not in "
                                             r"the checkpoint"):
        SafetensorsReader(str(tmp_path / "hf")).read("model.layers.1.mlp.experts.3.down_proj.weight")


def test_mixtral_jitter_noise_is_refused():
    from mindspeed_rl.models.hf_config import model_config_from_hf as from_hf

    config = {"model_type": "mixtral", "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "vocab_size": 120, "num_local_experts": 4, "num_experts_per_tok": 2,
              "router_jitter_noise": 0.1}
    with pytest.raises(ValueError, match=r"config.json router_jitter_noise 0.1 \(noise on the router logits in "
                                         r"training\) is not supported; set it to 0."):
        from_hf(config)
    windowed = from_hf(dict(config, router_jitter_noise=0.0, max_position_embeddings=32768, sliding_window=4096))
    assert (windowed["max_position_embeddings"], windowed["sliding_window"]) == (32768, 4096)


def test_phi3_fused_tensors_are_read_as_row_ranges_and_named_with_them(tmp_path):
    """Phi-3 stores [q; k; v] as qkv_proj and [gate; up] as gate_up_proj: the reader serves the
    canonical parts (and row ranges of them: a TP shard reads only its rows), a shape error names the
    fused tensor and the part's rows, and the writer fuses them back."""
    from mindspeed_rl.models.hf_bridge.names import fuse

    make_tiny_hf("phi3", str(tmp_path / "hf"))
    reader = SafetensorsReader(str(tmp_path / "hf"))
    assert "model.layers.0.self_attn.qkv_proj.weight" not in reader.weight_map
    stored = load_file(str(tmp_path / "hf" / "model.safetensors"))
    qkv = stored["model.layers.1.self_attn.qkv_proj.weight"]  # (4*16 + 2*2*16, 64)
    assert qkv.shape == (128, 64) and reader.shape("model.layers.1.self_attn.k_proj.weight") == (32, 64)
    assert torch.equal(reader.read("model.layers.1.self_attn.q_proj.weight"), qkv[:64])
    assert torch.equal(reader.read("model.layers.1.self_attn.v_proj.weight", rows=slice(16, 32)), qkv[112:128])
    assert torch.equal(reader.read("model.layers.1.mlp.up_proj.weight", cols=slice(0, 8)),
                       stored["model.layers.1.mlp.gate_up_proj.weight"][128:, :8])
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path / "hf"))), padded_vocab_size=128)
    with pytest.raises(UserInputError, match=r"tensor model.layers.0.self_attn.qkv_proj.weight \(rows 64-95, its "
                                             r"k_proj\) in \S+ has shape \[32, 64\], but config.json implies \[16, 64\]"):
        read_shard(reader, *hf_names("decoder.layers.0.self_attention.linear_qkv.weight", 0, True),
                   Dims.from_args(dict(args, num_query_groups=1)), 1, 0)
    canonical = {n: reader.read(n) for n in reader.weight_map}
    assert {k: v.shape for k, v in fuse(canonical, "phi3").items()} == {k: v.shape for k, v in stored.items()}
    assert all(torch.equal(fuse(canonical, "phi3")[k], v) for k, v in stored.items())
    del canonical["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="model.layers.0.mlp.gate_up_proj.weight needs model.layers.0.mlp.up_proj.weight"):
        fuse(canonical, "phi3")


def test_granite_stacked_experts_and_fused_shared_mlp_read_and_fed_as_stored(tmp_path):
    """Granite MoE keeps a layer's experts stacked as its modules hold them (block_sparse_moe.input_linear (E, 2f, h):
    gate rows then up rows per expert; output_linear (E, h, f)) and the shared MLP's gate / up fused
    (shared_mlp.input_linear): the reader serves each expert's and the shared MLP's canonical tensors as those
    modules compute with them, the writer restores every tensor bit for bit, and the vLLM weight feed (STORED_FORM),
    with the parts split over chunks in any order, hands vLLM the stored tensors once complete. Granite 4.0's dense
    checkpoint (granitemoehybrid without experts) calls its only MLP shared_mlp, and vLLM is given it as Granite;
    Granite 4.0-H (Mamba-2 layers) goes to vLLM as it is, its in_proj / conv1d read by part and fed whole;
    Cohere 2 is given to vLLM with its window one smaller (vllm_hf_config.vllm_config)."""
    import random

    from mindspeed_rl.models.hf_bridge.names import fuse, names_type, stored_name
    from mindspeed_rl.rollout.vllm_engine import STORED_FORM, grouped_chunks, vllm_config

    hf = make_tiny_hf("granitemoeshared", str(tmp_path / "hf"))
    reader, config = SafetensorsReader(str(tmp_path / "hf")), read_hf_config(str(tmp_path / "hf"))
    stored = load_file(str(tmp_path / "hf" / "model.safetensors"))
    layer, p = hf.model.layers[1], "model.layers.1."
    gate_up, down = layer.block_sparse_moe.experts.gate_up_proj, layer.block_sparse_moe.experts.down_proj
    assert reader.stored(p + "mlp.experts.2.up_proj.weight") == p + "block_sparse_moe.input_linear.weight[2] (its up)"
    assert torch.equal(reader.read(p + "mlp.experts.2.gate_proj.weight"), gate_up[2, :128].detach())
    assert torch.equal(reader.read(p + "mlp.experts.2.up_proj.weight"), gate_up[2, 128:].detach())
    assert torch.equal(reader.read(p + "mlp.experts.3.down_proj.weight"), down[3].detach())
    assert reader.shape(p + "mlp.experts.3.down_proj.weight") == (64, 128)
    assert torch.equal(reader.read(p + "mlp.gate.weight"), layer.block_sparse_moe.router.weight.detach())
    shared = layer.shared_mlp.input_linear.weight.detach()
    assert torch.equal(reader.read(p + "mlp.shared_expert.up_proj.weight"), shared[48:])
    assert torch.equal(reader.read(p + "mlp.shared_expert.down_proj.weight"), layer.shared_mlp.output_linear.weight.detach())
    canonical = {n: reader.read(n) for n in reader.weight_map}
    back = fuse(canonical, "granitemoeshared", config)
    assert set(back) == set(stored) and all(torch.equal(back[n], t) for n, t in stored.items())
    assert "granitemoeshared" in STORED_FORM
    items = list(canonical.items())
    random.Random(0).shuffle(items)
    fed = {stored_name(n, "granitemoeshared"): t  # as the engine names what it loads
           for chunk in grouped_chunks([items[i:i + 5] for i in range(0, len(items), 5)], "granitemoeshared", config)
           for n, t in chunk}
    assert set(fed) == set(stored) and all(torch.equal(fed[n], t) for n, t in stored.items())
    with pytest.raises(RuntimeError, match="model.layers.0.block_sparse_moe.input_linear.weight arrived incomplete"):
        list(grouped_chunks([[(n, t) for n, t in items if n != "model.layers.0.mlp.experts.3.up_proj.weight"]],
                            "granitemoeshared", config))
    dense = make_tiny_hf("granitemoehybrid", str(tmp_path / "dense"))
    dense_config = read_hf_config(str(tmp_path / "dense"))
    reader = SafetensorsReader(str(tmp_path / "dense"))
    assert names_type(dense_config) == "granitemoehybrid_dense"
    assert torch.equal(reader.read("model.layers.0.mlp.up_proj.weight"),
                       dense.model.layers[0].shared_mlp.input_linear.weight[96:].detach())
    assert reader.stored("model.layers.0.mlp.down_proj.weight") == "model.layers.0.shared_mlp.output_linear.weight"
    served = vllm_config(dense_config)
    assert (served["model_type"], served["architectures"], served["intermediate_size"]) == (
        "granite", ["GraniteForCausalLM"], 96)
    assert not any(k.startswith("mamba_") or k == "layer_types" for k in served)
    with_experts = vllm_config(dict(dense_config, num_local_experts=4, num_experts_per_tok=2))
    assert (with_experts["model_type"], with_experts["intermediate_size"]) == ("granitemoeshared", 128)
    bare = {k: v for k, v in dense_config.items() if k != "shared_intermediate_size"}  # transformers' default: 1024
    assert vllm_config(dict(bare, num_local_experts=4))["shared_intermediate_size"] == 1024
    # Granite 4.0-H (and attention without RoPE): vLLM's GraniteMoeHybridForCausalLM as it is; its Mamba-2 in_proj /
    # conv1d read by part and handed to vLLM whole, from parts arriving in any order and chunk
    make_tiny_hf("granitemoehybrid", str(tmp_path / "h"), **HF_VARIANTS["granitemoehybrid-h"])
    h_config = read_hf_config(str(tmp_path / "h"))
    assert vllm_config(h_config) == h_config and vllm_config(dict(dense_config, position_embedding_type="nope")) == \
        dict(dense_config, position_embedding_type="nope")
    stored = load_file(str(tmp_path / "h" / "model.safetensors"))
    reader = SafetensorsReader(str(tmp_path / "h"))
    p = "model.layers.0.mamba."
    z, x, bc, dt = (reader.read(p + f"in_proj_{k}.weight") for k in ("z", "x", "bc", "dt"))
    assert torch.equal(torch.cat([z, x, bc, dt]), stored[p + "in_proj.weight"]) and z.shape == (128, 64)
    assert torch.equal(reader.read(p + "conv1d_bc.bias"), stored[p + "conv1d.bias"][128:])
    kind = names_type(h_config)
    assert kind in STORED_FORM
    items = [(n, reader.read(n)) for n in reader.weight_map]
    random.Random(1).shuffle(items)
    fed = {stored_name(n, kind): t for chunk in grouped_chunks([items[i:i + 3] for i in range(0, len(items), 3)],
                                                               kind, h_config) for n, t in chunk}
    assert set(fed) == set(stored) and all(torch.equal(fed[n], t) for n, t in stored.items())
    # Cohere 2: vLLM's sliding layers see sliding_window + 1 positions, the trainer's (and transformers') sliding_window
    cohere2 = {"model_type": "cohere2", "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"]}
    assert vllm_config(cohere2) == dict(cohere2, sliding_window=4095)
    assert vllm_config({"model_type": "cohere", "sliding_window": 4096})["sliding_window"] == 4096


def test_qwen3_next_grouped_delta_projections_read_as_transformers_splits_them(tmp_path):
    """Qwen3-Next keeps Gated DeltaNet's projections fused per key head (in_proj_qkvz: [q|k|v|z] of each key head,
    in_proj_ba: [b|a]): the reader serves the canonical in_proj_qkv / _z / _b / _a exactly as transformers' own
    fix_query_key_value_ordering splits them (and row ranges of them: a TP shard's key heads), a stored tensor
    whose rows config.json does not imply is refused naming it, and the writer (and the vLLM weight feed, with
    a layer's parts split over chunks in any order) groups them back bit for bit; in block FP8 (the -FP8
    releases) each part's rows are its tiles' dequantized values."""
    import random

    from mindspeed_rl.models.hf_bridge.names import fuse
    from mindspeed_rl.rollout.vllm_engine import grouped_chunks

    hf = make_tiny_hf("qwen3_next", str(tmp_path / "hf"), num_hidden_layers=4)
    reader, config = SafetensorsReader(str(tmp_path / "hf")), read_hf_config(str(tmp_path / "hf"))
    stored = load_file(str(tmp_path / "hf" / "model.safetensors"))
    attn, p = hf.model.layers[2].linear_attn, "model.layers.2.linear_attn."
    assert p + "in_proj_qkvz.weight" not in reader.weight_map
    with torch.no_grad():  # transformers' split of the projected rows = the weight's rows (x = identity)
        eye = torch.eye(64)[None]
        q, k, v, z, b, a = attn.fix_query_key_value_ordering(attn.in_proj_qkvz(eye), attn.in_proj_ba(eye))
    rows = lambda t: t.reshape(64, -1).t()  # noqa: E731 (the 64 "tokens" are the weight's columns)
    want = {"in_proj_qkv": torch.cat([rows(q), rows(k), rows(v)]), "in_proj_z": rows(z), "in_proj_b": rows(b),
            "in_proj_a": rows(a)}
    for name, tensor in want.items():
        assert reader.shape(p + name + ".weight") == tuple(tensor.shape)
        torch.testing.assert_close(reader.read(p + name + ".weight"), tensor, rtol=0, atol=1e-6)
    qkv = reader.read(p + "in_proj_qkv.weight")
    assert torch.equal(reader.read(p + "in_proj_qkv.weight", rows=slice(16, 40), cols=slice(3, 9)), qkv[16:40, 3:9])
    assert reader.stored(p + "in_proj_b.weight") == p + "in_proj_ba.weight (its in_proj_b rows of every head group)"
    canonical = {n: reader.read(n) for n in reader.weight_map}
    back = fuse(canonical, "qwen3_next", config)
    assert set(back) == set(stored) and all(torch.equal(back[n], t) for n, t in stored.items())
    items = list(canonical.items())
    random.Random(0).shuffle(items)
    fed = dict(kv for chunk in grouped_chunks([items[i:i + 5] for i in range(0, len(items), 5)], "qwen3_next", config)
               for kv in chunk)
    assert set(fed) == set(stored) and all(torch.equal(fed[n], t) for n, t in stored.items())
    with pytest.raises(RuntimeError, match="model.layers.0.linear_attn.in_proj_ba.weight arrived incomplete"):
        list(grouped_chunks([[(n, t) for n, t in items if not n.endswith("layers.0.linear_attn.in_proj_a.weight")]],
                            "qwen3_next", config))
    with pytest.raises(ValueError, match="in_proj_qkvz.weight needs model.layers.2.linear_attn.in_proj_z.weight"):
        fuse({n: t for n, t in canonical.items() if n != p + "in_proj_z.weight"}, "qwen3_next", config)
    from testing_utils import fp8_blockwise  # Qwen3-Next-80B-A3B-*-FP8's format: the rows picked after dequantizing

    from mindspeed_rl.models.hf_bridge.names import grouped_parts

    make_tiny_hf("qwen3_next", str(tmp_path / "wide"), linear_key_head_dim=48)  # in_proj_qkvz: 2 x 128 rows, 2 tiles
    values = fp8_blockwise(str(tmp_path / "wide"), str(tmp_path / "fp8"))
    quantized = SafetensorsReader(str(tmp_path / "fp8"))
    qkvz = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    for part, rows in grouped_parts(qkvz, read_hf_config(str(tmp_path / "fp8"))):
        assert quantized.quantized(part) and torch.equal(quantized.read(part), values[qkvz][rows])
        assert torch.equal(quantized.read(part, rows=slice(40, 90)), values[qkvz][rows[40:90]])
    assert values[qkvz].shape[0] == 256
    config["linear_key_head_dim"] = 8  # not the checkpoint's
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserInputError, match=r"tensor model.layers.0.linear_attn.in_proj_qkvz.weight in \S+ has 128 "
                                             r"rows, but config.json's linear_num_\* / linear_\*_head_dim imply 96"):
        SafetensorsReader(str(tmp_path / "hf")).read("model.layers.0.linear_attn.in_proj_z.weight")


def test_gpt_neox_names_and_per_head_qkv_read_and_written_as_stored(tmp_path):
    """GPT-NeoX / Pythia keep their model under gpt_neox. (embed_in, final_layer_norm), lm_head as embed_out and each
    head's [q | k | v] in one query_key_value (weight and bias): the reader serves the canonical names (q / k / v
    exactly as transformers' attention splits the projection), names the stored tensor in messages, and the writer
    and the vLLM weight feed give the stored names and layout back bit for bit. The causal-mask buffers Pythia's
    releases (transformers 4.24) saved beside the weights (attention.bias, attention.masked_bias,
    rotary_emb.inv_freq) are never asked for."""
    from mindspeed_rl.models.hf_bridge.names import canonical_name, fuse, stored_name
    from mindspeed_rl.rollout.vllm_engine import grouped_chunks

    hf = make_tiny_hf("gpt_neox", str(tmp_path / "hf"))
    stored = load_file(str(tmp_path / "hf" / "model.safetensors"))
    released = dict(stored, **{f"gpt_neox.layers.{i}.attention.{n}": t for i in range(2) for n, t in (
        ("bias", torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()), ("masked_bias", torch.tensor(-1e9)),
        ("rotary_emb.inv_freq", torch.ones(2)))})
    save_file(released, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    reader, config = SafetensorsReader(str(tmp_path / "hf")), read_hf_config(str(tmp_path / "hf"))
    p = "model.layers.1.self_attn."
    attn = hf.gpt_neox.layers[1].attention
    with torch.no_grad():  # transformers' split of the projected rows = the weight's rows (x = identity)
        qkv = attn.query_key_value(torch.eye(64)).view(64, 4, 3, 16)
    for i, part in enumerate("qkv"):
        want = qkv[:, :, i].reshape(64, 64).t() - attn.query_key_value.bias.view(4, 3, 16)[:, i].reshape(64, 1)
        torch.testing.assert_close(reader.read(p + f"{part}_proj.weight"), want, rtol=0, atol=1e-6)
        assert torch.equal(reader.read(p + f"{part}_proj.bias"), attn.query_key_value.bias.view(4, 3, 16)[:, i].reshape(64))
    assert reader.stored(p + "k_proj.bias") == ("gpt_neox.layers.1.attention.query_key_value.bias (its k_proj rows of "
                                                "every head group)")
    assert torch.equal(reader.read("lm_head.weight"), stored["embed_out.weight"])
    assert torch.equal(reader.read("model.norm.bias"), stored["gpt_neox.final_layer_norm.bias"])
    assert reader.stored("model.layers.0.mlp.down_proj.weight") == "gpt_neox.layers.0.mlp.dense_4h_to_h.weight"
    assert stored_name("model.embed_tokens.weight", "gpt_neox") == "gpt_neox.embed_in.weight"
    assert canonical_name("gpt_neox.layers.3.attention.dense.bias", "gpt_neox") == "model.layers.3.self_attn.o_proj.bias"
    canonical = {n: reader.read(n) for n in reader.weight_map if not n.endswith(("attention.bias", "masked_bias",
                                                                                  "inv_freq"))}
    back = fuse(canonical, "gpt_neox", config)
    assert set(back) == set(stored) and all(torch.equal(back[n], t) for n, t in stored.items())
    items = sorted(canonical.items(), reverse=True)  # a layer's q / k / v arriving in separate chunks
    fed = dict((stored_name(n, "gpt_neox"), t) for chunk in grouped_chunks([items[i:i + 3] for i in range(0, len(items), 3)],
                                                                          "gpt_neox", config) for n, t in chunk)
    assert set(fed) == set(stored) and all(torch.equal(fed[n], t) for n, t in stored.items())


@pytest.mark.parametrize("variant,groups", [("falcon", 1), ("falcon-40b", 2), ("falcon-seq", 4)])
def test_falcon_query_key_value_per_key_value_head_read_and_written_as_stored(variant, groups, tmp_path):
    """Falcon keeps each key / value head's [its queries | k | v] in one query_key_value: multi-query (Falcon-7B: one
    group of all queries), grouped (Falcon-40B: 2 here, its norms ln_attn / ln_mlp) and per head (biases too). The
    reader serves q / k / v as transformers' attention splits them and names the stored tensors; the writer and the
    vLLM weight feed give the checkpoint's names and layout back bit for bit."""
    from testing_utils import HF_VARIANTS
    from mindspeed_rl.models.hf_bridge.names import fuse, names_type, stored_name
    from mindspeed_rl.rollout.vllm_engine import grouped_chunks

    hf = make_tiny_hf("falcon", str(tmp_path / "hf"), **HF_VARIANTS.get(variant, {}))
    stored = load_file(str(tmp_path / "hf" / "model.safetensors"))
    reader, config = SafetensorsReader(str(tmp_path / "hf")), read_hf_config(str(tmp_path / "hf"))
    attn, p = hf.transformer.h[1].self_attention, "model.layers.1.self_attn."
    with torch.no_grad():  # transformers' own split of the projected rows (x = identity, the bias taken off)
        fused = attn.query_key_value(torch.eye(64)[None])
        if attn.query_key_value.bias is not None:
            fused = fused - attn.query_key_value.bias
        q, k, v = attn._split_heads(fused)
    rows = lambda t: t.reshape(64, -1).t()  # noqa: E731
    if variant == "falcon-40b":  # the keys / values broadcast to every query head: each group's once
        k, v = k[:, :, ::2], v[:, :, ::2]
    for part, want in (("q", rows(q)), ("k", rows(k)), ("v", rows(v))):
        assert reader.shape(p + f"{part}_proj.weight") == tuple(want.shape)
        torch.testing.assert_close(reader.read(p + f"{part}_proj.weight"), want, rtol=0, atol=1e-6)
    assert reader.stored(p + "v_proj.weight") == ("transformer.h.1.self_attention.query_key_value.weight (its v_proj "
                                                  "rows of every head group)")
    kind = names_type(config)
    norm = "transformer.h.0.ln_mlp.bias" if variant == "falcon-40b" else "transformer.h.0.input_layernorm.bias"
    assert kind == ("falcon_2ln" if variant == "falcon-40b" else "falcon") and norm in stored
    assert reader.stored("model.layers.0.post_attention_layernorm.bias" if variant == "falcon-40b" else
                         "model.layers.0.input_layernorm.bias") == norm
    assert stored_name("model.norm.weight", kind) == "transformer.ln_f.weight"
    canonical = {n: reader.read(n) for n in reader.weight_map}
    back = fuse(canonical, kind, config)
    assert set(back) == set(stored) and all(torch.equal(back[n], t) for n, t in stored.items())
    items = sorted(canonical.items(), reverse=True)
    fed = dict((stored_name(n, kind), t) for chunk in grouped_chunks([items[i:i + 3] for i in range(0, len(items), 3)],
                                                                    kind, config) for n, t in chunk)
    assert set(fed) == set(stored) and all(torch.equal(fed[n], t) for n, t in stored.items())
    assert groups == (1 if variant == "falcon" else int(config.get("num_kv_heads") or 4))


def test_gpt_oss_stacked_experts_read_per_expert_and_mxfp4_as_transformers_dequantizes(tmp_path, gloo_world1):
    """gpt-oss stores each layer's experts stacked ((E, h, 2f) gate_up_proj with gate / up interleaved, (E, f, h)
    down_proj, their biases) and its release in MXFP4 (`_blocks` + `_scales`): the reader serves them per expert
    under the canonical names, the MXFP4 ones dequantized exactly as transformers dequantizes them when it loads
    the checkpoint, and a model loaded from the MXFP4 directory computes transformers' logits; the scales
    are no tensors of their own, and a missing one is named."""
    import transformers

    from testing_utils import mxfp4_gpt_oss

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint

    hf = make_tiny_hf("gpt_oss", str(tmp_path / "bf"))
    plain = SafetensorsReader(str(tmp_path / "bf"))
    experts = hf.model.layers[1].mlp.experts
    assert torch.equal(plain.read("model.layers.1.mlp.experts.2.up_proj.weight"), experts.gate_up_proj[2][:, 1::2].t())
    assert torch.equal(plain.read("model.layers.1.mlp.experts.2.gate_proj.bias"), experts.gate_up_proj_bias[2][0::2])
    assert torch.equal(plain.read("model.layers.1.mlp.experts.2.down_proj.weight"), experts.down_proj[2].t())
    assert plain.read("model.layers.1.mlp.gate.bias").shape == (4,)  # the router, stored as mlp.router
    assert "model.layers.1.mlp.experts.gate_up_proj" not in plain.weight_map
    values = mxfp4_gpt_oss(str(tmp_path / "bf"), str(tmp_path / "q"))
    reader = SafetensorsReader(str(tmp_path / "q"))
    assert not [n for n in reader.weight_map if n.endswith(("_scales", "_blocks"))]
    ref = transformers.GptOssForCausalLM.from_pretrained(str(tmp_path / "q"), dtype=torch.float32).eval()
    for i in range(2):
        gate_up = ref.model.layers[i].mlp.experts.gate_up_proj.detach()
        assert torch.equal(gate_up, values[f"model.layers.{i}.mlp.experts.gate_up_proj"])  # the encoder's values
        for e in range(4):
            got = reader.read(f"model.layers.{i}.mlp.experts.{e}.gate_proj.weight")
            assert torch.equal(got, gate_up[e][:, 0::2].t()) and reader.quantized(f"model.layers.{i}.mlp.experts.{e}.gate_proj.weight")
            down = reader.read(f"model.layers.{i}.mlp.experts.{e}.down_proj.weight", cols=slice(32, 96))
            assert torch.equal(down, ref.model.layers[i].mlp.experts.down_proj.detach()[e].t()[:, 32:96])
    assert (plain.read("model.layers.0.mlp.experts.1.gate_proj.weight")
            - reader.read("model.layers.0.mlp.experts.1.gate_proj.weight")).abs().max() > 1e-2  # quantized for real
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path / "q"))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path / "q"), args)
    ids, mask = torch.randint(0, 120, (2, 20)), torch.ones(2, 20, dtype=torch.long)
    pos = position_ids_from_mask(mask)
    with torch.no_grad():
        diff = (model(ids, pos, attention_mask_4d(mask))[..., :120] - ref(input_ids=ids, position_ids=pos).logits).abs().max()
    assert diff <= 1e-4
    tensors = load_file(str(tmp_path / "q" / "model.safetensors"))
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, str(tmp_path / "q" / "model.safetensors"))
    with pytest.raises(UserInputError, match=r"tensor model.layers.1.mlp.experts.down_proj_scales \(the quantization "
                                             r"scales of model.layers.1.mlp.experts.down_proj_blocks\) is not in the checkpoint"):
        SafetensorsReader(str(tmp_path / "q")).read("model.layers.1.mlp.experts.0.down_proj.weight")


def test_block_fp8_weights_are_read_dequantized_by_their_blocks(tmp_path, gloo_world1):
    """DeepSeek-V3's release format (every linear weight float8_e4m3fn with one float32 scale per 128 x 128
    tile in `<name>_scale_inv`): read dequantized (weight x its tile's scale), any row / column range as
    the TP shards read it, so a model loaded from it equals one loaded from the dequantized weights bit for
    bit; the scales are no tensors of their own, and other quantizations are refused in one sentence."""
    from testing_utils import fp8_blockwise

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state

    make_tiny_hf("qwen2", str(tmp_path / "bf"), intermediate_size=300)  # gate / up 300 rows, down 300 columns: 3 tiles
    values = fp8_blockwise(str(tmp_path / "bf"), str(tmp_path / "q"))
    reader = SafetensorsReader(str(tmp_path / "q"))
    name = "model.layers.1.mlp.gate_proj.weight"
    assert reader.quantized(name) and not [n for n in reader.weight_map if n.endswith("_scale_inv")]
    assert torch.equal(reader.read(name), values[name])
    assert torch.equal(reader.read(name, rows=slice(100, 290)), values[name][100:290])
    down = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(reader.read(down, cols=slice(120, 260)), values[down][:, 120:260])
    assert (values[name] - SafetensorsReader(str(tmp_path / "bf")).read(name)).abs().max() > 0  # quantized for real
    tensors = load_file(str(tmp_path / "bf" / "model.safetensors"))
    save_file({**tensors, **values}, str(tmp_path / "bf" / "model.safetensors"))  # the dequantized weights
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path / "q"))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint
    a, b = build_gpt_model(args), build_gpt_model(args)
    load_hf_checkpoint(a, str(tmp_path / "q"), args)
    load_hf_checkpoint(b, str(tmp_path / "bf"), args)
    for (n, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert n.endswith("_extra_state") or torch.equal(x, y), n
    config = json.load(open(tmp_path / "q" / "config.json"))
    for quant, match in (({"quant_method": "fp8", "weight_block_size": [64, 64]}, r"quant_method 'fp8', weight_block_size \[64, 64\]"),
                         ({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"),
                         ({"quant_method": "mxfp4"}, "quant_method 'mxfp4'")):
        with pytest.raises(ValueError, match=match + r"\) is a quantization load: does not read"):
            model_config_from_hf(dict(config, quantization_config=quant))


def test_exaone_release_names_are_what_transformers_saves(tmp_path):
    """The vLLM stage's tiny EXAONE (its transformers has no ExaoneConfig: a Llama renamed by
    testing_utils.EXAONE_RELEASE_NAMES) stores the tensors under the names this transformers saves them, and the bridge
    reads both as the same canonical tensors."""
    import transformers
    from safetensors import safe_open

    from testing_utils import _as_exaone_release, make_tiny_hf
    from mindspeed_rl.models.hf_bridge.names import canonical_name

    make_tiny_hf("exaone", str(tmp_path / "transformers"))
    config = transformers.ExaoneConfig.from_pretrained(str(tmp_path / "transformers"))
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_dict())).save_pretrained(str(tmp_path / "llama"))
    _as_exaone_release(str(tmp_path / "llama"))

    def names(d):
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            return sorted(f.keys())
    assert names(tmp_path / "llama") == names(tmp_path / "transformers")
    assert "transformer.h.1.attn.attention.out_proj.weight" in names(tmp_path / "llama")
    canonical = {canonical_name(n, "exaone", config.to_dict()) for n in names(tmp_path / "llama")}
    assert "model.layers.1.self_attn.o_proj.weight" in canonical and "model.norm.weight" in canonical


def test_sarvam_release_names_are_what_transformers_saves(tmp_path):
    """The vLLM stage's tiny Sarvam MoE (its transformers has no SarvamMoEConfig: a GLM-4.5 renamed and q / k / v fused
    by testing_utils._as_sarvam_release) stores the same tensors under the names this transformers saves them, and the
    bridge reads both as the same canonical tensors."""
    import transformers
    from safetensors.torch import load_file

    from testing_utils import _as_sarvam_release, make_tiny_hf

    make_tiny_hf("sarvam_moe", str(tmp_path / "transformers"))
    config = transformers.SarvamMoEConfig.from_pretrained(str(tmp_path / "transformers")).to_dict()
    glm = transformers.Glm4MoeConfig(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    model = transformers.Glm4MoeForCausalLM(glm)
    model.load_state_dict(transformers.Glm4MoeForCausalLM.from_pretrained(str(tmp_path / "transformers")).state_dict())
    model.save_pretrained(str(tmp_path / "glm"))
    _as_sarvam_release(str(tmp_path / "glm"))
    ours, theirs = load_file(str(tmp_path / "glm" / "model.safetensors")), load_file(
        str(tmp_path / "transformers" / "model.safetensors"))
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[n], theirs[n]) for n in ours)
    assert "model.layers.1.attention.query_key_value.weight" in ours and "model.word_embeddings.weight" in ours
