"""The Mamba-2 mixer (models/mamba2.py, Granite 4.0-H) at TP 1 against transformers' GraniteMoeHybridMambaLayer:
outputs and gradients with a left-padded row over several 16-token chunks, with one group and with two; the
incremental (generation) form against the whole-sequence one; the scan's two forms against each other; the
layouts and the shape sentences. TP 2 (a norm group over two ranks) and SP: tests/dist/models/test_mamba2_dist.py."""

import pytest
import torch

from testing_utils import assert_near, delta_batch, hf_mamba2, mamba2_grads_as_hf, mamba_shape_of, mask_4d, ours_mamba2

pytestmark = pytest.mark.usefixtures("gloo_world1")


@pytest.mark.parametrize("groups", [1, 2])
def test_equals_transformers_with_gradients(tp1, groups):
    hf, config = hf_mamba2(groups=groups)
    ours = ours_mamba2(hf, config)
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
    theirs = {"in_proj": hf.in_proj.weight, "conv1d.weight": hf.conv1d.weight, "conv1d.bias": hf.conv1d.bias,
              "A_log": hf.A_log, "D": hf.D, "dt_bias": hf.dt_bias, "norm": hf.norm.weight,
              "out_proj": hf.out_proj.weight}
    for name, grad in mamba2_grads_as_hf(ours, mamba_shape_of(config)).items():
        assert_near(grad, theirs[name].grad, what=name)


def test_left_padding_equals_the_unpadded_sequence(tp1):
    hf, config = hf_mamba2(seed=2)
    ours = ours_mamba2(hf, config)
    x, mask, _ = delta_batch(pad=9)
    with torch.no_grad():
        padded = ours(x.transpose(0, 1), attention_mask=mask_4d(mask))[0].transpose(0, 1)
        alone = ours(x[:1, 9:].transpose(0, 1))[0].transpose(0, 1)
    assert_near(padded[0, 9:], alone[0], what="left-padded row")
    assert padded[0, 9:].abs().max() > 1e-3  # a real signal, not zeros matching zeros


def test_incremental_steps_equal_the_whole_sequence(tp1):
    """A 37-token prefill, one-token steps, then a 3-token step, carrying the state, equal one forward over
    the whole (left-padded) sequence; keep() drops a row of the state."""
    from mindspeed_rl.models.gated_delta_net import DeltaState

    hf, config = hf_mamba2(groups=2, seed=3)
    ours = ours_mamba2(hf, config)
    x, mask, _ = delta_batch(seq=45, pad=4)
    with torch.no_grad():
        whole = ours(x.transpose(0, 1), attention_mask=mask_4d(mask))[0]
        state, pieces, start = ours.delta_state(2), [], 0
        for end in (37, 38, 39, 40, 41, 42, 45):
            m = mask_4d(mask[:, :end])[:, :, start:end, start:end]  # the new tokens' own rows
            pieces.append(ours(x[:, start:end].transpose(0, 1), attention_mask=m, delta_state=state)[0])
            start = end
        steps = torch.cat(pieces)
    real = mask.bool().t()
    assert_near(steps[real], whole[real], what="incremental")
    assert isinstance(state, DeltaState)
    assert state.conv.shape == (2, 4 * 8 + 2 * 2 * 6, 3)
    assert state.recurrent.shape == (2, 4, 8, 6) and state.recurrent.dtype == torch.float32
    state.keep(torch.tensor([1]))
    assert state.conv.shape[0] == 1 and state.recurrent.shape[0] == 1


