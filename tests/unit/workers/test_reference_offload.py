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


GIB = 2 ** 30


@pytest.mark.parametrize("platform,setting,weights,device,expected", [
    ("cpu", True, 14 * GIB, None, False),            # host memory already: nothing to move, whatever the key says
    ("cuda", True, GIB // 4, 141 * GIB, True),       # the key decides on a device
    ("npu", False, 14 * GIB, 64 * GIB, False),
    ("cuda", None, GIB // 4, 141 * GIB, False),      # auto: a 135M bf16 reference on an H200 stays (0.2 %)
    ("npu", None, 3 * GIB, 64 * GIB, False),         # a 1.5B one on a 64 GB NPU stays (4.7 %)
    ("npu", None, 14 * GIB, 64 * GIB, True),         # a 7B one is offloaded (22 %)
    ("cuda", None, GIB, None, True),                 # device memory unknown: offload, as before
])
def test_the_offload_decision(platform, setting, weights, device, expected):
    from mindspeed_rl.platform.placement import ref_offload

    offload, why = ref_offload(platform, setting, weights, device)
    assert offload is expected and why


def test_the_workers_decide_from_their_weights_and_the_devices_memory(caplog):
    from types import SimpleNamespace

    from mindspeed_rl.workers.actor import _decide_ref_offload

    chunk = torch.nn.Linear(10, 10)  # 110 fp32 values: 440 bytes
    gpu = lambda total: SimpleNamespace(name="cuda", total_memory_bytes=lambda: total)  # noqa: E731
    with caplog.at_level("INFO", logger="mindspeed_rl.workers.actor"):
        assert _decide_ref_offload(gpu(4400), None, [chunk]) is True      # 10 % of the device
        assert _decide_ref_offload(gpu(440_000), None, [chunk]) is False  # 0.1 %
        assert _decide_ref_offload(gpu(440_000), True, [chunk]) is True
    assert any("kept on the device" in r.getMessage() for r in caplog.records)
    cpu = SimpleNamespace(name="cpu", total_memory_bytes=lambda: pytest.fail("not asked on CPU"))
    assert _decide_ref_offload(cpu, True, [chunk]) is False
