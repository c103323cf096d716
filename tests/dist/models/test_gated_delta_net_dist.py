"""The Gated DeltaNet mixer (models/gated_delta_net.py) at TP 2, with and without sequence parallelism,
against transformers' Qwen3.5 layer: each rank holds half of the key and value heads; the output and
the input's gradient equal transformers' and every parameter's gradient is this rank's share of
transformers' (the gated norm's weight, whole on both ranks but normalising different heads on each,
holds the whole gradient: its TP sum is in the autograd graph). The GVA ratio is 2 (a rank's value
heads read its own key heads).

Tolerance: 1e-4 of each tensor's scale. The gated norm divides a head's output by its RMS, and where
that output is small (a head whose q and k barely meet) it turns the few-ulp differences of another
summation order (two half matmuls, an all-reduce) into relative ones; a misplaced head is off by O(1)."""

import pytest

from testing_utils import assert_near, delta_batch, hf_delta_net, run_gloo, shape_of

pytestmark = pytest.mark.dist


def delta_net_tp2_job(rank, world_size):
    from testing_utils import delta_batch, hf_delta_net, mask_4d, ours_delta_net

    from mindspeed_rl.models.builder import destroy_parallel_state, init_parallel_state
    init_parallel_state(world_size, 1)
    results = {}
    for sp in (False, True):
        hf, config = hf_delta_net(seed=5)  # the same weights on both ranks (seeded)
        ours = ours_delta_net(hf, config, tp=world_size, rank=rank, sequence_parallel=sp)
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
        shape_parts = {"in_proj": ours.in_proj.weight.grad, "conv1d": ours.conv1d.weight.grad,
                       "A_log": ours.A_log.grad, "dt_bias": ours.dt_bias.grad, "norm": ours.norm.weight.grad,
                       "out_proj": ours.out_proj.weight.grad}
        results[sp] = (out.detach(), xs.grad, shape_parts)
    destroy_parallel_state()
    return results


def test_delta_net_at_tp2_equals_transformers():
    from mindspeed_rl.models.delta_layout import conv_from_hf, in_proj_from_parts

    hf, config = hf_delta_net(seed=5)
    x, mask, w = delta_batch(seq=70, pad=9, seed=6)
    x = x.requires_grad_(True)
    ref = hf(x, attention_mask=mask)
    (ref * w)[mask.bool()].sum().backward()
    shape, tp = shape_of(config), 2
    in_proj_grad = in_proj_from_parts(hf.in_proj_qkv.weight.grad, hf.in_proj_z.weight.grad, hf.in_proj_b.weight.grad,
                                      hf.in_proj_a.weight.grad, shape)
    conv_grad = conv_from_hf(hf.conv1d.weight.grad, shape)
    ref_t, x_grad_t = ref.detach().transpose(0, 1), x.grad.transpose(0, 1)
    keep = mask.bool().t()
    per_rank = run_gloo(delta_net_tp2_job, tp, timeout_s=240, name="Gated DeltaNet TP 2 job")
    for rank, result in enumerate(per_rank):
        for sp, (out, x_grad, grads) in result.items():
            want_out, want_grad, k = ref_t, x_grad_t, keep
            if sp:
                want_out, want_grad, k = ref_t.chunk(tp)[rank], x_grad_t.chunk(tp)[rank], keep.chunk(tp)[rank]
            assert_near(out[k], want_out[k], rel=1e-4, what=f"rank {rank} SP {sp} output")
            assert_near(x_grad[k], want_grad[k], rel=1e-4, what=f"rank {rank} SP {sp} input gradient")
            want = {"in_proj": in_proj_grad.chunk(tp)[rank], "conv1d": conv_grad.chunk(tp)[rank],
                    "A_log": hf.A_log.grad.chunk(tp)[rank], "dt_bias": hf.dt_bias.grad.chunk(tp)[rank],
                    "norm": hf.norm.weight.grad, "out_proj": hf.out_proj.weight.grad.chunk(tp, dim=1)[rank]}
            for name, g in want.items():
                assert_near(grads[name], g, rel=1e-4, what=f"rank {rank} SP {sp} {name}")
