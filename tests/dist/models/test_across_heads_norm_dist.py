"""OLMo 2's q / k norms over all heads at TP 2 (models/olmo.py): each rank holds half of the heads and
half of each norm weight, sums its squares and all-reduces the sum. The logits equal transformers',
and the gradients of every weight (the norm slices included) equal transformers' autograd ones: the
all-reduce's backward carries each rank's loss to the other rank's heads. Also with SP. The gradients
are the ones training steps with: megatron's DDP and finalize_model_grads as train_step.finalize_grads
calls it, whose by-name TP sum of q / k norm gradients would add the other slice's (checked: without
olmo.kept_from_tp_sum the norm slices fail)."""

import pytest
import torch

from testing_utils import make_tiny_hf, run_gloo

pytestmark = pytest.mark.dist

VOCAB, PADDED = 120, 128


def _batch():
    torch.manual_seed(3)
    ids = torch.randint(0, VOCAB, (2, 24))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    weights = torch.randn(2, 24, VOCAB)  # loss = sum(logits x weights) over real positions
    return ids, mask, weights


def _job(rank, world_size, hf_dir):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.optimizer import wrap_ddp
    from mindspeed_rl.models.parallel import pad_for_sequence_parallel, parallel_config_kwargs
    from mindspeed_rl.models.train_step import finalize_grads

    args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=PADDED)
    ids, mask, weights = _batch()
    out = {}
    for sp in (False, True):
        init_parallel_state(tp=2, pp=1, seed=1)
        model = build_gpt_model(args, config_overrides=parallel_config_kwargs(sequence_parallel=sp))
        load_hf_checkpoint(model, hf_dir, args)
        ddp = wrap_ddp(model, use_distributed_optimizer=False)
        model.train()
        pids, pmask = ids, mask
        if sp:
            pids, pmask = pad_for_sequence_parallel(ids, mask, 2)
        logits = model(pids, position_ids_from_mask(pmask), attention_mask_4d(pmask))  # (b, s, V/TP)
        logits = gather_from_tensor_model_parallel_region(logits)[:, :ids.shape[1], :VOCAB]
        loss = (logits * weights * mask[..., None]).sum()
        ddp.zero_grad_buffer()
        loss.backward()
        finalize_grads([ddp])  # DP (1 here), SP and q / k norm sums over TP, as a training step does
        grads = {n: p.main_grad.clone() for n, p in model.named_parameters()}
        out[sp] = (logits.detach(), grads, ps.get_tensor_model_parallel_rank())
    ps.destroy_model_parallel()
    return out


def test_across_heads_norm_at_tp2_equals_transformers(tmp_path):
    from mindspeed_rl.models.forward import position_ids_from_mask

    hf = make_tiny_hf("olmo2", str(tmp_path))
    ids, mask, weights = _batch()
    logits = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    (logits * weights * mask[..., None]).sum().backward()
    per_rank = run_gloo(_job, 2, str(tmp_path), timeout_s=240, name="OLMo 2 TP 2 job")
    real = mask.bool()
    layers = hf.model.layers
    for result in per_rank:
        for sp, (got, grads, tp_rank) in result.items():
            assert (got - logits.detach())[real].abs().max() <= 1e-4, f"SP {sp}"
            for i, layer in enumerate(layers):
                for which, norm in (("q", layer.self_attn.q_norm), ("k", layer.self_attn.k_norm)):
                    mine = grads[f"decoder.layers.{i}.self_attention.{which}_layernorm.sharded_weight"]
                    ref = norm.weight.grad.chunk(2)[tp_rank]  # this rank's heads
                    torch.testing.assert_close(mine, ref, atol=1e-4, rtol=1e-4, msg=f"SP {sp} layer {i} {which}_norm")
                torch.testing.assert_close(grads[f"decoder.layers.{i}.post_self_attn_layernorm.weight"],
                                           layer.post_attention_layernorm.weight.grad, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(grads[f"decoder.layers.{i}.post_mlp_layernorm.weight"],
                                           layer.post_feedforward_layernorm.weight.grad, atol=1e-4, rtol=1e-4)
