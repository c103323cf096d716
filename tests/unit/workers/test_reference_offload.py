"""The colocated reference keeps its weights in host memory between calls (device platforms only):
on the device for the forward, back to the host after it, even when the forward raises."""
import pytest
import torch

from mindspeed_rl.workers.actor import ReferenceWorker


class FakeModel:
    def __init__(self):
        self.moves = []

    def to(self, device):
        self.moves.append(device.type)
        return self


def worker(offload, fail=False):
    w = ReferenceWorker.__new__(ReferenceWorker)  # no Ray, no process group: the offload logic only
    w.model, w.device, w.offload, w.cleared = FakeModel(), torch.device("meta"), offload, []
    w._empty_cache = lambda: w.cleared.append(True)
    w.seen_on = []

    def forward(model, batch):
        w.seen_on.append(model.moves[-1] if model.moves else "unmoved")
        if fail:
            raise RuntimeError("boom")
        return torch.zeros(2, 3)

    w._response_log_probs = forward
    return w


def test_weights_visit_the_device_only_for_the_forward():
    w = worker(offload=True)
    assert w.compute_ref_log_prob({}).shape == (2, 3)
    assert w.seen_on == ["meta"] and w.model.moves == ["meta", "cpu"] and w.cleared == [True]


def test_back_to_the_host_when_the_forward_raises():
    w = worker(offload=True, fail=True)
    with pytest.raises(RuntimeError, match="boom"):
        w.compute_ref_log_prob({})
    assert w.model.moves == ["meta", "cpu"] and w.cleared == [True]


def test_no_offload_means_no_moves():
    w = worker(offload=False)
    w.compute_ref_log_prob({})
    assert w.model.moves == [] and w.cleared == [] and w.seen_on == ["unmoved"]
