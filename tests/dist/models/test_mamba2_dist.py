"""The Mamba-2 mixer (models/mamba2.py, Granite 4.0-H) at TP 2, with and without sequence parallelism,
against transformers' GraniteMoeHybridMambaLayer: each rank holds half of the heads; the output and the
input's gradient equal transformers' and every parameter's gradient is this rank's share of transformers'.
B / C's projection and conv, whole on both ranks, hold the whole gradient (their TP sum is in the autograd
graph). With one group (Granite's) the gated norm's group spans both ranks: its sum of squares is
all-reduced; with two groups each rank holds one whole group and normalises alone.

Tolerance: 1e-4 of each tensor's scale (another summation order: two half matmuls, an all-reduce)."""

import pytest
import torch

from testing_utils import assert_near, delta_batch, hf_mamba2, mamba_shape_of, run_gloo

pytestmark = pytest.mark.dist

GROUPS = (1, 2)


def mamba2_tp2_job(rank, world_size):
    from testing_utils import delta_batch, hf_mamba2, mask_4d, ours_mamba2

    from mindspeed_rl.models.builder import destroy_parallel_state, init_parallel_state
    init_parallel_state(world_size, 1)
    results = {}
    for groups in GROUPS:
        for sp in (False, True):
            hf, config = hf_mamba2(groups=groups, seed=5)  # the same weights on both ranks (seeded)
            ours = ours_mamba2(hf, config, tp=world_size, rank=rank, sequence_parallel=sp)
            x, mask, w = delta_batch(seq=70, pad=9, seed=6)
            xs = x.transpose(0, 1).contiguous()
            if sp:
                xs = xs.chunk(world_size)[rank].contiguous()
            xs.requires_grad_(True)
            out, _ = ours(xs, attention_mask=mask_4d(mask))
            ws = w.transpose(0, 1)
            keep = mask.bool().t()
            if sp:
                ws, keep = ws.chunk(world_size)[rank], keep.chunk(world_size)[rank]
            (out * ws)[keep].sum().backward()
            grads = {"zxdt": ours.in_proj_zxdt.weight.grad, "bc": ours.in_proj_bc.weight.grad,
                     "conv_x": ours.conv1d_x.weight.grad, "conv_x_bias": ours.conv1d_x.bias.grad,
                     "conv_bc": ours.conv1d_bc.weight.grad, "conv_bc_bias": ours.conv1d_bc.bias.grad,
                     "A_log": ours.ssm_A_log.grad, "D": ours.ssm_D.grad, "dt_bias": ours.ssm_dt_bias.grad,
                     "norm": ours.ssm_norm.weight.grad, "out_proj": ours.ssm_out_proj.weight.grad}
            results[(groups, sp)] = (out.detach(), xs.grad, grads)
    destroy_parallel_state()
    return results


def test_mamba2_at_tp2_equals_transformers():
    from mindspeed_rl.models.mamba_layout import zxdt_from_parts

    per_rank = run_gloo(mamba2_tp2_job, 2, timeout_s=240, name="Mamba-2 TP 2 job")
    tp = 2
    for groups in GROUPS:
        hf, config = hf_mamba2(groups=groups, seed=5)
        x, mask, w = delta_batch(seq=70, pad=9, seed=6)
        x = x.requires_grad_(True)
        ref = hf(x, attention_mask=mask)
        (ref * w)[mask.bool()].sum().backward()
        shape = mamba_shape_of(config)
        z, xg, b, c, dt = hf.in_proj.weight.grad.split(shape.stored_in_proj_widths())
        cx, cbc = hf.conv1d.weight.grad.split([shape.inner, 2 * groups * shape.state])
        bx, bbc = hf.conv1d.bias.grad.split([shape.inner, 2 * groups * shape.state])
        ref_t, x_grad_t = ref.detach().transpose(0, 1), x.grad.transpose(0, 1)
        keep = mask.bool().t()
        for rank, result in enumerate(per_rank):
            for sp in (False, True):
                out, x_grad, grads = result[(groups, sp)]
                want_out, want_grad, k = ref_t, x_grad_t, keep
                if sp:
                    want_out, want_grad, k = ref_t.chunk(tp)[rank], x_grad_t.chunk(tp)[rank], keep.chunk(tp)[rank]
                what = f"groups {groups} rank {rank} SP {sp}"
                assert_near(out[k], want_out[k], rel=1e-4, what=f"{what} output")
                assert_near(x_grad[k], want_grad[k], rel=1e-4, what=f"{what} input gradient")
                want = {"zxdt": zxdt_from_parts(z, xg, dt, shape).chunk(tp)[rank], "bc": torch.cat([b, c]),
                        "conv_x": cx.chunk(tp)[rank], "conv_x_bias": bx.chunk(tp)[rank], "conv_bc": cbc,
                        "conv_bc_bias": bbc, "A_log": hf.A_log.grad.chunk(tp)[rank], "D": hf.D.grad.chunk(tp)[rank],
                        "dt_bias": hf.dt_bias.grad.chunk(tp)[rank], "norm": hf.norm.weight.grad.chunk(tp)[rank],
                        "out_proj": hf.out_proj.weight.grad.chunk(tp, dim=1)[rank]}
                for name, g in want.items():
                    assert_near(grads[name], g, rel=1e-4, what=f"{what} {name}")
