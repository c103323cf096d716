"""models/rotary.py computes megatron's RoPE: forward and input gradient equal megatron's
apply_rotary_pos_emb to 1e-6 (fp32) with Llama-3 frequency scaling, partial rotary, an mscale and a
non-contiguous key; cos/sin are computed once per frequency table (once per forward for the whole
model instead of twice per layer); variants it does not implement go to megatron's function; the
patch point is checked; a whole GPTModel gives megatron's logits and gradients."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mindspeed_rl.models import rotary
from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, llama3_inv_freq, transformer_config

from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb as megatron_rope
from megatron.core.transformer import attention as megatron_attention

ARGS = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=16, padded_vocab_size=40, max_position_embeddings=64,
            normalization="RMSNorm", swiglu=True, disable_bias_linear=True)


def _freqs(seq: int, rot: int, inv_freq=None) -> torch.Tensor:
    """megatron RotaryEmbedding's table: (seq, 1, 1, rot), the frequencies repeated for both halves."""
    if inv_freq is None:
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    f = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    return torch.cat((f, f), dim=-1)[:, None, None, :]


def _qk(seq=7, b=3, heads=4, groups=2, hn=16, seed=0):
    """q (s, b, heads, hn) and k as megatron makes them: a non-contiguous view of the fused QKV output."""
    g = torch.Generator().manual_seed(seed)
    mixed = torch.randn(seq, b, groups, (heads // groups + 2) * hn, generator=g, requires_grad=True)
    q, k, _ = torch.split(mixed, [heads // groups * hn, hn, hn], dim=3)
    return mixed, q.reshape(seq, b, heads, hn), k


@pytest.mark.parametrize("case", ["plain", "llama3", "partial", "mscale"])
def test_rotation_equals_megatron_forward_and_backward(gloo_world1, case):
    init_parallel_state(1, 1, seed=1)
    config = transformer_config(ARGS)
    rot = 8 if case == "partial" else 16
    inv = llama3_inv_freq(16, 500000.0, 8.0, 1.0, 4.0, 4) if case == "llama3" else None
    freqs = _freqs(7, rot, inv)
    mscale = 1.3 if case == "mscale" else 1.0
    mixed, q, k = _qk()
    assert not k.is_contiguous()
    g = torch.Generator().manual_seed(1)
    gq, gk = torch.randn(q.shape, generator=g), torch.randn(k.shape, generator=g)
    out = {}
    for name, fn in (("megatron", megatron_rope), ("ours", rotary.apply_rotary_pos_emb)):
        rq, rk = fn(q, freqs, config, mscale=mscale), fn(k, freqs, config, mscale=mscale)
        out[name] = (rq, rk, torch.autograd.grad((rq, rk), mixed, (gq, gk))[0])
    for ours, theirs in zip(out["ours"], out["megatron"]):
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= 1e-6
    if case == "partial":  # the pass-through features are the input's, their gradient the output's
        assert torch.equal(out["ours"][0][..., rot:], q[..., rot:])


def test_cos_sin_once_per_table():
    freqs = _freqs(5, 16)
    cos, sin = rotary.rotary_tables(freqs, torch.float32)
    again = rotary.rotary_tables(freqs, torch.float32)
    assert again[0] is cos and again[1] is sin  # reused by the next layer
    assert rotary.rotary_tables(freqs, torch.bfloat16)[0].dtype == torch.bfloat16
    assert rotary.rotary_tables(freqs.clone(), torch.float32)[0] is not cos  # another table
    freqs.mul_(2)  # an edited table is never served stale
    assert torch.allclose(rotary.rotary_tables(freqs, torch.float32)[0], torch.cos(freqs))


def test_variants_it_does_not_implement_go_to_megatron(gloo_world1):
    init_parallel_state(1, 1, seed=1)
    config = transformer_config(dict(ARGS, rotary_interleaved=True))  # GLM-4 / ERNIE 4.5: the model key
    _, q, _ = _qk()
    freqs = _freqs(7, 16)
    expected = megatron_rope(q, freqs, config)
    plain = rotary.apply_rotary_pos_emb(q, freqs, transformer_config(ARGS))
    assert torch.equal(rotary.apply_rotary_pos_emb(q, freqs, config), expected)
    assert (plain - expected).abs().max() > 1e-3  # the interleaved layout really is another rotation
    with pytest.raises(ValueError, match="rotary features do not fit"):
        rotary.rotate_half(q, torch.ones(7, 1, 1, 18), torch.ones(7, 1, 1, 18))


def test_install_is_checked(gloo_world1, monkeypatch):
    init_parallel_state(1, 1, seed=1)
    build_gpt_model(ARGS)  # the builder installs it on CPU
    assert megatron_attention.apply_rotary_pos_emb is rotary.apply_rotary_pos_emb
    rotary.install()  # idempotent
    monkeypatch.setattr(megatron_attention, "apply_rotary_pos_emb", lambda t, freqs, config: t)
    with pytest.raises(RuntimeError, match="models/rotary.py must learn this version"):
        rotary.install()


class _CountCos(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket in (torch.ops.aten.cos, torch.ops.aten.sin)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", [{}, {"rotary_percent": 0.5, "rope_scaling_type": "llama3", "rope_scaling_factor": 4.0,
                                       "original_max_position_embeddings": 8}])
def test_model_equals_megatron_rope(gloo_world1, monkeypatch, arch):
    init_parallel_state(1, 1, seed=1)
    model = build_gpt_model(dict(ARGS, **arch))
    ids = torch.randint(0, 40, (3, 11), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(11).expand(3, 11)
    out = {}
    for name in ("megatron", "ours"):
        if name == "megatron":
            monkeypatch.setattr(megatron_attention, "apply_rotary_pos_emb", megatron_rope)
        else:
            monkeypatch.undo()
        model.zero_grad()
        counter = _CountCos()
        with counter:
            logits = model(ids, pos, None)
        logits.square().mean().backward()
        out[name] = (logits.detach(), [p.grad.clone() for p in model.parameters()], counter.calls)
    assert (out["ours"][0] - out["megatron"][0]).abs().max() <= 1e-5
    for ours, theirs in zip(out["ours"][1], out["megatron"][1]):
        assert (ours - theirs).abs().max() <= 1e-6
    assert out["megatron"][2] == 2 * 2 * ARGS["num_layers"]  # cos and sin for q and k in every layer
    assert out["ours"][2] <= 2  # cos and sin once for the whole forward (0: a table seen before)
