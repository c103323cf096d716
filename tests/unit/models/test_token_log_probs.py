"""token_log_probs (models/forward.py): log_softmax(z / T)[target] of a column range of (b, S, V) logits,
computed block by block with a hand-written backward, equals log_softmax + gather on the slice."""
import pytest
import torch

from mindspeed_rl.models import forward
from mindspeed_rl.models.forward import token_log_probs, vocab_parallel_log_probs


def reference(logits, targets, temperature, vocab_size, first):
    n = targets.shape[-1]
    z = logits[:, first: first + n].float() / temperature
    if vocab_size is not None and vocab_size < z.shape[-1]:
        z = z.masked_fill(torch.arange(z.shape[-1]) >= vocab_size, float("-inf"))
    return torch.log_softmax(z, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def both(logits, targets, temperature, vocab_size, first, dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    upstream = torch.randn(targets.shape, generator=g)
    out = []
    for fn in (token_log_probs, reference):
        x = logits.detach().to(dtype).requires_grad_(True)
        lp = fn(x, targets, temperature, vocab_size, first)
        (lp * upstream).sum().backward()
        out.append((lp.detach(), x.grad.float()))
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("vocab_size", [None, 45])
@pytest.mark.parametrize("first", [0, 3])
@pytest.mark.parametrize("block_bytes", [4 << 20, 3 * 4 * 48])  # one block; 3 rows per block (boundaries)
def test_equals_log_softmax_gather(monkeypatch, temperature, vocab_size, first, block_bytes):
    monkeypatch.setitem(forward._BLOCK_BYTES, "cpu", block_bytes)
    g = torch.Generator().manual_seed(0)
    b, S, V, n = 3, 12, 48, 8
    logits = torch.randn(b, S, V, generator=g) * 4
    targets = torch.randint(0, vocab_size or V, (b, n), generator=g)
    (lp, grad), (ref_lp, ref_grad) = both(logits, targets, temperature, vocab_size, first)
    assert lp.dtype == torch.float32 and lp.shape == (b, n)
    torch.testing.assert_close(lp, ref_lp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-6)
    assert grad[:, :first].abs().sum() == 0 and grad[:, first + n:].abs().sum() == 0
    if vocab_size is not None:
        assert grad[..., vocab_size:].abs().sum() == 0


def test_bf16_logits_give_fp32_log_probs_and_bf16_gradient(monkeypatch):
    monkeypatch.setitem(forward._BLOCK_BYTES, "cpu", 2 * 4 * 64)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 9, 64, generator=g) * 3
    targets = torch.randint(0, 64, (2, 6), generator=g)
    (lp, grad), (ref_lp, ref_grad) = both(logits, targets, 0.8, None, 2, dtype=torch.bfloat16)
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)  # both read the same bf16 logits in fp32
    torch.testing.assert_close(grad, ref_grad, atol=0, rtol=0)  # fp32 maths, rounded to bf16 once on both sides


def test_vocab_parallel_log_probs_tp1_any_shape_and_no_grad():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 30, generator=g)
    targets = torch.randint(0, 28, (2, 4), generator=g)
    with torch.no_grad():
        lp, ent = vocab_parallel_log_probs(logits[:, :-1], targets, 0.9, 28)  # a strided view, 3-D
        flat, _ = vocab_parallel_log_probs(logits[:, :-1].reshape(-1, 30), targets.reshape(-1), 0.9, 28)  # 2-D
    ref = reference(logits, targets, 0.9, 28, 0)
    assert ent is None
    torch.testing.assert_close(lp, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(flat.reshape(2, 4), ref, atol=1e-6, rtol=1e-6)


def test_non_finite_logits_propagate():
    logits = torch.zeros(1, 3, 8)
    logits[0, 1, 2] = float("nan")
    lp = token_log_probs(logits, torch.zeros(1, 3, dtype=torch.long))
    assert torch.isnan(lp[0, 1]) and torch.isfinite(lp[0, [0, 2]]).all()
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs(logits, torch.zeros(1, 3, dtype=torch.long), temperature=0.0)
