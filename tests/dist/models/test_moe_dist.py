"""Qwen3-MoE and Qwen2-MoE (shared expert), each on 4 gloo processes, one spawn: logits vs transformers at (TP, PP, EP, ETP, SP) in
{(1,1,1,1), (1,1,2,1), (2,1,2,2,SP), (1,2,2,1)}; gradients of a summed log-prob loss (each DP rank
its slice of the batch, grads reduced as megatron's DDP does) vs transformers' autograd on the
whole batch; the same with moe_grouped_gemm's grouped experts at TP2/EP2/ETP2+SP; a live TP2/EP2/ETP2 checkpoint + HF export that reload at TP1/EP1 and export bit
for bit; and MoE routing replay at EP2 and TP2/EP2/ETP2+SP (models/moe_replay.py): the rollout's
recorded experts (the native engine at EP2 records what it does at EP1) replayed in the training
forward change nothing while the weights are the same, and route as recorded after they changed."""

import importlib.util

import pytest
import torch

from testing_utils import HF_VARIANTS, make_tiny_hf, per_expert, run_gloo

pytestmark = pytest.mark.dist

VOCAB, PADDED, SEQ = 120, 128, 16
# (tp, pp, ep, etp, sequence_parallel). Megatron needs SP for MoE at TP > 1 (without it the
# allgather dispatcher sees each TP rank's copy of the tokens, and expert gradients come out TP
# times too large: measured here, 2x at TP2; the forward is right), and its torch-norm fallback
# refuses SP: TP2/EP2/ETP2+SP runs once the builder swaps in an SP-capable norm (models/parallel.py,
# the sequence-parallel work). Until then TP2/EP1/ETP2 checks the ETP split (logits, save, export).
_SP_NORM = importlib.util.find_spec("mindspeed_rl.models.parallel") is not None
LAYOUTS = ((1, 1, 1, 1, False), (1, 1, 2, 1, False), (2, 1, 1, 2, False), (1, 2, 2, 1, False)) + \
    (((2, 1, 2, 2, True),) if _SP_NORM else ())
_SAVE_AT = LAYOUTS[-1] if _SP_NORM else (2, 1, 1, 2, False)  # the live checkpoint + export layout


def _run_as(layout, model_type):
    """The layout a model runs a LAYOUTS entry at: gpt-oss's biased experts take expert-TP 1 only
    (models/gpt_oss.py), so its ETP 2 layouts run at ETP 1 (the same TP / EP / SP)."""
    return (*layout[:3], 1, layout[4]) if model_type == "gpt_oss" else layout


def _batch():
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (4, SEQ))  # (B, S)
    mask = torch.ones(4, SEQ, dtype=torch.long)
    mask[0, :5], mask[3, 11:] = 0, 0  # left and right padding
    return ids, mask


def _loss(logits_or_lp, ids, mask):
    """-(sum of real-token log-probs) from (B, S-1) log-probs."""
    return -(logits_or_lp * (mask[:, 1:] * mask[:, :-1])).sum()


def _full_grads(model, args):
    """{HF name: full gradient} of the tensors this rank holds (TP / ETP shards merged)."""
    from mindspeed_rl.models.hf_bridge.loader import global_param_name
    from mindspeed_rl.models.hf_bridge.mapping import gated_mlp
    from mindspeed_rl.models.hf_bridge.sharding import kind_of, mcore_to_hf
    from mindspeed_rl.models.hf_export import gather_tp

    tied = not args.get("untie_embeddings_and_output_weights", False)
    out = {}
    for local, p in model.named_parameters():
        name = global_param_name(model, local)[0]
        out.update(mcore_to_hf(name, gather_tp(p.grad, kind_of(name, tied, gated_mlp(args))), args, VOCAB))
    return out