def test_chunked_scan_equals_the_recurrence():
    """platform/ssd.py: the chunked form (37 tokens in chunks of 8, from an initial state) equals 37 single
    steps, in float64 to round-off."""
    from mindspeed_rl.platform.ssd import chunk_scan, kernels, step

    torch.manual_seed(0)
    b, s, h, p, n = 2, 37, 3, 4, 5
    x, B, C = torch.randn(b, s, h, p).double(), torch.randn(b, s, h, n).double(), torch.randn(b, s, h, n).double()
    dt, A, D = torch.rand(b, s, h).double(), -2 * torch.rand(h).double(), torch.randn(h).double()
    state = torch.randn(b, h, p, n).double()
    y, final = chunk_scan(x, dt, A, B, C, 8, D, state)
    ys = []
    for t in range(s):
        yt, state = step(x[:, t:t + 1], dt[:, t:t + 1], A, B[:, t:t + 1], C[:, t:t + 1], D, state)
        ys.append(yt)
    assert (torch.cat(ys, 1) - y).abs().max() < 1e-12 and (state - final).abs().max() < 1e-12
    assert kernels("cpu").source == "torch"


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_layout_round_trips_and_shards_by_whole_heads(tp):
    from mindspeed_rl.models.mamba_layout import MambaShape, zxdt_from_parts, zxdt_to_parts

    shape = MambaShape(heads=4, head_dim=3, groups=1, state=2)
    z, x, dt = torch.randn(12, 5), torch.randn(12, 5), torch.randn(4, 5)
    full = zxdt_from_parts(z, x, dt, shape)
    for got, want in zip(zxdt_to_parts(full, shape), (z, x, dt)):
        assert torch.equal(got, want)
    assert torch.equal(full[:3], z[:3]) and torch.equal(full[3:6], x[:3]) and torch.equal(full[6], dt[0])
    h = 4 // tp
    for r in range(tp):
        mine = zxdt_from_parts(z[r * h * 3:(r + 1) * h * 3], x[r * h * 3:(r + 1) * h * 3], dt[r * h:(r + 1) * h],
                               shape, heads=h)
        assert torch.equal(full.chunk(tp)[r], mine)


def test_shape_problems_are_one_sentence():
    from mindspeed_rl.models.mamba_layout import MambaShape

    assert MambaShape(48, 64, 1, 128).problem(8) is None  # Granite 4.0-H-1B's sizes: one group over 8 ranks
    assert MambaShape(8, 64, 8, 128).problem(4) is None  # whole groups per rank
    said = MambaShape(4, 8, 1, 8).problem(8)
    assert "tensor_model_parallel_size 8" in said and "mamba_num_heads 4" in said
    assert "multiple of mamba_num_groups 3" in MambaShape(4, 8, 3, 8).problem(1)
    assert MambaShape(12, 8, 2, 8).problem(3) is None  # 6 heads a group, 4 a rank: norm sums over TP


def test_bf16_is_as_close_to_fp32_as_transformers_bf16(tp1):
    """In bf16 (the scan, the gated norm and their inputs' casts in fp32, as transformers' layer does them) our mixer's
    output is as far from the fp32 output as transformers' own bf16 layer is: within 2x its mean and max distance
    (measured: mean 8.1e-3 against 8.2e-3, max 8.3e-2 both), on the same bf16-rounded weights."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mindspeed_rl.models.mamba2 import Mamba2Mixer

    hf, config = hf_mamba2(seed=4)
    hf = hf.to(torch.bfloat16).float()  # the weights bf16 can hold, in fp32
    ours32 = ours_mamba2(hf, config)
    mcfg = TransformerConfig(num_layers=1, hidden_size=config.hidden_size, num_attention_heads=4, bf16=True,
                             use_cpu_initialization=True, params_dtype=torch.bfloat16)
    ours16 = Mamba2Mixer(mcfg, shape=mamba_shape_of(config))
    ours16.load_state_dict({k: v.to(torch.bfloat16) if torch.is_tensor(v) else v
                            for k, v in ours32.state_dict().items()})
    hf16 = hf_mamba2(seed=4)[0].to(torch.bfloat16)
    x, mask, _ = delta_batch()
    real = mask.bool()
    with torch.no_grad():
        want = hf(x, attention_mask=mask)[real]
        theirs = hf16(x.bfloat16(), attention_mask=mask).float()[real]
        ours = ours16(x.bfloat16().transpose(0, 1), attention_mask=mask_4d(mask))[0].transpose(0, 1).float()[real]
    mine, ref = (ours - want).abs(), (theirs - want).abs()
    print(f"bf16 vs fp32: ours mean {mine.mean():.3g} max {mine.max():.3g}; transformers mean {ref.mean():.3g} "
          f"max {ref.max():.3g}")
    assert mine.mean() <= 2 * ref.mean() and mine.max() <= 2 * ref.max()
