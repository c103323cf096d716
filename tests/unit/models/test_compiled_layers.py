"""`use_torch_compile` (models/compiled_layers.py): the decoder layers of the training and log-prob
forwards run through one shared torch.compile. The update and the log-probs equal the eager ones
(fp32: float rounding; with full recompute too), one set of graphs serves every layer and the graph
breaks only at megatron's parallel linears, the KV-cache attention of the native engine's
multi-rank path stays eager, and a compile that fails falls back to eager with one warning."""
import logging

import pytest
import torch

from testing_utils import HF_VARIANTS

from mindspeed_rl.models import compiled_layers
from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
from mindspeed_rl.models.forward import attention_mask_4d, compute_log_probs, position_ids_from_mask
from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
from mindspeed_rl.models.parallel import parallel_config_kwargs
from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

from test_train_step import ARGS, P, make_batch

ARGS3 = dict(ARGS, num_layers=3)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Compiled code and the fallback state are kept per process: each test starts clean."""
    torch._dynamo.reset()
    compiled_layers._STATE.update(compiled={}, failed=None)
    yield
    torch._dynamo.reset()
    compiled_layers._STATE.update(compiled={}, failed=None)


def _update(backend=None, recompute=None, state=None, dtype=torch.float32):
    init_parallel_state(1, 1, seed=7)
    model = build_gpt_model(ARGS3, params_dtype=dtype, config_overrides=parallel_config_kwargs(**(recompute or {})))
    if state is not None:
        model.load_state_dict(state, strict=False)
    state = {k: v.clone() for k, v in model.state_dict().items() if v is not None}
    if backend is not None:
        assert compiled_layers.install(model, backend=backend) == 3
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=0.5, train_iters=10, clip_grad=1e9, optimizer="sgd",
                                 use_distributed_optimizer=False, params_dtype=dtype)
    s = PolicyLossSettings(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, temperature=0.7)
    model.train()
    stats = policy_update_step(ddp, opt, sched, make_batch(), P, 2, s)
    b = make_batch(1)
    model.eval()
    with torch.no_grad():
        logp = compute_log_probs(model, b["input_ids"], b["attention_mask"], 2, 0.7, 40, from_position=P - 1)[0]
    return model, stats, state, logp


@pytest.mark.parametrize("recompute", [None, dict(recompute_granularity="full", recompute_method="uniform",
                                                  recompute_num_layers=1)])
def test_compiled_layers_update_and_log_probs_equal_eager(gloo_world1, recompute):
    """Inductor, fp32: one SGD update (two micro-batches, padded rows, KL + entropy) leaves the same
    weights and losses as the eager layers, and the log-probs after it agree, within 2e-6."""
    plain, plain_stats, state, plain_logp = _update(recompute=recompute)
    model, stats, _, logp = _update("inductor", recompute, state)
    worst = max((p.detach() - dict(plain.named_parameters())[n].detach()).abs().max().item()
                for n, p in model.named_parameters())
    assert worst <= 2e-6, worst
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert abs(stats[key] - plain_stats[key]) <= 2e-6, (key, stats[key], plain_stats[key])
    assert (logp - plain_logp).abs().max().item() <= 2e-6
    assert compiled_layers.failed() is None and torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 6


def _recording():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend, graphs


def _graphs_of_one_forward(num_layers: int) -> list:
    torch._dynamo.reset()
    init_parallel_state(1, 1, seed=7)
    model = build_gpt_model(dict(ARGS, num_layers=num_layers))
    backend, graphs = _recording()
    compiled_layers.install(model, backend=backend)
    b = make_batch()
    for _ in range(2):  # the same shapes the second time: nothing new to compile
        with torch.no_grad():
            model(b["input_ids"], position_ids_from_mask(b["attention_mask"]), attention_mask_4d(b["attention_mask"]))
    return graphs


def test_one_set_of_graphs_serves_every_layer_and_breaks_only_at_the_linears(gloo_world1):
    """The graphs Dynamo hands the backend for a forward of three layers are those of one layer, not one
    set per layer: the pieces around a layer's four parallel linears, which stay eager (six on
    megatron-core 0.12, nine on 0.16, whose layer calls more methods of its own: a linear inside a
    method ends a piece in that method and in each caller); no graph holds a matmul of the linears."""
    one, three = _graphs_of_one_forward(1), _graphs_of_one_forward(3)
    assert 1 <= len(three) == len(one) <= 12, (len(one), len(three))
    targets = {str(n.target) for g in three for n in g.graph.nodes if n.op == "call_function"}
    assert not any("matmul" in t or "linear" in t or ".mm" in t for t in targets), targets


def test_the_engines_cached_attention_path_stays_eager(gloo_world1):
    """With the KV-cache attention swapped in (rollout/kv_cache.cached_attention, the engine's TP/PP
    path, which writes into its cache), a layer runs eagerly: nothing is compiled, and the last
    logits equal those of a model without compiled layers."""
    from mindspeed_rl.rollout import kv_cache

    init_parallel_state(1, 1, seed=7)
    model = build_gpt_model(ARGS3).eval()
    plain = build_gpt_model(ARGS3).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    backend, graphs = _recording()
    compiled_layers.install(model, backend=backend)
    ids = make_batch()["input_ids"][:, :P]
    pos = torch.arange(P)[None].expand_as(ids)
    mask = torch.triu(torch.ones(P, P, dtype=torch.bool), 1)[None, None].expand(ids.shape[0], 1, P, P)
    out = []
    with torch.no_grad():
        for m in (model, plain):
            cache = kv_cache.new_cache(m, ids.shape[0], 8)
            with kv_cache.cached_attention(m, cache):
                out.append(kv_cache.forward_stage(m, ids, pos, mask, cache))
    assert graphs == []
    assert torch.equal(out[0], out[1])


def test_a_failing_compile_falls_back_to_eager_with_the_fix(gloo_world1, caplog):
    """Inductor with no C++ compiler: one warning names the error and the fix, the update runs eagerly
    and equals the eager one, and later layers do not try again."""
    from torch._inductor.compile_fx import compile_fx

    def inductor_without_cxx(gm, example_inputs):
        with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/g++",), "fx_graph_cache": False}):
            return compile_fx(gm, example_inputs)

    plain, plain_stats, state, plain_logp = _update()
    with caplog.at_level(logging.WARNING, logger="mindspeed_rl.models.compiled_layers"):
        model, stats, _, logp = _update(inductor_without_cxx, state=state)
    said = [r.getMessage() for r in caplog.records if "torch.compile failed on a decoder layer" in r.getMessage()]
    assert len(said) == 1 and "C++ compiler" in said[0] and "use_torch_compile: false" in said[0], said
    assert "InvalidCxxCompiler" in said[0], said
    assert isinstance(compiled_layers.failed(), Exception)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), dict(plain.named_parameters())[n].detach()), n
    assert stats["actor/pg_loss"] == plain_stats["actor/pg_loss"] and torch.equal(logp, plain_logp)


def test_a_compile_failing_in_the_backward_falls_back_before_the_step(gloo_world1, caplog):
    """A backend whose backward compiler fails: the backward is compiled with the forward, so the
    failure surfaces at the layer's first call, where the fallback catches it, and not from
    loss.backward() in the middle of a step. The update equals the eager one."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def backward_compiler(gm, example_inputs):
        raise RuntimeError("backward lowering failed")

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=backward_compiler)
    plain, plain_stats, state, plain_logp = _update()
    with caplog.at_level(logging.WARNING, logger="mindspeed_rl.models.compiled_layers"):
        model, stats, _, logp = _update(backend, state=state)
    said = [r.getMessage() for r in caplog.records if "torch.compile failed on a decoder layer" in r.getMessage()]
    assert len(said) == 1 and "(RuntimeError: backward lowering failed)" in said[0], said
    assert "use_torch_compile: false" in said[0] and "C++" not in said[0], said
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), dict(plain.named_parameters())[n].detach()), n
    assert stats["actor/pg_loss"] == plain_stats["actor/pg_loss"] and torch.equal(logp, plain_logp)