def _reduce_like_ddp(model, sp):
    """What megatron's DDP + finalize_model_grads do to local grads (sums, no averaging)."""
    from megatron.core import parallel_state as ps

    for name, p in model.named_parameters():
        expert = not getattr(p, "allreduce", True)  # megatron marks expert parameters allreduce=False
        # finalize_model_grads: SP norms and q/k norms (each TP rank saw a part) are summed over TP, except
        # the TP-split q / k norms across heads (MiniMax-M2's), which train_step.finalize_grads keeps out
        # (models/olmo.kept_from_tp_sum; the real call is tested in test_across_heads_norm_dist.py)
        partial = (sp and getattr(p, "sequence_parallel", False)) or (
            ("q_layernorm" in name or "k_layernorm" in name) and not name.endswith("sharded_weight"))
        if partial and ps.get_tensor_model_parallel_world_size() > 1:
            torch.distributed.all_reduce(p.grad, group=ps.get_tensor_model_parallel_group())
        group = ps.get_expert_data_parallel_group() if expert else ps.get_data_parallel_group()
        torch.distributed.all_reduce(p.grad, group=group)


def _generate(model, rank):
    """Greedy responses (and the recorded routing) for rank-dependent prompts: lengths differ across
    ranks, and so do the token budgets (max_length - prompt length), so EP ranks must agree on shapes
    and steps."""
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    g = torch.Generator().manual_seed(100 + rank)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3 + 2 * rank, 6 + rank)]
    engine = NativeEngine(model, vocab_size=VOCAB, max_length=20 + 2 * rank, eos_token_ids=(7,), pad_token_id=0,
                          record_routing=True)
    out = engine.generate(prompts, SamplingParams(n=1, do_sample=False))
    mask = torch.cat([out.prompt_mask, out.response_mask], 1).bool()  # (B, S): real tokens, any padding
    return ([r[m.bool()].tolist() for r, m in zip(out.responses, out.response_mask)],
            [routed[m][:-1].tolist() for routed, m in zip(out.routed_experts, mask)])  # the last token: never run


def _routing_of(routers):
    """Collects each router call's chosen experts (tokens, k), sorted, in call order."""
    seen = []

    def hook(module, inputs, output):
        seen.append(output[1].int().topk(module.topk, dim=1).indices.sort(dim=1).values)
    return seen, [r.register_forward_hook(hook) for _, r in routers]


