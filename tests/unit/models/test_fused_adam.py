"""torch's fused AdamW kernel inside megatron's optimizer (models/optimizer.use_fused_adam): switched
on where the platform has it, the same updates as the per-parameter loop, and kept through a resume
from a checkpoint whose saved param groups say otherwise."""
import pytest
import torch

from tests.unit.models.test_checkpoint import ARGS, _step, _trained


def _inner_groups(opt):
    return [g for o in getattr(opt, "chained_optimizers", [opt]) for g in o.optimizer.param_groups]


@pytest.mark.parametrize("distributed", [True, False])
def test_fused_equals_the_loop_and_survives_a_resume(gloo_world1, tmp_path, distributed):
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint

    fused = _trained(7, distributed)
    loop = _trained(7, distributed)
    assert all(g["fused"] and not g["foreach"] for g in _inner_groups(fused[1]))  # CPU: the fused kernel
    for g in _inner_groups(loop[1]):
        g["fused"] = False  # what torch picks on CPU by itself
    for i in range(3):
        _step(*fused, i)
        _step(*loop, i)
    worst = max((a - b).abs().max().item() for a, b in zip(fused[0].module.parameters(), loop[0].module.parameters()))
    assert 0 < sum((p - q).abs().sum().item() for p, q in zip(fused[0].module.parameters(),
                                                               _trained(7, distributed)[0].module.parameters()))
    assert worst < 1e-6, worst

    save_checkpoint(str(tmp_path), 3, loop[0], ARGS, loop[1], loop[2], vocab_size=40)  # groups saved unfused
    ddp, opt, sched = _trained(99, distributed)
    assert load_checkpoint(str(tmp_path), ddp, ARGS, opt, sched) == 3
    assert all(g["fused"] for g in _inner_groups(opt))
    steps = [s["step"] for o in getattr(opt, "chained_optimizers", [opt]) for s in o.optimizer.state.values()]
    assert steps and all(s.dtype == torch.float32 and float(s) == 3 for s in steps)
    _step(ddp, opt, sched, 3)
    _step(*loop, 3)
    worst = max((a - b).abs().max().item() for a, b in zip(ddp.module.parameters(), loop[0].module.parameters()))
    assert worst < 1e-6, worst
