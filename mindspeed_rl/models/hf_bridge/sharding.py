"""TP/PP sharding math on plain tensors, with no torch.distributed: which megatron parameters a
pipeline stage holds, and how TP shards merge back into the full megatron tensor.

Merging is the exact inverse of mapping.read_shard (concatenation and reshapes only, so a
split-then-merge round trip is bit for bit):
  replicated     every rank holds the whole tensor: take rank 0's
  row            (h, n/TP) per rank: concatenate along dim 1
  vocab          (Vp/TP, h) per rank: concatenate along dim 0
  column         (n/TP,) per rank (OLMo 2's q / k norms, split with the heads): concatenate
  delta_in / delta_conv / delta_row   Gated DeltaNet's in_proj / conv1d, grouped by whole key heads
                 (models/delta_layout.py): concatenate along dim 0; its out_proj as row
  mamba_in / mamba_row   Mamba-2's in_proj_zxdt, grouped by whole heads (models/mamba_layout.py):
                 concatenate along dim 0; its out_proj as row
  conv_in / conv_row   LFM2's short-convolution in_proj_bcx, interleaved per channel
                 (models/short_conv_layout.py): concatenate along dim 0; its out_proj as row
  qkv            (ng/TP*(q+2)*hn, ...) per rank, whole query groups: concatenate along dim 0
  fc1            [gate_r | up_r] per rank: concatenate the gate halves, then the up halves
  expert_row / expert_fc1   as row / fc1, over the expert-tensor-parallel (ETP) ranks
  shared_row / shared_fc1   as row / fc1 (the shared expert of Qwen2-MoE, over TP)
  expert_up / shared_up     an expert's / the shared expert's fc1 without a gate (Nemotron-H): rows, as column

Pipeline stages own contiguous, equal layer ranges (megatron-core's default split): stage r of
PP holds global layers [r*L/PP, (r+1)*L/PP). Expert parallelism: EP rank r holds the global
experts [r*E/EP, (r+1)*E/EP) of every MoE layer (megatron's contiguous split).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from mindspeed_rl.models import hybrid_pattern
from mindspeed_rl.models.mamba_layout import has_mamba
from mindspeed_rl.models.short_conv_layout import has_short_conv, is_conv_layer
from mindspeed_rl.models.hf_bridge.mapping import Dims, hf_names, to_hf
from mindspeed_rl.models.hf_gemma4_config import kv_source
from mindspeed_rl.utils.errors import UserInputError


def layer_range(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Global layer indices of pipeline stage `pp_rank`."""
    if num_layers % pp_size:
        raise UserInputError(f"num_layers {num_layers} is not divisible by pipeline_model_parallel_size "
                             f"{pp_size}; pick a PP size that divides it.")
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def check_tp(args: Mapping[str, Any], tp_size: int, ep_size: int = 1, etp_size: int | None = None) -> None:
    """One sentence naming the field TP (or EP / ETP for MoE models) does not divide (before any
    tensor is touched)."""
    d = Dims.from_args(args)
    checks = [("tensor_model_parallel_size", tp_size, "num_attention_heads", d.heads),
              ("tensor_model_parallel_size", tp_size, "num_query_groups", d.groups),
              ("tensor_model_parallel_size", tp_size, "padded_vocab_size", d.vocab_padded)]
    if args.get("multi_latent_attention"):  # its down projections' outputs are split over TP too
        checks += [("tensor_model_parallel_size", tp_size, "kv_lora_rank + qk_pos_emb_head_dim",
                    int(args["kv_lora_rank"]) + int(args["qk_pos_emb_head_dim"]))]
        if args.get("q_lora_rank"):
            checks.append(("tensor_model_parallel_size", tp_size, "q_lora_rank", int(args["q_lora_rank"])))
    if args.get("sliding_num_query_groups"):  # Gemma 4's sliding layers' own key / value heads
        checks.append(("tensor_model_parallel_size", tp_size, "sliding_num_query_groups",
                       int(args["sliding_num_query_groups"])))
    if args.get("per_layer_input_size"):  # Gemma 4 E2B / E4B's per-layer input table: split by rows
        checks.append(("tensor_model_parallel_size", tp_size, "per_layer_input_vocab_size",
                       int(args["per_layer_input_vocab_size"])))
    if any(args.get("linear_attention_layers") or ()):  # Gated DeltaNet: split by key heads
        checks.append(("tensor_model_parallel_size", tp_size, "linear_num_key_heads", int(args["linear_num_key_heads"])))
    if has_mamba(args):  # Mamba-2: split by heads
        checks.append(("tensor_model_parallel_size", tp_size, "mamba_num_heads", int(args["mamba_num_heads"])))
    if has_short_conv(args):  # LFM2's conv layers: split by channels
        checks.append(("tensor_model_parallel_size", tp_size, "hidden_size", d.hidden))
    if is_moe(args):
        checks += [("expert_model_parallel_size", ep_size, "num_experts", int(args["num_experts"])),
                   ("expert_tensor_parallel_size", etp_size or tp_size, "moe_ffn_hidden_size", d.moe_ffn)]
        if d.shared_ffn:
            checks.append(("tensor_model_parallel_size", tp_size, "moe_shared_expert_intermediate_size", d.shared_ffn))
    else:
        checks.append(("tensor_model_parallel_size", tp_size, "ffn_hidden_size", d.ffn))
    for key, size, field, n in checks:
        if n % size:
            raise UserInputError(f"{key} {size} does not divide {field} {n}; pick a size that divides it.")