def _pipeline_routing(model, ids, mask, pp: int):
    """Routing recorded through megatron's (pipeline) schedule, this DP rank's rows: under PP each
    stage records its own layers and `result` joins them; and at PP 2 the replayed forward equals
    the routers' own (same weights)."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.forward import compute_log_probs, forward_microbatches
    from mindspeed_rl.models.moe_replay import RoutingRecorder

    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    rows = slice(dp_rank * 4 // dp, (dp_rank + 1) * 4 // dp) if pp > 1 else slice(0, 4)  # PP 1: the reference
    ids, mask = ids[rows], mask[rows]
    recorder = RoutingRecorder(model, *ids.shape)
    recorder.at(torch.arange(ids.shape[0]), 0)
    with recorder, torch.no_grad():
        forward_microbatches(model, ids, mask, ids.shape[0], post_fn=lambda out, mb: out[..., :1])
    routed = recorder.result(mask)
    out = {"rows": (rows.start, rows.stop), "routed": routed}
    if pp > 1:
        with torch.no_grad():
            own = compute_log_probs(model, ids, mask, 1, vocab_size=VOCAB)
            replayed = compute_log_probs(model, ids, mask, 1, vocab_size=VOCAB, routed_experts=routed)
        if own is not None:  # the last stage
            real = (mask[:, 1:] * mask[:, :-1]).bool()
            out["same_weights_diff"] = float((own[0] - replayed[0])[real].abs().max())
    return out


def _replay_checks(model, ids, mask):
    """Routing replay on this rank's DP slice, 15 columns (odd: SP pads them): recorded as the engine
    records (SP off), replayed with the same weights and after the routers changed."""
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.forward import attention_mask_4d, compute_log_probs, position_ids_from_mask
    from mindspeed_rl.models.moe_replay import RoutingRecorder, columns, moe_routers
    from mindspeed_rl.models.parallel import sequence_parallel_off

    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    rows = slice(dp_rank * 4 // dp, (dp_rank + 1) * 4 // dp)
    ids, mask = ids[rows, :SEQ - 1], mask[rows, :SEQ - 1]
    recorder = RoutingRecorder(model, *ids.shape)
    recorder.at(torch.arange(ids.shape[0]), 0)
    with recorder, torch.no_grad(), sequence_parallel_off(model):
        model(ids, position_ids_from_mask(mask), attention_mask_4d(mask))
    routed = recorder.result(mask)  # (b, 15, L, k)
    with torch.no_grad():  # micro-batches of 1, sorted by length: the routing travels with the rows
        own = compute_log_probs(model, ids, mask, 1, vocab_size=VOCAB)[0]
        replayed = compute_log_probs(model, ids, mask, 1, vocab_size=VOCAB, routed_experts=routed)[0]
        torch.manual_seed(7)  # the same new routers on every rank
        for _, router in moe_routers(model):
            router.weight.add_(torch.randn_like(router.weight))
    routers = moe_routers(model)
    out = {}
    for name, replay in (("moved_own", None), ("moved_replay", routed)):
        seen, hooks = _routing_of(routers)
        with torch.no_grad():
            out[name] = compute_log_probs(model, ids, mask, ids.shape[0], vocab_size=VOCAB, routed_experts=replay)[0]
        for h in hooks:
            h.remove()
        # what this rank's routers saw: its sequence slice under SP; compare with the recorded experts there
        width = seq = ids.shape[1]
        tp = ps.get_tensor_model_parallel_world_size() if model.config.sequence_parallel else 1
        width += -seq % tp
        local = width // tp
        want = columns(routed, 0, seq, width)[:, ps.get_tensor_model_parallel_rank() * local:][:, :local]
        real = (want >= 0).all(-1)  # (b, local, L)
        out[name + "_mismatch"] = sum(
            int((got.view(local, ids.shape[0], -1).transpose(0, 1) != want[:, :, layer].long()).any(-1)[real[:, :, layer]].sum())
            for (layer, _), got in zip(routers, seen))  # global layer numbers: GLM-4.5's first layer is dense
    real = (mask[:, 1:] * mask[:, :-1]).bool()
    return {"same_weights_diff": float((own - replayed)[real].abs().max()),
            "moved_diff": float((out["moved_own"] - out["moved_replay"])[real].abs().max()),
            "moved_own_mismatch": out["moved_own_mismatch"], "moved_replay_mismatch": out["moved_replay_mismatch"]}


def _moe_job(rank, world_size, hf_dir, work):
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint
    from mindspeed_rl.models.forward import (attention_mask_4d, forward_microbatches, position_ids_from_mask,
                                             vocab_parallel_log_probs)
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.hf_export import export_hf
    from mindspeed_rl.models.moe_metrics import ExpertLoadMeter

    config = read_hf_config(hf_dir)
    args = dict(model_config_from_hf(config), padded_vocab_size=PADDED)
    ids, mask = _batch()
    res = {}

    def logits_of(model):
        """Full-vocabulary logits on the last pipeline stage (None on the others)."""
        with torch.no_grad():
            out = forward_microbatches(model, ids, mask, micro_batch_size=2,
                                       post_fn=lambda out, mb: gather_from_tensor_model_parallel_region(out))
        return torch.cat(out) if ps.is_pipeline_last_stage() else None

    def grads_of(model, tp, sp, meter_key=None):
        """Gradients of the summed log-prob loss, each DP rank its slice of the batch, reduced as DDP does."""
        dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        rows = slice(dp_rank * 4 // dp, (dp_rank + 1) * 4 // dp)
        b_ids, b_mask = ids[rows], mask[rows]
        with ExpertLoadMeter(model) as meter:
            out = model(b_ids, position_ids_from_mask(b_mask), attention_mask_4d(b_mask))  # (b, S, V/TP)
        local_tokens = b_ids.numel() // (tp if sp else 1)  # SP: each TP rank routes its sequence shard
        if meter_key is not None:
            res[("meter", meter_key)] = (meter.stats(), [float(c.sum()) for c in meter.counts.values()], local_tokens)
        lp, _ = vocab_parallel_log_probs(out[:, :-1], b_ids[:, 1:], vocab_size=VOCAB)
        _loss(lp, b_ids, b_mask).backward()
        _reduce_like_ddp(model, sp)
        return _full_grads(model, args)

    for key in LAYOUTS:
        tp, pp, ep, etp, sp = _run_as(key, config["model_type"])
        init_parallel_state(tp, pp, ep=ep, etp=etp)
        model = build_gpt_model(args, sequence_parallel=sp).eval()
        load_hf_checkpoint(model, hf_dir, args)
        logits = logits_of(model)
        if ps.is_pipeline_last_stage():
            res[("logits", key)] = logits
        if pp == 1:  # what a colocated vLLM engine is fed: full tensors, every expert from every EP rank
            from mindspeed_rl.models.hf_bridge.checkpoint_io import SafetensorsReader
            from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors

            # the sync speaks the bridge's canonical names (vLLM's engine renames Mixtral's on load), the
            # checkpoint read as the bridge reads it (gpt-oss's stacked experts per expert)
            reader = SafetensorsReader(hf_dir)
            ref = {n: reader.read(n) for n in reader.weight_map}
            got = dict(gathered_hf_tensors(model, args))
            res[("gathered", key)] = (sorted(got), sorted(ref), max(
                (got[n][:ref[n].shape[0]] - ref[n]).abs().max().item() for n in ref if n in got))
        if (tp, pp, ep) == (1, 1, 1) or pp == 2:  # the rollout routing of every layer, joined over stages
            res[("pp_routing", key)] = _pipeline_routing(model, ids, mask, pp)
        if pp == 1 and tp == 1:  # the native engine: each (DP) rank its own prompts, EP ranks in lock-step
            res[("generate", key)] = _generate(model, rank)
        if pp == 1 and (tp == 1 or sp):  # gradients: each DP rank its slice of the batch
            res[("grads", key)] = grads_of(model, tp, sp, meter_key=key)
        if key == _SAVE_AT:  # live save + export at TP2/ETP2 (and EP2 with SP)
            save_checkpoint(f"{work}/ckpt", 1, model, args, vocab_size=VOCAB, hf_config=config)
            export_hf(model, args, f"{work}/hf_tp2ep2", VOCAB, hf_config=config)
        if pp == 1 and ep == 2:  # routing replay (last: it changes the routers)
            res[("replay", key)] = _replay_checks(model, ids, mask)
    # moe_grouped_gemm at the last layout (TP2/EP2/ETP2+SP): grouped GEMMs over each rank's expert shards
    key = LAYOUTS[-1]
    tp, pp, ep, etp, sp = _run_as(key, config["model_type"])
    init_parallel_state(tp, pp, ep=ep, etp=etp)
    model = build_gpt_model(dict(args, moe_grouped_gemm=True), sequence_parallel=sp).eval()
    load_hf_checkpoint(model, hf_dir, args)
    res[("grouped_logits", key)] = logits_of(model)
    res[("grouped_grads", key)] = grads_of(model, tp, sp)
    res[("grouped_modules", key)] = sorted({type(m).__name__ for n, m in model.named_modules() if n.endswith("mlp.experts")})
    init_parallel_state(1, 1)  # reload the TP2/EP2 checkpoint at TP1/EP1, export again
    model = build_gpt_model(args).eval()
    assert load_checkpoint(f"{work}/ckpt", model, args) == 1
    export_hf(model, args, f"{work}/hf_tp1ep1", VOCAB, hf_config=config)
    ps.destroy_model_parallel()
    return res


def _moe_layers(moe) -> int:
    """MoE layers of the fixture's model (GLM-4.5's first layer is dense)."""
    return sum(hasattr(getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
                       or getattr(layer, "feed_forward", None) or layer.mixer, "experts") or hasattr(layer, "experts")
               for layer in moe[3].model.layers)  # (Gemma 4's experts: beside its mlp)  # (Nemotron-H's one block per layer: its mixer; LFM2-MoE's feed_forward)


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen2_moe", "mixtral", "glm4_moe", "deepseek_v3",
                                                 "deepseek_v2", "glm4_moe_lite", "gpt_oss", "minimax_m2", "ernie4_5_moe",
                                                 "olmoe", "flex_olmo", "hunyuan_v1_moe", "granitemoeshared",
                                                 "nemotron_h-moe", "lfm2_moe", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe", "sarvam_mla", "mellum",
                                                 "gemma4_text-moe"])
def moe(request, tmp_path_factory):
    """Every test below runs on Qwen3-MoE, on Qwen2-MoE (qkv biases, top-k not renormalised, and
    a shared expert with its sigmoid gate: megatron's SharedExpertMLP, split over TP), on Mixtral
    (no q/k norms, experts stored under its own names: hf_bridge/names.py) and on GLM-4.5 (a dense
    first layer, sigmoid routing with the checkpoint's expert bias, expert groups, a routed scale, a
    shared expert without gate), on DeepSeek-V3 / V2-Lite (multi-latent attention), on GLM-4.7-Flash (DeepSeek-V3's
    layout with a query LoRA and value heads wider than the query / key heads) and on gpt-oss (attention
    sinks, biases on the attention, router and experts, the clamped SwiGLU, experts stored stacked and
    interleaved; its ETP 2 layouts run at ETP 1: _run_as) and on MiniMax-M2 (q / k norms across heads, split
    over TP with the heads, sigmoid routing with the expert bias under Mixtral's names) and on ERNIE 4.5 MoE (a dense
    first layer, softmax routing with the expert bias: models/moe_replay.install_softmax_bias, a shared expert) and on
    OLMoE (MiniMax-M2's q / k norms with softmax routing, top-k not renormalised) and FlexOlmo (those under OLMo 2's
    post norms only) and HunYuan-MoE (q / k norms after RoPE, an ungated shared expert, the router stored as gate.wg) and
    Granite MoE (Granite's multipliers, experts stored stacked as block_sparse_moe.input_linear / output_linear, a
    shared MLP without a gate whose gate / up are fused as shared_mlp.input_linear) and Nemotron-H's MoE layer (experts
    and a shared expert without a gate, relu(up)^2, DeepSeek-V3's routing, beside Mamba-2, attention and MLP layers) and
    LFM2-MoE's (sigmoid routing with the expert bias and a routed scale, experts as feed_forward.experts.{e}.w1 / w3 / w2,
    beside short-convolution layers) and EXAONE MoE's (DeepSeek-V3's routing with groups and a shared expert, its expert
    bias stored under the MoE block, beside EXAONE 4.0's sliding and NoPE layers) and Hy3's (that routing without groups,
    the router, expert bias and shared expert under the release's names, per-head q / k norms) and Gemma 4 26B-A4B's
    (a dense MLP beside the experts, each with its norms, the router's input norm and scales, experts stored stacked,
    beside layers of two shapes: models/gemma4.Gemma4MoE)."""
    from mindspeed_rl.models.forward import position_ids_from_mask
    from mindspeed_rl.models.hf_bridge.names import canonical_name, grouped_parts

    hf_dir = str(tmp_path_factory.mktemp(request.param))
    work = str(tmp_path_factory.mktemp("moe_work"))
    # LFM2-MoE's, EXAONE MoE's, Hy3's, AFMoE's, Sarvam MoE's and Mellum's embeddings have padding_idx = pad_token_id
    # (transformers'), which this batch's token 0 would hit: without a pad token (test_hybrid_mixers_dist.py's note)
    unpadded = {"pad_token_id": None} if request.param in ("lfm2_moe", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe", "mellum",
                                                           "gemma4_text-moe") else {}
    hf = make_tiny_hf(request.param.split("-")[0], hf_dir, **HF_VARIANTS.get(request.param, {}), **unpadded)
    ids, mask = _batch()
    logits = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    _loss(lp, ids, mask).backward()
    # under the bridge's canonical names (GLM-4.5's shared_experts: hf_bridge/names.py; Hy3's and Sarvam MoE's modules
    # are named as GLM-4.5's, which transformers renames its checkpoints' names to as it loads them)
    kind = "glm4_moe" if hf.config.model_type in ("hy_v3", "sarvam_moe") else hf.config.model_type
    grads = per_expert({canonical_name(n, kind, hf.config.to_dict()): p.grad.detach().clone()
                        for n, p in hf.named_parameters()
                      if p.grad is not None},  # (ERNIE's expert bias: a parameter without a gradient)
                       hf.config.model_type)
    for name in list(grads):  # Mamba-2's in_proj / conv1d (Nemotron-H) by the bridge's parts of them
        for part, rows in grouped_parts(name, hf.config.to_dict()) or ():
            grads[part] = grads[name][rows]
        if grouped_parts(name, hf.config.to_dict()):
            del grads[name]
    per_rank = run_gloo(_moe_job, 4, hf_dir, work, timeout_s=600, name="MoE parity job")
    return per_rank, logits.detach(), grads, hf, hf_dir, work


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: "tp{}pp{}ep{}etp{}{}".format(*l[:4], "sp" * l[4]))
def test_moe_logits_match_transformers(moe, layout):
    per_rank, ref, _, _, _, _ = moe
    _, mask = _batch()
    got = [r[("logits", layout)] for r in per_rank if ("logits", layout) in r]
    assert len(got) == (2 if layout[1] == 2 else 4)  # the last pipeline stage's ranks report
    for logits in got:
        diff = (logits[..., :VOCAB] - ref)[mask.bool()].abs().max().item()
        assert diff <= 1e-4, f"{layout}: max |logit diff| {diff}"


def test_moe_grouped_gemm_experts_match_transformers_and_the_sequential_experts(moe):
    """moe_grouped_gemm (models/grouped_experts.py) at the last layout: the same logits and gradients as
    SequentialMLP there, so as transformers."""
    per_rank, ref_logits, ref_grads, _, _, _ = moe
    layout = LAYOUTS[-1]
    _, mask = _batch()
    seen = {}
    for r in per_rank:
        assert r[("grouped_modules", layout)] == ["GptOssExperts" if moe[3].config.model_type == "gpt_oss"
                                                  else "GroupedExperts"]
        assert (r[("grouped_logits", layout)][..., :VOCAB] - ref_logits)[mask.bool()].abs().max().item() <= 1e-4
        torch.testing.assert_close(r[("grouped_logits", layout)], r[("logits", layout)], rtol=0, atol=1e-6)
        seen.update(r[("grouped_grads", layout)])
    assert sorted(seen) == sorted(ref_grads)
    for name, g in seen.items():
        assert ((g - ref_grads[name]).norm() / ref_grads[name].norm().clamp_min(1e-12)).item() <= 1e-4, name


@pytest.mark.parametrize("layout", [l for l in LAYOUTS if l[1] == 1 and (l[0] == 1 or l[4])],
                         ids=lambda l: "tp{}ep{}etp{}{}".format(l[0], *l[2:4], "sp" * l[4]))
def test_moe_gradients_match_transformers(moe, layout):
    per_rank, _, ref, _, _, _ = moe
    seen = {}
    for r in per_rank:
        seen.update(r[("grads", layout)])
    assert sorted(seen) == sorted(ref)  # every HF tensor, experts included
    rel = {name: ((g - ref[name]).norm() / ref[name].norm().clamp_min(1e-12)).item() for name, g in seen.items()}
    bad = {name: f"{r:.2e}" for name, r in rel.items() if not r <= 1e-4}
    assert not bad, f"{layout}: relative gradient errors above 1e-4: {bad}"


@pytest.mark.parametrize("layout", [l for l in LAYOUTS if l[1] == 1], ids=lambda l: "tp{}ep{}etp{}{}".format(
    l[0], *l[2:4], "sp" * l[4]))
def test_moe_weights_gathered_for_a_rollout_engine_are_the_checkpoints(moe, layout):
    """rollout/weight_buckets.gathered_hf_tensors (the colocated vLLM sync) gives every rank every HF
    tensor of the model, experts of all EP ranks merged over ETP, equal to the checkpoint bit for bit."""
    for r in moe[0]:
        got, ref, diff = r[("gathered", layout)]
        assert got == ref and diff == 0.0, (layout, diff, sorted(set(ref) ^ set(got))[:4])


def test_moe_metrics_count_every_routed_token(moe):
    """Each layer routes every token of the rank to top-2 experts; the step's min/max are over the
    DP-summed counts (4 sequences x SEQ tokens x 2 per layer in all)."""
    for layout in [l for l in LAYOUTS if l[1] == 1 and (l[0] == 1 or l[4])]:
        for r in moe[0]:
            stats, per_layer, tokens = r[("meter", layout)]
            assert per_layer == [2.0 * tokens] * _moe_layers(moe), (layout, per_layer, tokens)
            assert 0 <= stats["moe/expert_tokens_min"] <= stats["moe/expert_tokens_max"] <= 4 * SEQ
            assert stats["moe/expert_tokens_max"] >= 4 * SEQ * 2 / 4  # some expert takes at least the mean
            assert stats["moe/aux_loss"] > 0


def test_moe_native_engine_generates_the_same_at_ep2(moe):
    """EP=2 (lock-step decoding across data-parallel ranks with different prompts and budgets) gives
    every rank the greedy responses it gets without expert parallelism."""
    per_rank = moe[0]
    for rank, r in enumerate(per_rank):
        (single, routed1), (ep2, routed2) = r[("generate", (1, 1, 1, 1, False))], r[("generate", (1, 1, 2, 1, False))]
        assert single == ep2, f"rank {rank}: EP=1 {single} vs EP=2 {ep2}"
        assert all(len(x) >= 1 for x in single)
        assert routed1 == routed2, f"rank {rank}: the recorded routing differs between EP=1 and EP=2"
        for row in routed1:  # every real token that ran: each MoE layer top-2 distinct experts, dense layers none
            assert row and all(len([l for l in tok if l != [-1, -1]]) == _moe_layers(moe) for tok in row)
            assert all(len(set(layer)) == 2 and min(layer) >= 0 for tok in row for layer in tok if layer != [-1, -1])


def test_moe_routing_recorded_under_pipeline_parallelism_joins_every_stages_layers(moe):
    """PP 2 x EP 2: each stage records its own layers; joined, every rank holds the routing of both
    layers that PP 1 records for its rows, and replaying it changes no log-prob (same weights)."""
    pp2 = next(l for l in LAYOUTS if l[1] == 2)
    for rank, r in enumerate(moe[0]):
        full, got = r[("pp_routing", (1, 1, 1, 1, False))]["routed"], r[("pp_routing", pp2)]
        start, stop = got["rows"]
        assert (got["routed"] >= 0).sum() > 0 and torch.equal(got["routed"], full[start:stop]), rank
        if "same_weights_diff" in got:
            assert got["same_weights_diff"] <= 1e-6, (rank, got["same_weights_diff"])
    assert sum("same_weights_diff" in r[("pp_routing", pp2)] for r in moe[0]) == 2  # the last stage's ranks


@pytest.mark.parametrize("layout", [l for l in LAYOUTS if l[1] == 1 and l[2] == 2],
                         ids=lambda l: "tp{}ep{}etp{}{}".format(l[0], *l[2:4], "sp" * l[4]))
def test_moe_routing_replay_matches_with_the_same_weights_and_routes_as_recorded_after_a_change(moe, layout):
    for rank, r in enumerate(moe[0]):
        got = r[("replay", layout)]
        assert got["same_weights_diff"] <= 1e-6, (rank, got)
        assert got["moved_replay_mismatch"] == 0, (rank, got)  # every recorded token routed as recorded
        assert got["moved_own_mismatch"] > 0, (rank, got)  # the changed routers alone would route otherwise
        assert got["moved_diff"] > 1e-4, (rank, got)


def test_moe_checkpoint_and_export_round_trip_bit_for_bit(moe):
    import glob

    from safetensors.torch import load_file

    _, _, _, _, hf_dir, work = moe
    original = load_file(f"{hf_dir}/model.safetensors")
    for out in ("hf_tp2ep2", "hf_tp1ep1"):
        exported = {}
        for f in glob.glob(f"{work}/{out}/*.safetensors"):
            exported.update(load_file(f))
        assert sorted(exported) == sorted(original), out
        bad = [k for k in original if not torch.equal(exported[k], original[k])]
        assert not bad, f"{out}: {bad[:3]} differ"


def test_moe_convert_ckpt_round_trip_bit_for_bit(moe, tmp_path):
    """HF -> mg(TP2, PP2, EP2) -> mg(TP1, PP1, EP1) -> HF, offline."""
    from safetensors.torch import load_file

    from mindspeed_rl.models.convert import convert

    _, _, _, _, hf_dir, _ = moe
    convert("hf", "mg", hf_dir, str(tmp_path / "a"), tp=2, pp=2, ep=2)
    convert("mg", "mg", str(tmp_path / "a"), str(tmp_path / "b"))
    convert("mg", "hf", str(tmp_path / "b"), str(tmp_path / "c"))
    original, back = load_file(f"{hf_dir}/model.safetensors"), load_file(str(tmp_path / "c" / "model.safetensors"))
    assert sorted(back) == sorted(original)
    assert all(torch.equal(back[k], original[k]) for k in original)
