"""platform/wgrad_fusion.py: on CPU the DDP-wrapped model's linear layers accumulate their weight
gradients into main_grad inside the GEMM, and its word embedding its rows (index_add_); over 2
micro-batches every main_grad equals megatron's unfused path (param.grad, then the hook's add_) to
a few float32 ulps of its largest element, 4 x eps = 4.8e-7 relative (the first micro-batch bitwise,
but for the tied weight, whose two parts are summed in another order; the second adds A B to the
first inside the GEMM instead of after it: one rounding against two, 2 ulps apart in one CI run),
tied and untied embeddings; no (V, H) gradient is allocated, filled or added for the embedding; a model without DDP keeps megatron's embedding; the accumulation function is visible to
megatron's layers module only."""
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
    wgrad_fusion.unfuse_embeddings(plain.module)
    assert (fused.module.embedding.word_embeddings.forward.__func__ is wgrad_fusion._embedding_forward
            and "forward" not in vars(plain.module.embedding.word_embeddings))
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
    shared = [n == "embedding.word_embeddings.weight" and not untie for n, _ in fused.module.named_parameters()]
    ulps = 4 * torch.finfo(torch.float32).eps  # of the largest element: summation order only
    for ours, theirs, tied in zip(grads["fused"][0], grads["plain"][0], shared):
        if not tied:  # first micro-batch: 0 + A B is A B; the tied weight: (out + e1) + e2 against out + (e1 + e2)
            assert torch.equal(ours, theirs)
        assert (ours - theirs).abs().max() <= ulps * theirs.abs().max()
    for ours, theirs in zip(grads["fused"][1], grads["plain"][1]):
        assert theirs.abs().max() > 0
        assert (ours - theirs).abs().max() <= ulps * theirs.abs().max()


def test_visible_to_megatron_only_and_cpu_only(gloo_world1, monkeypatch):
    wgrad_fusion.install()
    assert layers._grad_accum_fusion_available and hasattr(layers, wgrad_fusion._KERNEL)
    assert wgrad_fusion._KERNEL not in sys.modules
    init_parallel_state(1, 1, seed=3)
    monkeypatch.setattr(wgrad_fusion, "applies", lambda: False)  # another platform: nothing switched
    model = build_gpt_model(ARGS)
    assert wgrad_fusion.enable(model) == 0
    assert not any(getattr(m, "gradient_accumulation_fusion", False) for m in model.modules())


def _backward_ops(ddp, ids):
    """(name, input shapes) of every operator one forward + backward of the DDP model runs."""
    mask = torch.ones_like(ids)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        ddp(ids, position_ids_from_mask(mask), attention_mask_4d(mask)).square().mean().backward()
    return [(e.name, e.input_shapes) for e in prof.events()]


@pytest.mark.parametrize("untie", [False, True])
def test_no_vocab_by_hidden_temporary(gloo_world1, untie):
    init_parallel_state(1, 1, seed=3)
    ids = torch.randint(1, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    for fused in (True, False):
        ddp = wrap_ddp(build_gpt_model(dict(ARGS, untie_embeddings_and_output_weights=untie)),
                       use_distributed_optimizer=False)
        weight = ddp.module.embedding.word_embeddings.weight
        if not fused:
            wgrad_fusion.unfuse_embeddings(ddp.module)
        assert getattr(weight, "zero_out_wgrad", False) == (not untie and not fused)
        ops = _backward_ops(ddp, ids)
        vocab_by_hidden = [name for name, shapes in ops if name in ("aten::fill_", "aten::zero_", "aten::add_")
                           and shapes and shapes[0] == [40, 32]]
        dense = [name for name, _ in ops if name == "aten::embedding_dense_backward"]
        if fused:  # rows into main_grad; no (V, H) zeros, scatter or add_ of one (the tied dummy is not zeros)
            assert vocab_by_hidden == [] and dense == []
            assert ("aten::index_add_", [[40, 32], [], [14], [14, 32], []]) in ops
        else:  # megatron's: zeros + scatter, (tied: the output layer's zeros dummy, summed with it,) the hook's add_
            assert dense and vocab_by_hidden.count("aten::add_") == (1 if untie else 2)
        assert weight.grad is None and weight.main_grad.abs().max() > 0


def test_reference_keeps_megatron_embedding(gloo_world1):
    init_parallel_state(1, 1, seed=3)
    model = build_gpt_model(ARGS)  # no DDP: no main_grad, the reference's case
    wgrad_fusion.enable(model)
    embedding = model.embedding.word_embeddings
    assert "forward" not in vars(embedding) and embedding.weight.zero_out_wgrad
    mask = torch.ones(2, 5, dtype=torch.long)
    logits = model(torch.randint(1, 40, (2, 5)), position_ids_from_mask(mask), attention_mask_4d(mask))
    assert logits.shape == (2, 5, 40)


@pytest.mark.parametrize("block_elements", [1, 5 * 6, 1 << 20])
def test_bf16_gradient_added_in_blocks_equals_the_whole_product(monkeypatch, block_elements):
    """bf16 activations with the fp32 main_grad: the product in bf16 then added in fp32, as megatron's
    unfused path, block by block of output rows (one row, 5 rows with a remainder, all at once):
    bit for bit the whole product added at once."""
    monkeypatch.setattr(wgrad_fusion, "_BLOCK_ELEMENTS", block_elements)
    g = torch.Generator().manual_seed(0)
    go = torch.randn(2, 7, 23, generator=g).bfloat16()  # (s, b, out)
    x = torch.randn(2, 7, 6, generator=g).bfloat16()  # (s, b, in)
    main_grad = torch.randn(23, 6, generator=g)
    expected = main_grad + go.reshape(-1, 23).t().matmul(x.reshape(-1, 6))
    wgrad_fusion._wgrad_gemm_accum(x, go, main_grad)
    assert torch.equal(main_grad, expected)