def stage_param_names(args: Mapping[str, Any], pp_size: int, pp_rank: int, vpp_size: int = 1) -> list[str]:
    """Megatron parameter names (global layer numbers) of one pipeline rank of a GPTModel built by
    builder.build_gpt_model (all its chunks with a virtual pipeline of vpp_size: models/chunks.py),
    in the order its state_dict(s) list them."""
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    tied = not args.get("untie_embeddings_and_output_weights", False)
    pre_norm = args.get("pre_norm", True) is not False  # OLMo 2: none (models/olmo.py)
    bias = args.get("disable_bias_linear", True) is False  # gpt-oss: o_proj, router and expert biases
    # StableLM's LayerNorms: with biases; Cohere's (layernorm_bias: false) and RMSNorms: a weight only; OLMo 1's none
    norms = ["weight", "bias"] if args.get("normalization") == "LayerNorm" and args.get("layernorm_bias", True) is not False \
        else ["weight"]
    if args.get("layernorm_affine", True) is False:
        norms = []
    # Gemma 4's layer_scalar: the layer's own buffer, listed before its children's tensors (models/gemma4.py)
    per_layer = ["layer_scalar"] if args.get("layer_scalar") else []
    per_layer += [f"input_layernorm.{n}" for n in norms] if pre_norm else []
    if args.get("softmax_type") == "learnable":  # gpt-oss's sinks (models/gpt_oss.py): the core attention's
        per_layer.append("self_attention.core_attention.softmax_offset")
    per_layer += ["self_attention.linear_proj.weight"] + (["self_attention.linear_proj.bias"] if bias else [])
    if args.get("multi_latent_attention"):  # DeepSeek-V3's projections and norms, in megatron's order
        q = ["linear_q_down_proj", "linear_q_up_proj"] if args.get("q_lora_rank") else ["linear_q_proj"]
        per_layer += [f"self_attention.{n}.weight" for n in q + ["linear_kv_down_proj", "linear_kv_up_proj"]]
        if args.get("qk_layernorm"):  # MLA's norms (megatron's qk_layernorm with MLA)
            per_layer += ["self_attention.q_layernorm.weight"] if args.get("q_lora_rank") else []
            per_layer.append("self_attention.kv_layernorm.weight")
    else:
        per_layer.append("self_attention.linear_qkv.weight")
    if args.get("add_qkv_bias"):
        per_layer.append("self_attention.linear_qkv.bias")
    if args.get("qk_layernorm") and not args.get("multi_latent_attention") and norms:  # (nanochat's: no weights)
        norm = "sharded_weight" if args.get("qk_layernorm_across_heads") else "weight"
        per_layer += [f"self_attention.q_layernorm.{norm}", f"self_attention.k_layernorm.{norm}"]
    if args.get("attention_output_gate") and args.get("attention_gate_proj"):  # AFMoE's gate (models/qwen3_5.py)
        per_layer.append("self_attention.linear_gate.weight")
    # Cohere's MLP reads input_layernorm's output, GPT-NeoX's its own norm's (models/cohere.py)
    if pre_norm and (not args.get("parallel_residual") or args.get("parallel_residual_mlp_norm")):
        per_layer += [f"pre_mlp_layernorm.{n}" for n in norms]
    moe_layer = list(per_layer)
    if args.get("moe_dense_beside"):  # Gemma 4 26B-A4B: its MoE block's own norms, no pre-MLP norm (models/gemma4.py)
        moe_layer = [n for n in moe_layer if not n.startswith("pre_mlp_layernorm.")]
    moe_layer += ["mlp.router.weight"] + (["mlp.router.bias"] if bias else [])
    if args.get("moe_router_enable_expert_bias"):  # a buffer, after the router's parameters
        moe_layer.append("mlp.router.expert_bias")
    if args.get("moe_dense_beside"):  # the router's scales, then (after the experts) the dense MLP and the norms
        moe_layer += ["mlp.router.scale", "mlp.router.per_expert_scale", "mlp.dense.linear_fc1.weight",
                      "mlp.dense.linear_fc2.weight"] + [f"mlp.{n}.weight" for n in (
                          "pre_dense_norm", "post_dense_norm", "pre_experts_norm", "post_experts_norm")]
    if args.get("moe_shared_expert_intermediate_size"):  # the module's own gate first, then its linears
        moe_layer += (["mlp.shared_experts.gate_weight"] if args.get("shared_expert_gate") else []) + \
            ["mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight"]
    per_layer += (["mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"] if bias
                  else ["mlp.linear_fc1.weight", "mlp.linear_fc2.weight"])  # StarCoder2's biases (dense layers)
    if args.get("xielu"):  # Apertus's activation module, set on the MLP after megatron built it (models/xielu.py)
        from mindspeed_rl.models.xielu import PARAMS
        per_layer += [f"mlp.activation_func.{n}" for n in PARAMS]
    if args.get("post_norm"):  # Gemma's, added to each layer after megatron built it (models/gemma.py)
        per_layer += ["post_self_attn_layernorm.weight", "post_mlp_layernorm.weight"]
        moe_layer += ["post_self_attn_layernorm.weight", "post_mlp_layernorm.weight"]
    if args.get("per_layer_input_size"):  # Gemma 4 E2B / E4B's, added after those (models/gemma4.py)
        ple = [f"{n}.weight" for n in ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm")]
        per_layer, moe_layer = per_layer + ple, moe_layer + ple
    # Qwen3.5's Gated DeltaNet layers (models/gated_delta_net.py): the mixer's own parameters, then its linears
    mixer = [f"self_attention.{n}" for n in ("dt_bias", "A_log", "in_proj.weight", "conv1d.weight", "norm.weight",
                                             "out_proj.weight")]

    # Granite 4.0-H's Mamba-2 layers (models/mamba2.py): the mixer's own parameters, then its modules'
    conv = ["weight", "bias"] if args.get("mamba_conv_bias", True) is not False else ["weight"]
    mamba_mixer = ([f"self_attention.ssm_{n}" for n in ("A_log", "D", "dt_bias")]
                   + ["self_attention.in_proj_zxdt.weight", "self_attention.in_proj_bc.weight"]
                   + [f"self_attention.conv1d_{c}.{k}" for c in ("x", "bc") for k in conv]
                   + ["self_attention.ssm_norm.weight"] * (args.get("mamba_norm", True) is not False)
                   + ["self_attention.ssm_out_proj.weight"])

    # LFM2's short-convolution layers (models/short_conv.py), in the order the module registers them
    keys = ["weight", "bias"] if args.get("short_conv_bias") else ["weight"]
    conv_mixer = [f"self_attention.{m}.{k}" for m in ("in_proj_bcx", "conv", "conv_out_proj") for k in keys]

    def with_mixer(layer: list, mixer: list = mixer) -> list:  # the attention's names replaced by the mixer's
        at = next(i for i, n in enumerate(layer) if n.startswith("self_attention."))
        return layer[:at] + mixer + [n for n in layer[at:] if not n.startswith("self_attention.")]

    linear = list(args.get("linear_attention_layers") or ())
    mamba = list(args.get("mamba_layers") or ())
    moe = moe_layers(args)
    pattern = hybrid_pattern.pattern_of(args)
    names = ["embedding.word_embeddings.weight"] if first else []
    if first and args.get("per_layer_input_size"):  # Gemma 4 E2B / E4B's per-layer inputs (models/gemma4.PerLayerInputs)
        names += [f"embedding.per_layer.{n}.weight" for n in ("embeddings", "projection", "norm")]
    if vpp_size > 1:
        from mindspeed_rl.models.chunks import virtual_layer_ranges
        layers = [i for r in virtual_layer_ranges(int(args["num_layers"]), pp_size, pp_rank, vpp_size) for i in r]
    else:
        layers = layer_range(int(args["num_layers"]), pp_size, pp_rank)
    for i in layers:
        layer = moe_layer if moe[i] else per_layer
        if i < len(mamba) and mamba[i]:
            layer = with_mixer(layer, mamba_mixer)
        elif is_conv_layer(args, i):
            layer = with_mixer(layer, conv_mixer)
        elif i < len(linear) and linear[i]:
            layer = with_mixer(layer)
        elif args.get("parallel_hybrid"):  # Falcon-H1: the attention's names, then its child mamba's
            at = max(j for j, n in enumerate(layer) if n.startswith("self_attention.")) + 1
            layer = layer[:at] + [n.replace("self_attention.", "self_attention.mamba.", 1) for n in mamba_mixer] + layer[at:]
        if pattern:  # Nemotron-H: the half of the layer its one block leaves out has none (models/hybrid_pattern.py)
            layer = [n for n in layer if hybrid_pattern.param_kept(pattern, i, n)]
        if kv_source(args, i) is not None:  # a KV-sharing layer (Gemma 4 E2B): no key norm (models/gemma4.py)
            layer = [n for n in layer if not n.startswith("self_attention.k_layernorm.")]
        names += [f"decoder.layers.{i}.{n}" for n in layer]
    if last:
        names += [f"decoder.final_layernorm.{n}" for n in norms]
        if not tied or not first:  # tied at PP>1: the last stage keeps its own copy of the embedding
            names.append("output_layer.weight")
        if args.get("add_output_layer_bias"):  # Phi-2's lm_head.bias, after the weight (tied or not)
            names.append("output_layer.bias")
    return names


def is_moe(args: Mapping[str, Any]) -> bool:
    return int(args.get("num_experts") or 0) > 1


def moe_layers(args: Mapping[str, Any]) -> list[int]:
    """One 0 / 1 per layer, 1 = an MoE layer (moe_layer_freq; all 0 for a dense model)."""
    from mindspeed_rl.models.hf_moe_config import moe_layer_pattern

    layers = int(args["num_layers"])
    return moe_layer_pattern(args.get("moe_layer_freq") or 1, layers) if is_moe(args) else [0] * layers


def expert_range(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """Global expert indices held by expert-parallel rank `ep_rank`."""
    if num_experts % ep_size:
        raise UserInputError(f"expert_model_parallel_size {ep_size} does not divide num_experts {num_experts}; "
                             f"pick an EP size that divides it.")
    per = num_experts // ep_size
    return range(ep_rank * per, (ep_rank + 1) * per)


def stage_expert_names(args: Mapping[str, Any], pp_size: int, pp_rank: int, ep_size: int, ep_rank: int) -> list[str]:
    """Expert parameter names (global layer and expert numbers) of one (PP stage, EP rank); [] for
    a dense model."""
    if not is_moe(args):
        return []
    experts, moe = expert_range(int(args["num_experts"]), ep_size, ep_rank), moe_layers(args)
    params = ("weight", "bias") if args.get("disable_bias_linear", True) is False else ("weight",)  # gpt-oss
    return [f"decoder.layers.{i}.mlp.experts.local_experts.{e}.{fc}.{p}"
            for i in layer_range(int(args["num_layers"]), pp_size, pp_rank) if moe[i]
            for e in experts for fc in ("linear_fc1", "linear_fc2") for p in params]


def kind_of(name: str, tied: bool, gated: bool = True) -> str:
    """Layout kind ('replicated', 'row', 'vocab', 'qkv', 'fc1', 'column', ...) of a megatron parameter."""
    return hf_names(name, None, tied, gated)[0]


def merge_tp(kind: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Full megatron tensor from its TP shards (rank order). See the module docstring."""
    if len(shards) == 1 or kind in ("replicated", "expert_bias"):
        return shards[0]
    if kind in ("row", "expert_row", "shared_row", "delta_row", "mamba_row", "conv_row"):
        return torch.cat(list(shards), dim=1)
    if kind in ("vocab", "qkv", "column", "delta_in", "delta_conv", "mamba_in", "conv_in", "expert_up", "shared_up"):
        return torch.cat(list(shards), dim=0)
    if kind in ("fc1", "expert_fc1", "shared_fc1"):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    raise ValueError(f"unknown layout kind {kind!r}")


def mcore_to_hf(name: str, full: torch.Tensor, args: Mapping[str, Any], vocab_size: int) -> dict[str, torch.Tensor]:
    """HF tensors made from one full megatron tensor; {} for the tied output layer (a copy of the
    embedding). Tensors are made contiguous (safetensors needs it)."""
    if name == "output_layer.weight" and not args.get("untie_embeddings_and_output_weights", False):
        return {}
    return {k: v.contiguous() for k, v in to_hf({name: full}, args, vocab_size).items()}
