"""platform/packed_linear.py: bf16 decode matmuls on oneDNN-prepacked weights give the same bits as
torch.matmul(x, W.t()) for every row count and shape the decode path uses (2-D and 3-D inputs), in
eager mode and as the custom op inside a compiled graph; the packed copies live only inside the
block (an in-place update between blocks is seen; an error inside the block still frees them);
fp32 and accelerators are left alone."""

import pytest
import torch

from mindspeed_rl.platform import packed_linear as pl

pytestmark = pytest.mark.skipif(not pl.available("cpu", torch.bfloat16),
                                reason="this torch build has no oneDNN packed linear")

SHAPES = [(96, 32), (32, 64), (64, 32), (40, 32)]  # (out, in): qkv, fc2, fc1, a small output layer


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=g) * 0.1).bfloat16() for s in SHAPES]


def test_available_only_for_bf16_on_the_cpu():
    assert pl.available("cpu", torch.bfloat16)
    assert not pl.available("cpu", torch.float32)
    assert not pl.available("cuda", torch.bfloat16) and not pl.available("npu", torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 7, 16, 300])
def test_packed_matmul_is_bitwise_the_plain_one(rows):
    ws = _weights()
    xs = [torch.randn(rows, w.shape[1]).bfloat16() for w in ws]
    plain = [torch.matmul(x, w.t()) for x, w in zip(xs, ws)]
    with pl.packed_weights(ws, rows=16) as nbytes:
        assert nbytes == sum(w.numel() * 2 for w in ws)
        assert all(pl._lookup(w) is not None for w in ws)
        packed = [pl.matmul_t(x, w) for x, w in zip(xs, ws)]
        packed_3d = [pl.matmul_t(x[None], w) for x, w in zip(xs, ws)]  # (s, b, h) as the layers call it
    for a, b, c in zip(plain, packed, packed_3d):
        assert torch.equal(a, b) and torch.equal(a[None], c)


def test_copies_live_only_inside_the_block_and_see_in_place_updates():
    ws = _weights()
    x = torch.randn(5, 64).bfloat16()
    with pl.packed_weights(ws, rows=5):
        before = pl.matmul_t(x, ws[1])
    assert not pl._PACKED and pl._lookup(ws[1]) is None
    with torch.no_grad():
        ws[1].mul_(2.0)  # the optimizer's in-place step between two generations
    with pl.packed_weights(ws, rows=5):
        after = pl.matmul_t(x, ws[1])
    assert torch.equal(after, torch.matmul(x, ws[1].t())) and not torch.equal(after, before)
    with pytest.raises(ValueError), pl.packed_weights(ws, rows=5):
        raise ValueError("a failed generation")
    assert not pl._PACKED
    with pl.packed_weights(ws, rows=5), pytest.raises(RuntimeError, match="already active"):
        with pl.packed_weights(ws, rows=5):
            pass


def test_a_weight_not_packed_takes_the_plain_matmul():
    ws = _weights()
    other = torch.randn(8, 32).bfloat16()
    x = torch.randn(3, 32).bfloat16()
    with pl.packed_weights(ws[:1], rows=3):
        assert pl._lookup(other) is None and pl._lookup(ws[0][:10]) is None  # a view at the same address
        assert torch.equal(pl.matmul_t(x, other), torch.matmul(x, other.t()))


def test_compiled_graph_calls_the_op_and_gives_the_same_bits():
    """torch.compile keeps matmul_t as one opaque op per call (fullgraph: no graph break); the op
    looks the packing up when the graph runs, so the same graph serves packed and plain calls."""
    ws = _weights()

    def two_linears(x, w_in, w_out):
        return pl.matmul_t(torch.nn.functional.silu(pl.matmul_t(x, w_in)), w_out)

    compiled = torch.compile(two_linears, fullgraph=True, dynamic=True)
    x = torch.randn(1, 6, 32).bfloat16()
    plain = compiled(x, ws[2], ws[1])
    with pl.packed_weights(ws, rows=6):
        packed = compiled(x, ws[2], ws[1])
        eager_packed = two_linears(x, ws[2], ws[1])
    assert torch.equal(packed, plain) and torch.equal(packed, eager_packed)


def test_too_big_when_the_copies_would_take_half_the_memory_left(monkeypatch):
    avail = pl.host_memory_available()
    assert avail is None or avail > 0  # Linux: MemAvailable, capped by the cgroup's limit
    monkeypatch.setattr(pl, "host_memory_available", lambda: 3 * 2 ** 30)
    assert pl.too_big(int(1.5 * 2 ** 30)) is None
    why = pl.too_big(int(1.6 * 2 ** 30))
    assert why == "the packed copies would take 1.60 GiB, more than 50% of the 3.00 GiB of host memory available"
    monkeypatch.setattr(pl, "host_memory_available", lambda: None)  # unknown: pack
    assert pl.too_big(2 ** 40) is None
