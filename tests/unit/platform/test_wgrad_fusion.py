"""platform/wgrad_fusion.py: on CPU the DDP-wrapped model's linear layers accumulate their weight
gradients into main_grad inside the GEMM; over 2 micro-batches every main_grad equals megatron's
unfused path (param.grad, then the hook's add_) to 1e-7 relative (the first micro-batch bitwise),
tied and untied embeddings; the accumulation function is visible to megatron's layers module only."""
import sys

import pytest
import torch

from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask
from mindspeed_rl.models.optimizer import wrap_ddp
from mindspeed_rl.platform import wgrad_fusion

from megatron.core.tensor_parallel import layers

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=8, padded_vocab_size=40, max_position_embeddings=32,
            add_qkv_bias=True, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)


@pytest.mark.parametrize("untie", [False, True])
def test_fused_main_grad_equals_unfused(gloo_world1, monkeypatch, untie):
    init_parallel_state(1, 1, seed=3)
    model = build_gpt_model(dict(ARGS, untie_embeddings_and_output_weights=untie))
    twin = build_gpt_model(dict(ARGS, untie_embeddings_and_output_weights=untie))
    twin.load_state_dict(model.state_dict())
    fused, plain = wrap_ddp(model, use_distributed_optimizer=False), wrap_ddp(twin, use_distributed_optimizer=False)
    linears = [m for m in plain.module.modules() if isinstance(m, (layers.ColumnParallelLinear, layers.RowParallelLinear))]
    assert len(linears) == 2 * 4 + 1 and all(m.gradient_accumulation_fusion for m in linears)
    for m in linears:  # the twin: megatron's path without fusion (param.grad, then DDP's add_)
        m.gradient_accumulation_fusion = False
    calls = []
    kernel = getattr(layers, wgrad_fusion._KERNEL)
    monkeypatch.setattr(kernel, "wgrad_gemm_accum_fp32", lambda *a: calls.append(1) or wgrad_fusion._wgrad_gemm_accum(*a))
    grads = {}
    for name, ddp in (("fused", fused), ("plain", plain)):
        ddp.zero_grad_buffer()
        after = []
        for seed in (0, 1):
            g = torch.Generator().manual_seed(seed)
            ids = torch.randint(1, 40, (3, 9), generator=g)
            mask = torch.ones(3, 9, dtype=torch.long)
            mask[0, :2] = 0
            logits = ddp(ids, position_ids_from_mask(mask), attention_mask_4d(mask))
            (logits.square() * torch.randn(logits.shape, generator=g)).mean().backward()
            after.append([p.main_grad.clone() for p in ddp.module.parameters()])
            assert all(p.grad is None for p in ddp.module.parameters())  # the hook consumed / skipped them
        grads[name] = after
    assert len(calls) == 2 * 9  # every linear layer, both micro-batches, went through the fused path
    for ours, theirs in zip(grads["fused"][0], grads["plain"][0]):
        assert torch.equal(ours, theirs)  # first micro-batch: 0 + A B is A B
    for ours, theirs in zip(grads["fused"][1], grads["plain"][1]):
        assert theirs.abs().max() > 0
        assert (ours - theirs).abs().max() <= 1e-7 * theirs.abs().max()


def test_visible_to_megatron_only_and_cpu_only(gloo_world1, monkeypatch):
    wgrad_fusion.install()
    assert layers._grad_accum_fusion_available and hasattr(layers, wgrad_fusion._KERNEL)
    assert wgrad_fusion._KERNEL not in sys.modules
    init_parallel_state(1, 1, seed=3)
    monkeypatch.setattr(wgrad_fusion, "applies", lambda: False)  # another platform: nothing switched
    model = build_gpt_model(ARGS)
    assert wgrad_fusion.enable(model) == 0
    assert not any(getattr(m, "gradient_accumulation_fusion", False) for m in model.modules())
