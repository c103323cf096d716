"""Apertus's xIELU at TP 2 (models/xielu.py): each rank applies the activation to its half of the MLP's
features, so each rank's gradient of a layer's alpha_p / alpha_n is a part of the whole. The logits equal
transformers', and after train_step.finalize_grads (megatron's DDP and finalize_model_grads, then the TP
sum of the tp_partial_grad parameters) the scalars' gradients equal transformers' autograd ones on both
ranks, with and without SP (checked: without that sum they are each rank's part and fail), as do the
q / k norms' and the other weights' that are whole on every rank."""

import pytest
import torch

from testing_utils import hf_tp2_reference, make_tiny_hf, run_gloo, tp2_batch, tp2_grads_job

pytestmark = pytest.mark.dist


def test_xielu_at_tp2_equals_transformers(tmp_path):
    hf = make_tiny_hf("apertus", str(tmp_path))
    logits = hf_tp2_reference(hf)
    per_rank = run_gloo(tp2_grads_job, 2, str(tmp_path), timeout_s=240, name="Apertus TP 2 job")
    real = tp2_batch()[1].bool()
    for result in per_rank:
        for sp, (got, grads, _) in result.items():
            assert (got - logits)[real].abs().max() <= 1e-4, f"SP {sp}"
            for i, layer in enumerate(hf.model.layers):
                for name in ("alpha_p", "alpha_n"):
                    torch.testing.assert_close(grads[f"decoder.layers.{i}.mlp.activation_func.{name}"],
                                               getattr(layer.mlp.act_fn, name).grad, atol=1e-4, rtol=1e-4,
                                               msg=f"SP {sp} layer {i} {name}")
                for ours, theirs in (("self_attention.q_layernorm.weight", layer.self_attn.q_norm),
                                     ("pre_mlp_layernorm.weight", layer.feedforward_layernorm)):
                    torch.testing.assert_close(grads[f"decoder.layers.{i}.{ours}"], theirs.weight.grad,
                                               atol=1e-4, rtol=1e-4, msg=f"SP {sp} layer {i} {ours}")
