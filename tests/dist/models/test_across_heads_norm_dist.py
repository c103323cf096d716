"""OLMo 2's q / k norms over all heads at TP 2 (models/olmo.py): each rank holds half of the heads and
half of each norm weight, sums its squares and all-reduces the sum. The logits equal transformers',
and the gradients of every weight (the norm slices included) equal transformers' autograd ones: the
all-reduce's backward carries each rank's loss to the other rank's heads. Also with SP. The gradients
are the ones training steps with: megatron's DDP and finalize_model_grads as train_step.finalize_grads
calls it, whose by-name TP sum of q / k norm gradients would add the other slice's (checked: without
olmo.kept_from_tp_sum the norm slices fail)."""

import pytest
import torch

from testing_utils import hf_tp2_reference, make_tiny_hf, run_gloo, tp2_batch, tp2_grads_job

pytestmark = pytest.mark.dist


def test_across_heads_norm_at_tp2_equals_transformers(tmp_path):
    hf = make_tiny_hf("olmo2", str(tmp_path))
    logits = hf_tp2_reference(hf)
    per_rank = run_gloo(tp2_grads_job, 2, str(tmp_path), timeout_s=240, name="OLMo 2 TP 2 job")
    real = tp2_batch()[1].bool()
    layers = hf.model.layers
    for result in per_rank:
        for sp, (got, grads, tp_rank) in result.items():
            assert (got - logits)[real].abs().max() <= 1e-4, f"SP {sp}"
            for i, layer in enumerate(layers):
                for which, norm in (("q", layer.self_attn.q_norm), ("k", layer.self_attn.k_norm)):
                    mine = grads[f"decoder.layers.{i}.self_attention.{which}_layernorm.sharded_weight"]
                    ref = norm.weight.grad.chunk(2)[tp_rank]  # this rank's heads
                    torch.testing.assert_close(mine, ref, atol=1e-4, rtol=1e-4, msg=f"SP {sp} layer {i} {which}_norm")
                torch.testing.assert_close(grads[f"decoder.layers.{i}.post_self_attn_layernorm.weight"],
                                           layer.post_attention_layernorm.weight.grad, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(grads[f"decoder.layers.{i}.post_mlp_layernorm.weight"],
                                           layer.post_feedforward_layernorm.weight.grad, atol=1e-4, rtol=1e-4)
