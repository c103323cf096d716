"""MoE routing replay ("R3"): record the rollout's expert choices, replay them in the training forward.

Why: an MoE policy's log-prob depends on which experts a token is routed to, and the top-k choice is
discontinuous: a logit that moves by one ulp (bf16 kernels of the engine vs the training forward)
or by one optimizer step (the later mini-batches of a PPO epoch) can send a token to another expert
and change its log-prob by far more than the numerics alone would. Rollout Routing Replay (R3,
"Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers", 2025; verl's
`router_replay` mode R3) makes the training forwards route every token to the experts the rollout
chose; the gate weights still come from the current router logits, gathered at the replayed experts
and normalised as the router normally does, so the router keeps its gradient.

Config: `moe_enable_routing_replay` (actor, off by default), megatron-core's TransformerConfig
field name (>= 0.15, megatron/core/transformer/moe/router_replay.py). megatron-core 0.12 has no
replay, so both versions use this module instead of megatron's RouterReplay: one behaviour on both.

    recorder = RoutingRecorder(chunks, batch, seq_len)        # native engine, around generation
    recorder.at(rows, start)                                  # before each forward: where its tokens sit
    routed = recorder.result(token_mask)                      # (B, S, L, k) int16, -1 = not recorded
    with replay_routing(chunk, routed_mb):                    # around one micro-batch's forward
        logits = chunk(ids, position_ids, mask)

The routing tensor is (B, S, L, k): rows and token positions of input_ids (prompt + response,
left/right padded like input_ids), L = every MoE layer of the model (global layer number - 1), the
k expert ids of each token sorted ascending; -1 marks padding and positions the rollout never ran
(the last response token: its successor was never generated). Those tokens route by themselves:
their outputs feed no real token's log-prob.

The hook: the router module's top-k routing function (0.12 `topk_softmax_with_capacity`, 0.16
`topk_routing_with_score_function`, looked up by name and refused loudly if neither exists) is
wrapped once; the wrapper passes through unless the router being called (set by a forward pre-hook
that `replay_routing` registers) holds replay indices. Everything else of megatron's router (z-loss,
aux loss, expert bias, dispatch) runs unchanged. Under sequence parallelism each TP rank's router
sees its slice of the sequence; the wrapper takes the same slice of the (b, S) indices. Sinkhorn
routing and capacity factors are refused with routing replay (validate.py); group-limited top-k
(GLM-4.5, DeepSeek-V3) decides only the rows without recorded experts.

The same wrapper routes ERNIE 4.5 MoE (install_softmax_bias): softmax routing with an expert bias for the
top-k choice, which megatron-core lacks, is replayed_routing with every row choosing its own experts.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core import parallel_state  # noqa: E402
from megatron.core.transformer.moe import router as _router_module  # noqa: E402

from mindspeed_rl.models.chunks import as_chunks, unwrap  # noqa: E402

ROUTING_FUNCTIONS = ("topk_softmax_with_capacity", "topk_routing_with_score_function")  # 0.12, 0.16
_current: Optional[torch.nn.Module] = None  # the router whose forward is running (replay_routing's pre-hook)


# ---------------------------------------------------------------------------------------------
# which routers, which layers

def moe_routers(model) -> list[tuple[int, torch.nn.Module]]:
    """(global layer index from 0, TopKRouter) of every MoE layer of a model or of a chunk list."""
    out = []
    for chunk in as_chunks(model):
        for layer in unwrap(chunk).decoder.layers:
            router = getattr(getattr(layer, "mlp", None), "router", None)
            if router is not None:
                out.append((int(layer.layer_number) - 1, router))
    return out


def routing_shape(model) -> tuple[int, int]:
    """(L, k): MoE layers of the whole model and experts per token, from the config."""
    config = unwrap(as_chunks(model)[0]).config
    return int(config.num_layers), int(config.moe_router_topk)


# ---------------------------------------------------------------------------------------------
# recording (rollout)

class RoutingRecorder:
    """Records each MoE layer's top-k experts per token while generating (forward hooks on the routers).

    Args:
        model: this rank's chunk(s); under PP only this stage's layers are filled (`result` joins
            the stages).
        batch / seq_len: rows and token positions of the generation batch (B, P + T).
    """

    def __init__(self, model, batch: int, seq_len: int):
        self.routers = moe_routers(model)
        layers, self.topk = routing_shape(model)
        device = next(unwrap(as_chunks(model)[0]).parameters()).device
        self.routed = torch.full((batch, seq_len, layers, self.topk), -1, dtype=torch.int16, device=device)
        self.rows: Optional[torch.Tensor] = None
        self.start = 0
        self._handles = []

    def __enter__(self) -> "RoutingRecorder":
        for layer, router in self.routers:
            self._handles.append(router.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def at(self, rows: torch.Tensor, start: int) -> None:
        """The next forward computes positions start.. of these batch rows (b,)."""
        self.rows, self.start = rows, int(start)

    def _hook(self, layer: int):
        def hook(module, inputs, output):
            hidden = inputs[0]  # (s, b, h): the whole sequence (the engine runs with SP off)
            s, b = hidden.shape[0], hidden.shape[1]
            routing_map = output[1].reshape(s * b, -1)  # (s*b, E) bool
            experts = routing_map.int().topk(self.topk, dim=1).indices.sort(dim=1).values  # (s*b, k)
            experts = experts.view(s, b, self.topk).transpose(0, 1).to(torch.int16)  # (b, s, k)
            self.routed[self.rows, self.start:self.start + s, layer] = experts
        return hook

    def result(self, token_mask: torch.Tensor, timeout_s: float = 600.0) -> torch.Tensor:
        """(B, S, L, k) int16: -1 where token_mask (B, S) is 0; under PP the stages' layers joined
        (a MAX all-reduce over the pipeline group: each stage holds -1 for the others' layers)."""
        routed = self.routed[:, :token_mask.shape[1]].masked_fill(~token_mask.bool()[:, :, None, None], -1)
        if parallel_state.model_parallel_is_initialized() and parallel_state.get_pipeline_model_parallel_world_size() > 1:
            import datetime
            joined = routed.int()  # gloo/hccl reduce int32
            work = torch.distributed.all_reduce(joined, op=torch.distributed.ReduceOp.MAX,
                                                group=parallel_state.get_pipeline_model_parallel_group(), async_op=True)
            if work.wait(timeout=datetime.timedelta(seconds=timeout_s)) is False:
                raise TimeoutError(f"routing replay: the other pipeline stages' expert choices did not arrive "
                                   f"within {timeout_s:g} s; see their logs.")
            routed = joined.to(torch.int16)
        return routed


# ---------------------------------------------------------------------------------------------
# replaying (training forwards)

def columns(routed: Optional[torch.Tensor], first: int, end: int, width: int) -> Optional[torch.Tensor]:
    """The routing tensor (b, S, L, k) cut to the columns [first, end) a forward sees, then right-padded
    with -1 to `width` columns (sequence parallelism pads input_ids to a multiple of TP); None stays None."""
    if routed is None:
        return None
    routed = routed[:, first:end]
    extra = width - routed.shape[1]
    if extra > 0:
        routed = torch.nn.functional.pad(routed, (0, 0, 0, 0, 0, extra), value=-1)
    return routed


@contextlib.contextmanager
def replay_routing(chunk, routed: Optional[torch.Tensor]) -> Iterator[None]:
    """Route the MoE layers of `chunk` as recorded for the next forward(s) of this micro-batch.

    Args:
        chunk: one GPTModel chunk (DDP-wrapped or not).
        routed: (b, S, L, k) this micro-batch's recorded experts (the columns the forward sees, SP
            padding included), or None: route by the router itself (a no-op context).
    """
    if routed is None:
        yield
        return
    install()
    routers = moe_routers(chunk)
    handles = []
    try:
        for layer, router in routers:
            router._replay_experts = routed[:, :, layer]  # (b, S, k)
            handles.append(router.register_forward_pre_hook(_enter))
            handles.append(router.register_forward_hook(_leave))
        yield
    finally:
        global _current
        _current = None  # a forward that raised never ran the post-hook
        for h in handles:
            h.remove()
        for _, router in routers:
            router._replay_experts = None


def _enter(module, inputs):
    global _current
    _current = module


def _leave(module, inputs, output):
    global _current
    _current = None


def _target(router: torch.nn.Module, tokens: int) -> torch.Tensor:
    """The router's replay indices as its (s*b, k) token order; -1 rows route by themselves."""
    routed = router._replay_experts  # (b, S, k)
    b, seq = routed.shape[0], routed.shape[1]
    local = tokens // b
    if local != seq:  # sequence parallelism: this TP rank routes the positions of its slice
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        if local * parallel_state.get_tensor_model_parallel_world_size() != seq or tokens % b:
            raise ValueError(f"routing replay: the router sees {tokens} tokens but the recorded experts cover "
                             f"{b} rows x {seq} positions; the routing tensor was not trimmed/padded like input_ids.")
        routed = routed[:, tp_rank * local:(tp_rank + 1) * local]
    return routed.transpose(0, 1).reshape(tokens, -1).long()  # (s*b, k)


def replayed_routing(logits: torch.Tensor, experts: torch.Tensor, topk: int, use_pre_softmax: bool = False,
                     scaling_factor: Optional[float] = None, score_function: str = "softmax",
                     expert_bias: Optional[torch.Tensor] = None, num_groups: Optional[int] = None,
                     group_topk: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """megatron's top-k routing with the top-k set given: (probs, routing_map), each (T, E).

    Args:
        logits: (T, E) router logits (z-loss applied, as megatron passes them).
        experts: (T, k) long expert ids to route to; a row with any -1 chooses its own top-k.
    The gates are megatron's: softmax over the chosen logits (renormalised top-k), or the chosen
    entries of the softmax over all experts (pre-softmax), or normalised sigmoid scores; times
    scaling_factor. Gradients reach the logits through the gathered entries. Group-limited top-k
    (num_groups / group_topk) only decides the rows that choose their own (megatron's own function).
    """
    if score_function == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32).type_as(logits) if use_pre_softmax else logits
        select = scores
        if expert_bias is not None:  # ERNIE 4.5 MoE: fp32 softmax probabilities + the bias choose (install_softmax_bias)
            select = torch.softmax(logits, dim=-1, dtype=torch.float32) + expert_bias
    elif score_function == "sigmoid":
        scores = torch.sigmoid(logits.float()).type_as(logits)
        select = scores + expert_bias if expert_bias is not None else scores
    else:
        raise ValueError(f"routing replay: unknown score_function {score_function!r}")
    if group_topk:  # (T, k) for rows not recorded
        from megatron.core.transformer.moe.moe_utils import group_limited_topk

        own = group_limited_topk(select.detach(), topk, select.shape[0], select.shape[1], num_groups, group_topk)[1]
    else:
        own = torch.topk(select.detach(), k=topk, dim=1).indices
    idx = torch.where((experts < 0).any(dim=1, keepdim=True), own, experts)
    chosen = scores.gather(1, idx)  # (T, k)
    if score_function == "softmax":
        probs = chosen if use_pre_softmax else torch.softmax(chosen, dim=-1, dtype=torch.float32).type_as(logits)
    else:
        probs = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else chosen
    if scaling_factor:
        probs = probs * scaling_factor
    gates = torch.zeros_like(logits).scatter(1, idx, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, idx, 1).bool()
    return gates, routing_map


def _wrap(original, with_counts: bool):
    def routing(logits, topk, *args, **kwargs):
        router = _current
        experts = getattr(router, "_replay_experts", None) if router is not None else None
        own = experts is None and kwargs.get("expert_bias") is not None and \
            kwargs.get("score_function", "softmax") == "softmax"  # ERNIE 4.5 MoE's routing (install_softmax_bias)
        if experts is None and not own:
            return original(logits, topk, *args, **kwargs)
        if args:  # megatron passes everything after topk by keyword; a positional call is not ours to guess
            raise RuntimeError("routing replay: megatron's routing function was called with positional options; "
                               "this megatron-core version is not supported by models/moe_replay.py.")
        if kwargs.get("capacity_factor") is not None:
            raise ValueError("routing replay does not support expert capacity; turn moe_enable_routing_replay off "
                             "for this model.")
        target = logits.new_full((logits.shape[0], topk), -1, dtype=torch.long) if own else \
            _target(router, logits.shape[0])  # own: every row chooses its experts
        gates, routing_map = replayed_routing(
            logits, target, topk, bool(kwargs.get("use_pre_softmax", False)),
            kwargs.get("scaling_factor"), kwargs.get("score_function", "softmax"), kwargs.get("expert_bias"),
            kwargs.get("num_groups"), kwargs.get("group_topk"))
        return (gates, routing_map, routing_map.sum(dim=0)) if with_counts else (gates, routing_map)
    routing._mindspeed_replay = True
    return routing


def install_softmax_bias(model) -> int:
    """ERNIE 4.5 MoE's routing on `model` (a GPTModel chunk): softmax over all experts, the top-k chosen by
    those probabilities + a fixed per-expert bias (the checkpoint's e_score_correction_bias), weighted by
    their probabilities renormalised. megatron-core routes softmax without an expert bias (its config
    refuses the pair), so every router gets the fp32 `expert_bias` buffer megatron's sigmoid routing has
    (same name: checkpoints, the HF bridge and the placement see it as theirs; never updated, as
    megatron's bias_update_rate 0) and the wrapped routing function (install) routes a softmax router
    that has one with replayed_routing, each row choosing its own experts. Routing replay works on it
    unchanged. Returns how many routers got the bias."""
    from megatron.core.transformer.moe.router import TopKRouter

    install()
    count = 0
    for module in model.modules():
        if isinstance(module, TopKRouter) and getattr(module, "expert_bias", None) is None:
            if hasattr(module, "expert_bias"):  # megatron sets the attribute to None without a bias
                delattr(module, "expert_bias")
            weight = module.weight
            module.register_buffer("expert_bias", torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device))
            count += 1
    return count


def install() -> None:
    """Wrap megatron's top-k routing function in the router module once (idempotent, version-checked)."""
    for name in ROUTING_FUNCTIONS:
        fn = getattr(_router_module, name, None)
        if fn is None:
            continue
        if not getattr(fn, "_mindspeed_replay", False):
            setattr(_router_module, name, _wrap(fn, with_counts=name == "topk_softmax_with_capacity"))
        return
    import megatron.core
    raise RuntimeError(f"routing replay: megatron-core {megatron.core.__version__}'s router module has none of "
                       f"{', '.join(ROUTING_FUNCTIONS)}; models/moe_replay.py must learn this version.")
