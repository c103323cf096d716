"""The Gated DeltaNet mixer (models/gated_delta_net.py) at TP 1 against transformers' Qwen3.5 layer:
outputs and gradients with a left-padded row over more than one 64-token chunk, the incremental
(generation) form against the whole-sequence one, the rank-order layouts, the shape sentences.
TP 2 (and SP) is tests/dist/models/test_gated_delta_net_dist.py."""

import pytest
import torch

from testing_utils import assert_near, delta_batch, hf_delta_net, mask_4d, ours_delta_net, shape_of

pytestmark = pytest.mark.usefixtures("gloo_world1")


def test_equals_transformers_with_gradients(tp1):
    hf, config = hf_delta_net()
    ours = ours_delta_net(hf, config)
    x, mask, w = delta_batch()
    real = mask.bool()
    x_hf = x.clone().requires_grad_(True)
    ref = hf(x_hf, attention_mask=mask)
    (ref * w)[real].sum().backward()
    x_ours = x.clone().transpose(0, 1).contiguous().requires_grad_(True)
    out, bias = ours(x_ours, attention_mask=mask_4d(mask))
    assert bias is None
    out = out.transpose(0, 1)
    (out * w)[real].sum().backward()
    assert_near(out[real], ref[real], what="output")
    assert_near(x_ours.grad.transpose(0, 1)[real], x_hf.grad[real], what="input gradient")
    from mindspeed_rl.models.delta_layout import conv_to_hf, in_proj_to_parts

    shape = shape_of(config)
    qkv, z, b, a = in_proj_to_parts(ours.in_proj.weight.grad, shape)
    for name, mine, theirs in (("in_proj_qkv", qkv, hf.in_proj_qkv.weight), ("in_proj_z", z, hf.in_proj_z.weight),
                               ("in_proj_b", b, hf.in_proj_b.weight), ("in_proj_a", a, hf.in_proj_a.weight),
                               ("conv1d", conv_to_hf(ours.conv1d.weight.grad, shape), hf.conv1d.weight),
                               ("norm", ours.norm.weight.grad, hf.norm.weight),
                               ("out_proj", ours.out_proj.weight.grad, hf.out_proj.weight),
                               ("A_log", ours.A_log.grad, hf.A_log), ("dt_bias", ours.dt_bias.grad, hf.dt_bias)):
        assert_near(mine, theirs.grad, what=name)


def test_left_padding_equals_the_unpadded_sequence(tp1):
    hf, config = hf_delta_net(seed=2)
    ours = ours_delta_net(hf, config)
    x, mask, _ = delta_batch(pad=9)
    with torch.no_grad():
        padded = ours(x.transpose(0, 1), attention_mask=mask_4d(mask))[0].transpose(0, 1)
        alone = ours(x[:1, 9:].transpose(0, 1))[0].transpose(0, 1)
    assert_near(padded[0, 9:], alone[0], what="left-padded row")
    assert padded[0, 9:].abs().max() > 1e-3  # a real signal, not zeros matching zeros


def test_incremental_steps_equal_the_whole_sequence(tp1):
    """A 37-token prefill, one-token steps, then a 3-token step, carrying DeltaState, equal one forward
    over the whole (left-padded) sequence; keep() drops a row of the state."""
    from mindspeed_rl.models.gated_delta_net import DeltaState

    hf, config = hf_delta_net(value_heads=2, seed=3)
    ours = ours_delta_net(hf, config)
    x, mask, _ = delta_batch(seq=45, pad=4)
    with torch.no_grad():
        whole = ours(x.transpose(0, 1), attention_mask=mask_4d(mask))[0]
        state, pieces, start = DeltaState(), [], 0
        for end in (37, 38, 39, 40, 41, 42, 45):
            m = mask_4d(mask[:, :end])[:, :, start:end, start:end]  # the new tokens' own rows
            pieces.append(ours(x[:, start:end].transpose(0, 1), attention_mask=m, delta_state=state)[0])
            start = end
        steps = torch.cat(pieces)
    real = mask.bool().t()
    assert_near(steps[real], whole[real], what="incremental")
    assert state.conv.shape == (2, ours.conv1d.weight.shape[0], 3)
    assert state.recurrent.shape == (2, 2, 8, 6) and state.recurrent.dtype == torch.float32
    state.keep(torch.tensor([1]))
    assert state.conv.shape[0] == 1 and state.recurrent.shape[0] == 1


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_layouts_round_trip_and_shard_by_whole_key_heads(tp):
    """HF -> grouped -> HF is exact; a TP shard (a contiguous block of the grouped tensor) is the grouped
    layout of its key heads' HF rows alone, so shards concatenate into the whole at any TP."""
    from mindspeed_rl.models.delta_layout import (DeltaNetShape, conv_from_hf, conv_to_hf, in_proj_from_parts,
                                                  in_proj_to_parts)

    shape = DeltaNetShape(4, 8, 3, 2)  # G 4, r 2, dk 3, dv 2
    qkv, z, b, a = torch.randn(4 * 3 * 2 + 8 * 2, 5), torch.randn(16, 5), torch.randn(8, 5), torch.randn(8, 5)
    full = in_proj_from_parts(qkv, z, b, a, shape)
    for got, want in zip(in_proj_to_parts(full, shape), (qkv, z, b, a)):
        assert torch.equal(got, want)
    g = 4 // tp
    for r in range(tp):
        q, k, v = qkv.split([12, 12, 16])
        rows = lambda t, n: t[r * g * n:(r + 1) * g * n]  # noqa: E731  (key heads r*g.. of t, n rows each)
        mine = in_proj_from_parts(torch.cat([rows(q, 3), rows(k, 3), rows(v, 4)]), rows(z, 4), rows(b, 2),
                                  rows(a, 2), shape, groups=g)
        assert torch.equal(full.chunk(tp)[r], mine)
    assert torch.equal(full[:3], qkv[:3]) and torch.equal(full[3:6], qkv[12:15])  # key head 0: its q, then its k
    conv = torch.randn(40, 1, 4)
    assert torch.equal(conv_to_hf(conv_from_hf(conv, shape), shape), conv)


def test_shape_problems_are_one_sentence():
    from mindspeed_rl.models.delta_layout import DeltaNetShape

    assert DeltaNetShape(16, 32, 128, 128).problem(8) is None
    said = DeltaNetShape(2, 4, 8, 8).problem(4)
    assert "tensor_model_parallel_size 4" in said and "linear_num_key_heads 2" in said
    assert "multiple of linear_num_key_heads" in DeltaNetShape(4, 6, 8, 8).problem(1)


def test_kernels_on_cpu_are_transformers_torch_ones():
    from mindspeed_rl.platform.delta_rule import kernels

    rule = kernels("cpu")
    assert rule.source == "torch" and rule.chunk.__name__ == "torch_chunk_gated_delta_rule"
    assert kernels("cuda").source in ("torch", "fla")  # fla only where flash-linear-attention is installed
