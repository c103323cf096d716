"""The allgather dispatcher without host syncs (models/moe_dispatch.py): where every expert is local
its permutation is megatron's element for element (outputs and gradients bit for bit, also with
experts that get no token), and a MoE forward + backward with grouped experts runs no op that waits
for the device (no masked_select / nonzero / item / tolist / .cpu()); elsewhere megatron's stays."""
import logging
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from test_grouped_experts import _forward_backward, _model

SYNC_OPS = ("masked_select", "nonzero.", "nonzero_numpy", "_local_scalar_dense", "unique", "bincount")


@pytest.fixture(autouse=True)
def _fresh_state():
    from mindspeed_rl.models import grouped_experts, moe_dispatch

    moe_dispatch._STATE["failed"] = grouped_experts._STATE["failed"] = None
    yield
    moe_dispatch._STATE["failed"] = grouped_experts._STATE["failed"] = None


def _dispatchers(model):
    return [m.token_dispatcher for m in model.modules() if hasattr(m, "token_dispatcher")]


def _megatrons(model):
    """The model with megatron's own allgather dispatcher back in every MoE layer."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher

    for d in _dispatchers(model):
        d.__class__ = MoEAllGatherTokenDispatcher
    return model


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("b,s", [(2, 6), (1, 3)])  # (1, 3): 6 routed slots over 8 experts, some get none
def test_static_dispatch_is_megatrons_bit_for_bit(gloo_world1, grouped, b, s):
    from mindspeed_rl.models.moe_dispatch import StaticAllGatherDispatcher

    ours = _model(moe_grouped_gemm=grouped)
    assert [type(d) for d in _dispatchers(ours)] == [StaticAllGatherDispatcher] * 2
    theirs = _megatrons(_model(moe_grouped_gemm=grouped))
    logits, grads, counts = _forward_backward(ours, b, s)
    ref_logits, ref_grads, ref_counts = _forward_backward(theirs, b, s)
    assert counts == ref_counts and sum(counts[0]) == b * s * 2
    if (b, s) == (1, 3):
        assert all(0 in c for c in counts)
    assert torch.equal(logits, ref_logits)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        assert torch.equal(grads[n], ref_grads[n]), n


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _host_syncs(monkeypatch, fn):
    """The ops of fn() that wait for the device: data-dependent aten ops, and Tensor.cpu / tolist /
    item calls (on CPU these dispatch no aten op, so they are counted at the Python level)."""
    calls = []
    for name in ("cpu", "tolist", "item"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **k):
            calls.append(f"Tensor.{_name}")
            return _original(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    with _Recorder() as rec:
        fn()
    monkeypatch.undo()
    return calls + [op for op in rec.ops if any(s in op for s in SYNC_OPS)]


def _moe_layers(model):
    return [m for m in model.modules() if hasattr(m, "token_dispatcher")]


def test_moe_layer_with_grouped_experts_has_no_host_sync(gloo_world1, monkeypatch):
    """Each MoE layer (router, dispatcher, grouped experts, unpermute), forward and backward, fp32;
    megatron's dispatcher and the sequential experts do sync (so the probe sees them)."""
    model = _model(moe_grouped_gemm=True)
    layer = _moe_layers(model)[0]
    x = torch.randn(6, 2, 32, requires_grad=True)  # (S, B, H)

    def step():
        out, _ = layer(x)
        out.float().pow(2).sum().backward()
    assert _host_syncs(monkeypatch, step) == []
    with torch.no_grad():
        assert _host_syncs(monkeypatch, lambda: layer(x)) == []
    sequential = _moe_layers(_model())[0]  # static dispatch, SequentialMLP: its one tolist
    assert _host_syncs(monkeypatch, lambda: sequential(x)) == ["Tensor.tolist"]
    megatron = _moe_layers(_megatrons(_model(moe_grouped_gemm=True)))[0]
    found = _host_syncs(monkeypatch, lambda: megatron(x))
    assert "Tensor.cpu" in found and found.count("aten.masked_select.default") == 2, found


def test_applies_only_where_the_pairs_are_known_ahead():
    from mindspeed_rl.models.moe_dispatch import applies

    def dispatcher(ep=1, **config):
        c = dict(moe_expert_capacity_factor=None, moe_pad_expert_input_to_capacity=False, moe_permute_fusion=False)
        return types.SimpleNamespace(ep_size=ep, config=types.SimpleNamespace(**dict(c, **config)))
    assert applies(dispatcher())
    assert not applies(dispatcher(ep=2))  # a rank's share of the pairs depends on the routing
    assert not applies(dispatcher(moe_expert_capacity_factor=1.0))  # dropped tokens
    assert not applies(dispatcher(moe_pad_expert_input_to_capacity=True))
    assert not applies(dispatcher(moe_permute_fusion=True))  # Transformer Engine's fused permute


def test_without_nonzero_static_megatrons_permutation_serves(gloo_world1, monkeypatch, caplog):
    from mindspeed_rl.models import moe_dispatch

    ref_logits, ref_grads, _ = _forward_backward(_megatrons(_model(moe_grouped_gemm=True)), 2, 6)
    model = _model(moe_grouped_gemm=True)

    def missing(*args, **kwargs):
        raise NotImplementedError("aten::nonzero_static is not implemented for this device")
    monkeypatch.setattr(torch, "nonzero_static", missing)
    with caplog.at_level(logging.WARNING, logger="mindspeed_rl.models.moe_dispatch"):
        logits, grads, _ = _forward_backward(model, 2, 6)
    assert torch.equal(logits, ref_logits) and all(torch.equal(grads[n], ref_grads[n]) for n in grads)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["MoE dispatch: torch.nonzero_static failed (NotImplementedError: aten::nonzero_static is "
                        "not implemented for this device); tokens are permuted with megatron's masked_select "
                        "(a host sync per MoE layer) from here on."], warnings
    assert isinstance(moe_dispatch.failed(), NotImplementedError)


def test_static_permute_matches_masked_select_on_random_maps():
    """Many random top-k maps (ties in the probs included): megatron's masked_select order and values."""
    from mindspeed_rl.models.moe_dispatch import static_permute

    g = torch.Generator().manual_seed(0)
    for n, e, k in [(1, 4, 1), (5, 8, 2), (33, 16, 4), (64, 3, 3)]:
        scores = torch.rand(n, e, generator=g)
        top = scores.topk(k, dim=1).indices
        local_map = torch.zeros(n, e, dtype=torch.bool).scatter(1, top, True)
        probs = torch.where(local_map, scores, torch.zeros(()))
        hidden = torch.randn(n, 7, generator=g)
        permuted, ids, pprobs, counts = static_permute(hidden, local_map, probs, k)
        want_ids = torch.arange(n).expand(e, n).masked_select(local_map.T.contiguous())
        assert torch.equal(ids, want_ids) and torch.equal(permuted, hidden[want_ids])
        assert torch.equal(pprobs, probs.T.contiguous().masked_select(local_map.T.contiguous()))
        assert torch.equal(counts, local_map.sum(0))
