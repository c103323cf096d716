"""Apertus's xIELU at TP 2 (models/xielu.py): each rank applies the activation to its half of the MLP's
features, so each rank's gradient of a layer's alpha_p / alpha_n is a part of the whole. The logits equal
transformers', and after train_step.finalize_grads (megatron's DDP and finalize_model_grads, then the TP
sum of the tp_partial_grad parameters) the scalars' gradients equal transformers' autograd ones on both
ranks, with and without SP (checked: without that sum they are each rank's part and fail), as do the
q / k norms' and the other weights' that are whole on every rank."""

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
        finalize_grads([ddp])
        grads = {n: p.main_grad.clone() for n, p in model.named_parameters()}
        out[sp] = (logits.detach(), grads)
    ps.destroy_model_parallel()
    return out


def test_xielu_at_tp2_equals_transformers(tmp_path):
    from mindspeed_rl.models.forward import position_ids_from_mask

    hf = make_tiny_hf("apertus", str(tmp_path))
    ids, mask, weights = _batch()
    logits = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    (logits * weights * mask[..., None]).sum().backward()
    per_rank = run_gloo(_job, 2, str(tmp_path), timeout_s=240, name="Apertus TP 2 job")
    real = mask.bool()
    for result in per_rank:
        for sp, (got, grads) in result.items():
            assert (got - logits.detach())[real].abs().max() <= 1e-4, f"SP {sp}"
            for i, layer in enumerate(hf.model.layers):
                for name in ("alpha_p", "alpha_n"):
                    torch.testing.assert_close(grads[f"decoder.layers.{i}.mlp.activation_func.{name}"],
                                               getattr(layer.mlp.act_fn, name).grad, atol=1e-4, rtol=1e-4,
                                               msg=f"SP {sp} layer {i} {name}")
                for ours, theirs in (("self_attention.q_layernorm.weight", layer.self_attn.q_norm),
                                     ("pre_mlp_layernorm.weight", layer.feedforward_layernorm)):
                    torch.testing.assert_close(grads[f"decoder.layers.{i}.{ours}"], theirs.weight.grad,
                                               atol=1e-4, rtol=1e-4, msg=f"SP {sp} layer {i} {ours}")