def test_moe_layers_stay_eager():
    from megatron.core.transformer.transformer_layer import TransformerLayer

    class Layer(TransformerLayer):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.mlp = torch.nn.Linear(2, 2)

    assert not compiled_layers.compilable(Layer())
    from mindspeed_rl.platform.base import compiled_layers as applies

    assert applies("cpu") and applies("cuda") and not applies("npu")


# GPT-NeoX's parallel residual with the MLP's own norm (its weights registered on the module the hooks feed) passed
# here on 2026-11-29 (7 s) and is left out for CI's time: its hooks are Cohere 2's
@pytest.mark.parametrize("arch,kw", [("smollm3", dict(num_hidden_layers=4)),
                                     ("gemma3_text", dict(num_hidden_layers=4)), ("gemma2", dict(num_hidden_layers=2)),
                                     ("olmo3", dict(num_hidden_layers=2)), ("cohere2", dict(num_hidden_layers=2)),
                                     ("granitemoehybrid", dict(num_hidden_layers=2, **HF_VARIANTS["granitemoehybrid-h"]))])
def test_compiled_layers_keep_per_layer_hooks(arch, kw, tmp_path, gloo_world1):
    """The one compiled TransformerLayer.forward serves layers that differ by a forward pre-hook:
    SmolLM3's NoPE layers (megatron-core 0.12: a hook drops their rotary embedding) and a sliding
    window (a hook on every core attention), Gemma 3's sliding layers (window and local rotary table)
    between full ones and its post norms (forward hooks on attention and MLP), Gemma 2's soft-capped
    attention (its own core attention path, traced), OLMo 3's layers without pre-norms, its sliding
    layer rotating with an unscaled config copy and its full one with YaRN's attention factor, Cohere 2's parallel
    residual (the MLP's input handed over by hooks on the layer, outside the compiled forward; a graph break where the
    MLP input is read), sliding layer with RoPE and full one without: logits
    within 1e-4 of transformers, every layer compiled, no fallback. Granite 4.0-H: its attention layer compiled,
    its Mamba-2 layer eager (it has no core attention; installing crashed on it before)."""
    from testing_utils import make_tiny_hf
    from mindspeed_rl.models.builder import model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    hf = make_tiny_hf(arch, str(tmp_path), **kw)
    args = dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128)
    init_parallel_state(1, 1)
    model = build_gpt_model(args).eval()
    load_hf_checkpoint(model, str(tmp_path), args)
    torch.manual_seed(1)
    ids = torch.randint(0, 120, (2, 32))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    pos = position_ids_from_mask(mask)
    mixers = sum(1 for layer in model.decoder.layers if not hasattr(layer.self_attention, "core_attention"))
    assert mixers == (1 if arch == "granitemoehybrid" else 0)
    assert compiled_layers.install(model) == kw["num_hidden_layers"] - mixers
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        out = model(ids, pos, attention_mask_4d(mask))[..., :120]
    assert compiled_layers._STATE["failed"] is None
    assert (out - ref)[mask.bool()].abs().max() <= 1e-4
