"""gpt-oss (OpenAI's gpt-oss-20b / -120b) on megatron-core's local layer spec, in megatron-core
0.16's vocabulary (its gpt-oss switches), built the same way on 0.12.1, which has none of them.

What gpt-oss adds to a Mixtral-style MoE model (transformers' modeling_gpt_oss):
- attention sinks: one learnable logit per head joins every query's softmax and takes its share of
  the probability without contributing a value (megatron-core 0.16: `softmax_type: learnable`,
  the core attention's `softmax_offset`, split over TP with the heads). `install_sinks` gives the core
  attention that parameter on both versions (the TransformerConfig never gets softmax_type, so
  megatron's own softmax never sees it); core_attention.explicit_attention computes it in training and
  the native engine's cached attention adds it (rollout/kv_cache.grouped_attention);
- biases on q / k / v, o_proj, the router and both expert projections (`add_bias_linear`);
- the experts' clamped SwiGLU: gate clamped above at L, up at +-L, then
  gate x sigmoid(1.702 gate) x (up + 1) (megatron 0.16: `quick_geglu`, `activation_func_clamp_value`
  L, `glu_linear_offset` 1). `GptOssExperts` runs the experts with it, biases included, and the
  routing weights on the whole expert output (bias included), as transformers does;
- every second layer attends within a 128-token window (window_attn_skip_freq), YaRN without
  rounding the ramp's ends (rope_scaling_truncate: false): existing keys.

Why our own experts: megatron's dispatchers refuse an expert output bias (0.12 and 0.16), and
0.16's MLP adds the fc2 bias on every expert-TP rank before the dispatcher sums them, so an expert's
bias would count ETP times. Here the fc2 bias joins the output on the rank that computes it, and
the expert-TP size must be 1 (validated; gpt-oss's experts are split by expert parallelism). The
parameters stay megatron's SequentialMLP's (`local_experts.N.linear_fc1 / fc2` weight and bias),
so checkpoints, the HF bridge and routing replay see the usual names.
"""
from __future__ import annotations

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes  # noqa: E402
from megatron.core.transformer.moe.experts import SequentialMLP  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter  # noqa: E402

from mindspeed_rl.models import grouped_experts  # noqa: E402  (the grouped GEMM's on / off state)

QUICK_GELU_ALPHA = 1.702  # megatron's quick_gelu, transformers' swiglu_alpha default (its releases)


def clamped_glu(x: torch.Tensor, limit: float | None, offset: float) -> torch.Tensor:
    """gpt-oss's activation on fc1's [gate | up] output (megatron's order: gate rows first):
    gate clamped to <= limit, up to [-limit, limit], then gate x sigmoid(1.702 gate) x (up + offset)."""
    gate, up = torch.chunk(x, 2, dim=-1)
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(QUICK_GELU_ALPHA * gate) * (up + offset)


class GptOssExperts(SequentialMLP):
    """SequentialMLP's parameters; gpt-oss's expert MLP in the forward (module docstring):
    out = p x (clamped_glu(x W1^T + b1) W2^T + b2) per routed token, p its routing weight. With
    moe_grouped_gemm the matmuls are grouped (no host sync), else one expert after another."""

    def _rows(self, hidden: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1, b2) -> torch.Tensor:
        inter = hidden @ w1.t()
        if b1 is not None:
            inter = inter + b1
        out = clamped_glu(inter, self.config.activation_func_clamp_value, self.config.glu_linear_offset) @ w2.t()
        return out + b2 if b2 is not None else out

    def forward(self, permuted_local_hidden_states: torch.Tensor, tokens_per_expert: torch.Tensor,
                permuted_probs: torch.Tensor):
        hidden = permuted_local_hidden_states
        experts = self.local_experts
        grouped = getattr(self.config, "own_grouped_gemm", False) and grouped_experts.failed() is None
        if grouped and len(experts) > 1 and hidden.dim() == 2 and hidden.shape[0]:
            try:
                out = self._grouped(hidden, tokens_per_expert)
                return (out * permuted_probs.unsqueeze(-1)).to(hidden.dtype), None
            except grouped_experts.GROUPED_GEMM_ERRORS as err:  # no kernel for this device / dtype
                grouped_experts.turn_off(err)
        counts = torch.as_tensor(tokens_per_expert).tolist()
        parts = torch.split(hidden, counts)
        outs = [self._rows(x, e.linear_fc1.weight, e.linear_fc2.weight, e.linear_fc1.bias, e.linear_fc2.bias)
                for x, e in zip(parts, experts)]
        out = torch.cat(outs) if outs else hidden.new_zeros(0, self.config.hidden_size)
        return (out * permuted_probs.unsqueeze(-1)).to(hidden.dtype), None

    def _grouped(self, hidden: torch.Tensor, tokens_per_expert) -> torch.Tensor:
        experts = self.local_experts
        counts = torch.as_tensor(tokens_per_expert).to(hidden.device, non_blocking=True)
        grouped_mm = get_platform().grouped_mm
        # each row's local expert, for its biases (output_size: no host sync)
        which = torch.repeat_interleave(torch.arange(len(experts), device=hidden.device), counts,
                                        output_size=hidden.shape[0])
        w1 = torch.stack([e.linear_fc1.weight for e in experts]).transpose(1, 2)
        w2 = torch.stack([e.linear_fc2.weight for e in experts]).transpose(1, 2)
        inter = grouped_mm(hidden.contiguous(), w1, counts)
        if experts[0].linear_fc1.bias is not None:
            inter = inter + torch.stack([e.linear_fc1.bias for e in experts])[which]
        act = clamped_glu(inter, self.config.activation_func_clamp_value, self.config.glu_linear_offset)
        out = grouped_mm(act.contiguous(), w2, counts)
        if experts[0].linear_fc2.bias is not None:
            out = out + torch.stack([e.linear_fc2.bias for e in experts])[which]
        return out


class BiasedRouter(TopKRouter):
    """megatron-core 0.12's TopKRouter with a bias on its logits (gpt-oss's router is a linear layer
    with a bias; 0.16's router has it with add_bias_linear)."""

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        dtype = torch.float32 if self.config.moe_router_dtype == "fp32" else input.dtype
        return torch.nn.functional.linear(input.to(dtype), self.weight.to(dtype), self.bias.to(dtype))


def install(model, grouped_gemm: bool = False) -> int:
    """gpt-oss's pieces on `model` (a GPTModel chunk), as its config asks: with quick_geglu every
    SequentialMLP becomes GptOssExperts, and with add_bias_linear a router without a bias (megatron-core
    0.12; 0.16 builds it) gets one; with attention sinks every core attention gets its sink logits
    (install_sinks). Returns how many MoE layers were turned."""
    config = model.config
    config.own_grouped_gemm = bool(grouped_gemm)
    count = 0
    for module in model.modules() if config.quick_geglu else ():
        if isinstance(module, SequentialMLP):
            module.__class__ = GptOssExperts
            count += 1
            # megatron marks a row-parallel bias sequence-parallel, so finalize_model_grads would sum an
            # expert's fc2 bias gradient over the TP group, i.e. with other experts' (the dispatcher
            # already gathered every token an expert sees: its gradient is complete)
            for expert in module.local_experts:
                for linear in (expert.linear_fc1, expert.linear_fc2):
                    if linear.bias is not None:
                        linear.bias.sequence_parallel = False
        elif isinstance(module, TopKRouter) and config.add_bias_linear and getattr(module, "bias", None) is None:
            weight = module.weight
            module.bias = torch.nn.Parameter(torch.zeros(weight.shape[0], device=weight.device, dtype=weight.dtype))
            setattr(module.bias, "sequence_parallel", config.sequence_parallel)
            module.__class__ = BiasedRouter
    if getattr(config, "attention_sinks", False):
        install_sinks(model)
    return count


def install_sinks(model) -> None:
    """A learnable sink logit per head on each core attention, split over TP with the heads:
    `softmax_offset` (this rank's heads), megatron 0.16's name for it."""
    for layer in model.decoder.layers:
        core = layer.self_attention.core_attention
        if getattr(core, "softmax_offset", None) is not None:
            continue
        heads = core.num_attention_heads_per_partition
        weight = layer.self_attention.linear_proj.weight
        core.softmax_offset = torch.nn.Parameter(torch.zeros(heads, device=weight.device, dtype=weight.dtype))
        set_tensor_model_parallel_attributes(core.softmax_offset, True, 0, 1)


def sinks_of(core_attention) -> torch.Tensor | None:
    """The sink logits (this rank's heads) of a core attention, or None (no sinks)."""
    return getattr(core_attention, "softmax_offset", None) if getattr(core_attention.config, "attention_sinks", False) else None
