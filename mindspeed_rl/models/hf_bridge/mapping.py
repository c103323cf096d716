"""HF <-> megatron-core (local layer spec) weight names, layouts and TP sharding for the Llama
family (Llama 2/3, Qwen2/2.5, Qwen3): the torchtitan "state-dict adapter" for our models.

Megatron layouts (np query heads, ng query groups, hn head dim, q = np/ng heads per group):
  linear_qkv.weight  (ng*(q+2)*hn, h)  per group g: [q heads of g | k_g | v_g]  (HF: q/k/v_proj)
  linear_qkv.bias    (ng*(q+2)*hn,)    same grouping                           (Qwen2 biases)
  linear_fc1.weight  (2*ffn, h)        [gate | up]; a TP shard is [gate_r | up_r]
  word_embeddings / output_layer       (V_pad, h), rows past the HF vocab V are zero padding
TP: column-parallel (qkv, fc1, embeddings, output) split dim 0, row-parallel (linear_proj, fc2)
split dim 1, norms replicated. Splitting qkv by whole query groups keeps each shard a valid
[q | k | v] block, which is why megatron needs ng % TP == 0.

The dense architectures share HF names (Mistral's are Llama's); Qwen2 adds q/k/v biases, Qwen3 adds
q_norm / k_norm.
Which entries apply is decided by the parameters the megatron model actually has.

Qwen3-MoE (every layer MoE, megatron's SequentialMLP experts; E experts, f = moe_ffn_hidden_size):
  mlp.router.weight                                (E, h)   replicated   (HF: mlp.gate.weight)
  mlp.experts.local_experts.{e}.linear_fc1.weight  (2f, h)  [gate | up] of expert e, split over ETP
  mlp.experts.local_experts.{e}.linear_fc2.weight  (h, f)   down_proj of expert e, split over ETP
Expert numbers in our names are GLOBAL (e = ep_rank * E/EP + local index; loader.global_param_name
renumbers), so an expert's tensors mean the same at every EP. Expert tensors are split over the
expert-tensor-parallel group (ETP) instead of TP: kinds "expert_fc1" / "expert_row".

Mixtral stores the same tensors under its own names (`block_sparse_moe.gate`, experts' w1 = gate,
w3 = up, w2 = down): the bridge works in the names above throughout, and the three places where
names meet the outside rename (hf_bridge/names.py): reading a HF directory
(checkpoint_io.SafetensorsReader), writing one (hf_export.write_shard) and vLLM's load_weights
(rollout/vllm_engine.py).

Qwen2-MoE adds a shared expert (megatron's SharedExpertMLP, s = moe_shared_expert_intermediate_size),
split over TP like a dense MLP of width s (kinds "shared_fc1" / "shared_row"), and its gate:
  mlp.shared_experts.linear_fc1.weight  (2s, h)  [gate | up]   (HF: mlp.shared_expert.gate_proj / up_proj)
  mlp.shared_experts.linear_fc2.weight  (h, s)                 (HF: mlp.shared_expert.down_proj)
  mlp.shared_experts.gate_weight        (1, h)   replicated    (HF: mlp.shared_expert_gate.weight)

Gemma 4's layers differ in their attention's sizes (models/gemma4.py): Dims.at(HF name) gives the sizes of the name's
layer (hf_gemma4_config.layer_attention), and a full layer whose values are its keys (attention_k_eq_v) has linear_qkv
per group [q | k] from q_proj / k_proj alone (model_hf_names leaves v_proj out); its layer_scalar is replicated.
Gemma 4 E2B / E4B's KV-sharing layers' linear_qkv is q_proj alone (Dims.q_only; the k_proj / v_proj / k_norm some
checkpoints still hold for them are not read), their MLPs Dims.ffn wide (twice with kv_shared_double_mlp); the
per-layer inputs' table (model.embed_tokens_per_layer) is split over TP by rows ("column"), the rest replicated.
"""

from __future__ import annotations

import re
import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from mindspeed_rl.models.delta_layout import DeltaNetShape, conv_from_hf, conv_to_hf, in_proj_from_parts, in_proj_to_parts
from mindspeed_rl.models.hf_bridge.checkpoint_io import TensorReader, check_shape
from mindspeed_rl.models.short_conv_layout import bcx_from_parts, bcx_to_hf
from mindspeed_rl.models.mamba_layout import MambaShape, has_mamba, zxdt_from_parts, zxdt_to_parts
from mindspeed_rl.models.hf_config import HF_ARCHS, kv_channels
from mindspeed_rl.models.hf_gemma4_config import has_layer_shapes, kv_source, layer_attention, layer_ffn
from mindspeed_rl.utils.errors import UserInputError

ARCHITECTURES = HF_ARCHS  # one list: models/hf_config.py (config.json -> megatron args) reads the same ones
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Dims:
    """Sizes the layouts need, from Megatron-named args."""

    hidden: int
    ffn: int
    heads: int
    groups: int
    head_dim: int
    vocab_padded: int
    moe_ffn: int = 0  # expert MLP width (MoE models), else unused
    shared_ffn: int = 0  # shared expert MLP width (Qwen2-MoE), else unused
    attention_gate: bool = False  # Qwen3.5: q_proj holds each head's query and output-gate rows (models/qwen3_5.py)
    delta: DeltaNetShape | None = None  # Qwen3.5's Gated DeltaNet layers (models/delta_layout.py)
    mamba: MambaShape | None = None  # Granite 4.0-H's Mamba-2 layers (models/mamba_layout.py)
    k_eq_v: bool = False  # this layer's linear_qkv holds no values: per group [q | k] (Gemma 4's full layers)
    q_only: bool = False  # this layer's linear_qkv holds queries only (Gemma 4 E2B's KV-sharing layers)
    # (head_dim, groups, k_eq_v, q_only, ffn) of every layer where layers differ (Gemma 4: hf_gemma4_config)
    layer_shapes: tuple | None = None

    def at(self, hf_name: str) -> "Dims":
        """These sizes as they are in the layer of `hf_name` (model.layers.{i}.*; the model's for other names)."""
        m = _HF_LAYER.search(hf_name) if self.layer_shapes else None
        if m is None:
            return self
        head_dim, groups, k_eq_v, q_only, ffn = self.layer_shapes[int(m.group(1))]
        return dataclasses.replace(self, head_dim=head_dim, groups=groups, k_eq_v=k_eq_v, q_only=q_only, ffn=ffn,
                                   layer_shapes=None)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> "Dims":
        heads, hidden = int(args["num_attention_heads"]), int(args["hidden_size"])
        groups = int(args.get("num_query_groups") or heads) if args.get("group_query_attention") else heads
        ffn = int(args.get("ffn_hidden_size") or 4 * hidden)
        return cls(hidden, ffn, heads, groups, kv_channels(args),
                   int(args["padded_vocab_size"]), int(args.get("moe_ffn_hidden_size") or ffn),
                   int(args.get("moe_shared_expert_intermediate_size") or 0),
                   bool(args.get("attention_output_gate")) and not args.get("attention_gate_proj"),
                   DeltaNetShape.from_args(args) if any(args.get("linear_attention_layers") or ()) else None,
                   MambaShape.from_args(args) if has_mamba(args) else None,
                   layer_shapes=(tuple((*layer_attention(args, i), kv_source(args, i) is not None, layer_ffn(args, i))
                                       for i in range(int(args["num_layers"]))) if has_layer_shapes(args) else None))


# megatron name (layer-relative for "decoder.layers.N.*") -> (kind, HF names with {i} = layer)
_LAYER_MAP = {
    "input_layernorm.weight": ("replicated", ("model.layers.{i}.input_layernorm.weight",)),
    "input_layernorm.bias": ("replicated", ("model.layers.{i}.input_layernorm.bias",)),  # LayerNorm (StableLM)
    "self_attention.linear_qkv.weight": ("qkv", ("model.layers.{i}.self_attn.q_proj.weight",
                                                 "model.layers.{i}.self_attn.k_proj.weight",
                                                 "model.layers.{i}.self_attn.v_proj.weight")),
    "self_attention.linear_qkv.bias": ("qkv", ("model.layers.{i}.self_attn.q_proj.bias",
                                               "model.layers.{i}.self_attn.k_proj.bias",
                                               "model.layers.{i}.self_attn.v_proj.bias")),
    "self_attention.q_layernorm.weight": ("replicated", ("model.layers.{i}.self_attn.q_norm.weight",)),
    "self_attention.k_layernorm.weight": ("replicated", ("model.layers.{i}.self_attn.k_norm.weight",)),
    # OLMo 2's q / k norms over all heads (models/olmo.py): split over TP with the heads
    "self_attention.q_layernorm.sharded_weight": ("column", ("model.layers.{i}.self_attn.q_norm.weight",)),
    "self_attention.k_layernorm.sharded_weight": ("column", ("model.layers.{i}.self_attn.k_norm.weight",)),
    "self_attention.linear_proj.weight": ("row", ("model.layers.{i}.self_attn.o_proj.weight",)),
    "layer_scalar": ("replicated", ("model.layers.{i}.layer_scalar",)),  # Gemma 4's (1,) constant (models/gemma4.py)
    # Gemma 4 E2B / E4B's per-layer input gate, projection and norm (models/gemma4.install_per_layer_inputs)
    **{f"{n}.weight": ("replicated", (f"model.layers.{{i}}.{n}.weight",))
       for n in ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm")},
    # AFMoE's attention output gate, its own projection (models/qwen3_5.ProjGatedSelfAttention): split by heads
    "self_attention.linear_gate.weight": ("column", ("model.layers.{i}.self_attn.gate_proj.weight",)),
    "self_attention.linear_proj.bias": ("replicated", ("model.layers.{i}.self_attn.o_proj.bias",)),  # gpt-oss
    # gpt-oss's attention sinks, one per head: split over TP with the heads (models/gpt_oss.py)
    "self_attention.core_attention.softmax_offset": ("column", ("model.layers.{i}.self_attn.sinks",)),
    # multi-latent attention (DeepSeek-V3): every projection split over TP by rows ("column"; megatron's MLA
    # gathers the down projections' outputs back); its query norm is the canonical q_norm (stored as
    # q_a_layernorm: hf_bridge/names.py)
    "self_attention.linear_q_proj.weight": ("column", ("model.layers.{i}.self_attn.q_proj.weight",)),
    "self_attention.linear_q_down_proj.weight": ("column", ("model.layers.{i}.self_attn.q_a_proj.weight",)),
    "self_attention.linear_q_up_proj.weight": ("column", ("model.layers.{i}.self_attn.q_b_proj.weight",)),
    "self_attention.linear_kv_down_proj.weight": ("column", ("model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight",)),
    "self_attention.linear_kv_up_proj.weight": ("column", ("model.layers.{i}.self_attn.kv_b_proj.weight",)),
    "self_attention.kv_layernorm.weight": ("replicated", ("model.layers.{i}.self_attn.kv_a_layernorm.weight",)),
    # Qwen3.5's Gated DeltaNet in the self-attention slot (models/gated_delta_net.py; layouts: models/delta_layout.py)
    "self_attention.in_proj.weight": ("delta_in", ("model.layers.{i}.linear_attn.in_proj_qkv.weight",
                                                   "model.layers.{i}.linear_attn.in_proj_z.weight",
                                                   "model.layers.{i}.linear_attn.in_proj_b.weight",
                                                   "model.layers.{i}.linear_attn.in_proj_a.weight")),
    "self_attention.conv1d.weight": ("delta_conv", ("model.layers.{i}.linear_attn.conv1d.weight",)),
    "self_attention.A_log": ("column", ("model.layers.{i}.linear_attn.A_log",)),
    "self_attention.dt_bias": ("column", ("model.layers.{i}.linear_attn.dt_bias",)),
    "self_attention.norm.weight": ("replicated", ("model.layers.{i}.linear_attn.norm.weight",)),
    "self_attention.out_proj.weight": ("delta_row", ("model.layers.{i}.linear_attn.out_proj.weight",)),
    # Granite 4.0-H's Mamba-2 in the self-attention slot (models/mamba2.py; layouts: models/mamba_layout.py; the
    # canonical parts of its in_proj / conv1d: hf_bridge/names.py)
    "self_attention.in_proj_zxdt.weight": ("mamba_in", ("model.layers.{i}.mamba.in_proj_z.weight",
                                                        "model.layers.{i}.mamba.in_proj_x.weight",
                                                        "model.layers.{i}.mamba.in_proj_dt.weight")),
    "self_attention.in_proj_bc.weight": ("replicated", ("model.layers.{i}.mamba.in_proj_bc.weight",)),
    **{f"self_attention.conv1d_x.{k}": ("column", (f"model.layers.{{i}}.mamba.conv1d_x.{k}",)) for k in ("weight", "bias")},
    **{f"self_attention.conv1d_bc.{k}": ("replicated", (f"model.layers.{{i}}.mamba.conv1d_bc.{k}",))
       for k in ("weight", "bias")},
    **{f"self_attention.ssm_{k}": ("column", (f"model.layers.{{i}}.mamba.{k}",)) for k in ("A_log", "D", "dt_bias")},
    "self_attention.ssm_norm.weight": ("column", ("model.layers.{i}.mamba.norm.weight",)),
    "self_attention.ssm_out_proj.weight": ("mamba_row", ("model.layers.{i}.mamba.out_proj.weight",)),
    # LFM2's short convolution in the self-attention slot (models/short_conv.py; layout: models/short_conv_layout.py)
    **{f"self_attention.in_proj_bcx.{k}": ("conv_in", (f"model.layers.{{i}}.conv.in_proj.{k}",)) for k in ("weight", "bias")},
    **{f"self_attention.conv.{k}": ("column", (f"model.layers.{{i}}.conv.conv.{k}",)) for k in ("weight", "bias")},
    "self_attention.conv_out_proj.weight": ("conv_row", ("model.layers.{i}.conv.out_proj.weight",)),
    "self_attention.conv_out_proj.bias": ("replicated", ("model.layers.{i}.conv.out_proj.bias",)),
    "pre_mlp_layernorm.weight": ("replicated", ("model.layers.{i}.post_attention_layernorm.weight",)),
    "pre_mlp_layernorm.bias": ("replicated", ("model.layers.{i}.post_attention_layernorm.bias",)),
    "mlp.linear_fc1.weight": ("fc1", ("model.layers.{i}.mlp.gate_proj.weight",
                                      "model.layers.{i}.mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": ("row", ("model.layers.{i}.mlp.down_proj.weight",)),
    # a plain MLP's biases (StarCoder2's c_fc / c_proj: hf_bridge/names.py): fc1's split over TP with its rows
    "mlp.linear_fc1.bias": ("column", ("model.layers.{i}.mlp.up_proj.bias",)),
    "mlp.linear_fc2.bias": ("replicated", ("model.layers.{i}.mlp.down_proj.bias",)),
    # Apertus's xIELU scalars, one set per layer (models/xielu.py)
    **{f"mlp.activation_func.{n}": ("replicated", (f"model.layers.{{i}}.mlp.act_fn.{n}",))
       for n in ("alpha_p", "alpha_n", "beta", "eps")},
    # Gemma's norms on the attention / MLP outputs (models/gemma.py; stored names: hf_bridge/names.py)
    "post_self_attn_layernorm.weight": ("replicated", ("model.layers.{i}.post_self_attn_layernorm.weight",)),
    "post_mlp_layernorm.weight": ("replicated", ("model.layers.{i}.post_feedforward_layernorm.weight",)),
    "mlp.router.weight": ("replicated", ("model.layers.{i}.mlp.gate.weight",)),
    # Gemma 4 26B-A4B (models/gemma4.Gemma4MoE): the router's scales, the dense MLP beside the experts, their norms
    # (the dense MLP's pre-norm is Gemma's pre_feedforward_layernorm: the canonical post_attention_layernorm)
    **{f"mlp.router.{n}": ("replicated", (f"model.layers.{{i}}.router.{n}",)) for n in ("scale", "per_expert_scale")},
    "mlp.dense.linear_fc1.weight": ("fc1", ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight")),
    "mlp.dense.linear_fc2.weight": ("row", ("model.layers.{i}.mlp.down_proj.weight",)),
    "mlp.pre_dense_norm.weight": ("replicated", ("model.layers.{i}.post_attention_layernorm.weight",)),
    **{f"mlp.{ours}.weight": ("replicated", (f"model.layers.{{i}}.{theirs}.weight",))
       for ours, theirs in (("post_dense_norm", "post_feedforward_layernorm_1"),
                            ("pre_experts_norm", "pre_feedforward_layernorm_2"),
                            ("post_experts_norm", "post_feedforward_layernorm_2"))},
    "mlp.router.bias": ("replicated", ("model.layers.{i}.mlp.gate.bias",)),  # gpt-oss's router bias
    # sigmoid routing's per-expert bias for choosing the top-k (megatron's buffer; GLM-4.5, DeepSeek-V3)
    "mlp.router.expert_bias": ("replicated", ("model.layers.{i}.mlp.gate.e_score_correction_bias",)),
    "mlp.shared_experts.linear_fc1.weight": ("shared_fc1", ("model.layers.{i}.mlp.shared_expert.gate_proj.weight",
                                                            "model.layers.{i}.mlp.shared_expert.up_proj.weight")),
    "mlp.shared_experts.linear_fc2.weight": ("shared_row", ("model.layers.{i}.mlp.shared_expert.down_proj.weight",)),
    "mlp.shared_experts.gate_weight": ("replicated", ("model.layers.{i}.mlp.shared_expert_gate.weight",)),
}
# Falcon-H1's Mamba-2 mixer beside the attention, as the attention's child `mamba` (models/parallel_hybrid.py): the
# same tensors as Granite 4.0-H's Mamba-2 layers
_LAYER_MAP.update({"self_attention.mamba." + k[len("self_attention."):]: v for k, v in list(_LAYER_MAP.items())
                   if k.startswith(("self_attention.in_proj_zxdt", "self_attention.in_proj_bc", "self_attention.conv1d_",
                                    "self_attention.ssm_"))})
_PLAIN_FC1 = ("column", ("model.layers.{i}.mlp.up_proj.weight",))  # a non-gated MLP's fc1 (Arcee)
# the experts' and the shared expert's fc1 without a gate (Nemotron-H's MoE layers): up_proj alone, split by rows
_PLAIN_EXPERT_FC1 = ("expert_up", ("model.layers.{i}.mlp.experts.{e}.up_proj.weight",))
_PLAIN_SHARED_FC1 = ("shared_up", ("model.layers.{i}.mlp.shared_expert.up_proj.weight",))
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.(weight|bias)$")
_EXPERT_MAP = {("linear_fc1", "weight"): ("expert_fc1", ("model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
                                                         "model.layers.{i}.mlp.experts.{e}.up_proj.weight")),
               ("linear_fc2", "weight"): ("expert_row", ("model.layers.{i}.mlp.experts.{e}.down_proj.weight",)),
               # gpt-oss's expert biases: fc1's [gate | up] split over ETP as its rows, fc2's whole
               ("linear_fc1", "bias"): ("expert_fc1", ("model.layers.{i}.mlp.experts.{e}.gate_proj.bias",
                                                       "model.layers.{i}.mlp.experts.{e}.up_proj.bias")),
               ("linear_fc2", "bias"): ("expert_bias", ("model.layers.{i}.mlp.experts.{e}.down_proj.bias",))}
EXPERT_KINDS = ("expert_fc1", "expert_up", "expert_row", "expert_bias")  # split over ETP, not TP (expert_bias: whole)
_GLOBAL_MAP = {
    "embedding.word_embeddings.weight": ("vocab", ("model.embed_tokens.weight",)),
    "decoder.final_layernorm.weight": ("replicated", ("model.norm.weight",)),
    "decoder.final_layernorm.bias": ("replicated", ("model.norm.bias",)),
    "output_layer.weight": ("vocab", ("lm_head.weight",)),
    "output_layer.bias": ("vocab", ("lm_head.bias",)),  # add_output_layer_bias (Phi-2): (V,), padded and split alike
    # reward models (models/reward_model.py): the (1, h) head of *ForSequenceClassification
    "output_layer.score.weight": ("replicated", ("score.weight",)),
    # Gemma 4 E2B / E4B's per-layer inputs (models/gemma4.PerLayerInputs): the table split over TP by rows
    "embedding.per_layer.embeddings.weight": ("column", ("model.embed_tokens_per_layer.weight",)),
    "embedding.per_layer.projection.weight": ("replicated", ("model.per_layer_model_projection.weight",)),
    "embedding.per_layer.norm.weight": ("replicated", ("model.per_layer_projection_norm.weight",)),
}
TIED_OUTPUT = "model.embed_tokens.weight"  # what output_layer loads when embeddings are tied


def gated_mlp(args: Mapping[str, Any]) -> bool:
    """Whether the dense MLP is gated (fc1 = [gate | up]: SwiGLU, GeGLU) or not (fc1 = up_proj alone:
    Arcee's squared ReLU), from Megatron-named args as models/builder.py reads them."""
    return args.get("swiglu", True) is not False or bool(args.get("geglu"))


def hf_names(mcore_name: str, global_layer: int | None, tied: bool, gated: bool = True) -> tuple[str, tuple[str, ...]]:
    """(kind, HF tensor names) for a megatron parameter; `mcore_name` uses the global layer. `gated`:
    gated_mlp(args); a plain MLP's fc1 is up_proj alone, split over TP by rows ("column")."""
    m = _LAYER.match(mcore_name)
    expert = _EXPERT.match(m.group(2)) if m else None
    if expert:  # the expert number in the name is global (see module docstring)
        kind, names = _EXPERT_MAP[(expert.group(2), expert.group(3))]
        if (expert.group(2), expert.group(3)) == ("linear_fc1", "weight") and not gated:
            kind, names = _PLAIN_EXPERT_FC1
        layer = int(m.group(1)) if global_layer is None else global_layer
        return kind, tuple(n.format(i=layer, e=int(expert.group(1))) for n in names)
    if m:
        entry = _LAYER_MAP.get(m.group(2))
        if entry is None:
            raise UserInputError(f"megatron parameter {mcore_name} has no Hugging Face mapping.")
        plain = {"mlp.linear_fc1.weight": _PLAIN_FC1, "mlp.shared_experts.linear_fc1.weight": _PLAIN_SHARED_FC1}
        kind, names = plain[m.group(2)] if m.group(2) in plain and not gated else entry
        return kind, tuple(n.format(i=int(m.group(1)) if global_layer is None else global_layer) for n in names)
    if mcore_name == "output_layer.weight" and tied:
        return "vocab", (TIED_OUTPUT,)
    if mcore_name not in _GLOBAL_MAP:
        raise UserInputError(f"megatron parameter {mcore_name} has no Hugging Face mapping.")
    return _GLOBAL_MAP[mcore_name]


def model_hf_names(mcore_name: str, global_layer: int | None, args: Mapping[str, Any],
                   tied: bool) -> tuple[str, tuple[str, ...]]:
    """hf_names for a parameter of the model of `args`: without v_proj in a layer whose values are its keys (Gemma 4's
    full layers with attention_k_eq_v, hf_gemma4_config.layer_attention), where the checkpoint has none."""
    kind, names = hf_names(mcore_name, global_layer, tied, gated_mlp(args))
    if kind == "qkv" and has_layer_shapes(args):
        layer = global_layer if global_layer is not None else int(_LAYER.match(mcore_name).group(1))
        if kv_source(args, layer) is not None:  # a KV-sharing layer (Gemma 4 E2B): q_proj alone
            names = names[:1]
        elif layer_attention(args, layer)[2]:
            names = names[:2]
    return kind, names


# ---------------------------------------------------------------------------------------------
# HF -> one TP shard of a megatron tensor


def _chunk(n: int, tp: int, rank: int, what: str) -> slice:
    if n % tp:
        raise UserInputError(f"{what} ({n}) is not divisible by tensor_model_parallel_size {tp}.")
    size = n // tp
    return slice(rank * size, (rank + 1) * size)


def read_shard(reader: TensorReader, kind: str, names: tuple[str, ...], dims: Dims,
               tp: int, rank: int) -> torch.Tensor:
    """The rank-th TP shard of a megatron tensor, read (only that part) from HF tensors. For the
    expert kinds `tp`/`rank` are the expert-tensor-parallel size and rank."""
    d = dims.at(names[0])
    if kind == "expert_row":  # down_proj (h, f): split the input dim
        check_shape(reader, names[0], (d.hidden, d.moe_ffn))
        return reader.read(names[0], cols=_chunk(d.moe_ffn, tp, rank, names[0] + " columns"))
    if kind == "expert_fc1":  # gate, up (f, h) -> [gate_r | up_r]; their biases (f,) alike
        rows = _chunk(d.moe_ffn, tp, rank, "moe_ffn_hidden_size (expert_tensor_parallel_size)")
        tail = () if names[0].endswith(".bias") else (d.hidden,)
        for n in names:
            check_shape(reader, n, (d.moe_ffn, *tail))
        return torch.cat([reader.read(n, rows=rows) for n in names], dim=0)
    if kind == "expert_up":  # an expert's up_proj (f, h) without a gate: its rows split over ETP
        check_shape(reader, names[0], (d.moe_ffn, d.hidden))
        return reader.read(names[0], rows=_chunk(d.moe_ffn, tp, rank, "moe_ffn_hidden_size (expert_tensor_parallel_size)"))
    if kind == "shared_up":  # the shared expert's up_proj (s, h) without a gate: its rows split over TP
        check_shape(reader, names[0], (d.shared_ffn, d.hidden))
        return reader.read(names[0], rows=_chunk(d.shared_ffn, tp, rank, "moe_shared_expert_intermediate_size"))
    if kind == "expert_bias":  # down_proj's bias (h,), whole on every expert-TP rank
        check_shape(reader, names[0], (d.hidden,))
        return reader.read(names[0])
    if kind == "replicated":
        return reader.read(names[0])
    if kind == "column":  # split over TP by rows: OLMo 2's q / k norms (by heads), a plain MLP's up_proj
        if names[0].endswith("mlp.up_proj.weight"):
            check_shape(reader, names[0], (d.ffn, d.hidden))
        n = reader.shape(names[0])[0]
        return reader.read(names[0], rows=_chunk(n, tp, rank, names[0]))
    if kind == "shared_row":  # the shared expert's down_proj (h, s): split the input dim
        check_shape(reader, names[0], (d.hidden, d.shared_ffn))
        return reader.read(names[0], cols=_chunk(d.shared_ffn, tp, rank, names[0] + " columns"))
    if kind == "shared_fc1":  # the shared expert's gate, up (s, h) -> [gate_r | up_r]
        rows = _chunk(d.shared_ffn, tp, rank, "moe_shared_expert_intermediate_size")
        for n in names:
            check_shape(reader, n, (d.shared_ffn, d.hidden))
        return torch.cat([reader.read(n, rows=rows) for n in names], dim=0)
    if kind == "row":  # o_proj (h, np*hn) / down_proj (h, ffn): split the input dim
        expected = (d.hidden, d.heads * d.head_dim) if "o_proj" in names[0] else (d.hidden, d.ffn)
        check_shape(reader, names[0], expected)
        return reader.read(names[0], cols=_chunk(expected[1], tp, rank, names[0] + " columns"))
    if kind == "fc1":  # gate, up (ffn, h) -> [gate_r | up_r]
        rows = _chunk(d.ffn, tp, rank, "ffn_hidden_size")
        for n in names:
            check_shape(reader, n, (d.ffn, d.hidden))
        return torch.cat([reader.read(n, rows=rows) for n in names], dim=0)
    if kind == "vocab":  # (V, h) -> rows [r*Vp/tp, (r+1)*Vp/tp) of the zero-padded (Vp, h); an output bias (V,) alike
        shape = tuple(reader.shape(names[0]))
        vocab, rest = shape[0], shape[1:]
        if rest not in ((d.hidden,), ()) or vocab > d.vocab_padded:
            raise UserInputError(
                f"tensor {names[0]} in {reader.where(names[0])} has shape {list(shape)}, which does "
                f"not fit hidden_size {d.hidden} and padded_vocab_size {d.vocab_padded}.")
        rows = _chunk(d.vocab_padded, tp, rank, "padded_vocab_size")
        real = reader.read(names[0], rows=slice(min(rows.start, vocab), min(rows.stop, vocab)))
        out = real.new_zeros(rows.stop - rows.start, *rest)
        out[: real.shape[0]] = real
        return out
    if kind == "qkv":  # q (np*hn, ...), k/v (ng*hn, ...) -> per-group [q | k | v] of this rank's groups
        per_group = d.heads // d.groups
        g = _chunk(d.groups, tp, rank, "num_query_groups")
        tail = () if names[0].endswith(".bias") else (d.hidden,)
        q_rows = 2 if d.attention_gate else 1  # Qwen3.5: each head's query rows, then its gate rows
        check_shape(reader, names[0], (q_rows * d.heads * d.head_dim, *tail))
        if d.q_only:  # a KV-sharing layer (Gemma 4 E2B): this rank's query heads alone
            return reader.read(names[0], rows=slice(g.start * per_group * d.head_dim, g.stop * per_group * d.head_dim))
        check_shape(reader, names[1], (d.groups * d.head_dim, *tail))
        if d.k_eq_v:  # Gemma 4's full layers: no v_proj, per group [q | k]
            q = reader.read(names[0], rows=slice(g.start * per_group * d.head_dim, g.stop * per_group * d.head_dim))
            k = reader.read(names[1], rows=slice(g.start * d.head_dim, g.stop * d.head_dim))
            n_local = g.stop - g.start
            qk = torch.cat([q.reshape(n_local, per_group * d.head_dim, *tail), k.reshape(n_local, d.head_dim, *tail)], 1)
            return qk.reshape(n_local * (per_group + 1) * d.head_dim, *tail)
        check_shape(reader, names[2], (d.groups * d.head_dim, *tail))
        q = reader.read(names[0], rows=slice(q_rows * g.start * per_group * d.head_dim,
                                             q_rows * g.stop * per_group * d.head_dim))
        k = reader.read(names[1], rows=slice(g.start * d.head_dim, g.stop * d.head_dim))
        v = reader.read(names[2], rows=slice(g.start * d.head_dim, g.stop * d.head_dim))
        n_local = g.stop - g.start
        if d.attention_gate:  # (heads, [query | gate], hn) -> per group [its queries | their gates]
            q = q.reshape(n_local, per_group, 2, d.head_dim, *tail).transpose(1, 2)
        qkv = torch.cat([q.reshape(n_local, q_rows * per_group * d.head_dim, *tail),
                         k.reshape(n_local, d.head_dim, *tail),
                         v.reshape(n_local, d.head_dim, *tail)], dim=1)
        return qkv.reshape(n_local * (q_rows * per_group + 2) * d.head_dim, *tail)
    if kind in ("delta_in", "delta_conv"):  # Gated DeltaNet: this rank's key heads, grouped (delta_layout)
        s, groups = d.delta, _chunk(d.delta.key_heads, tp, rank, "linear_num_key_heads")
        n, dk, dv = groups.stop - groups.start, s.key_head_dim, s.ratio * s.value_head_dim
        heads = lambda width, offset=0: slice(offset + groups.start * width, offset + groups.stop * width)  # noqa: E731
        conv_rows, tail = s.key_heads * (2 * dk + dv), ((1, s.conv_kernel) if kind == "delta_conv" else (d.hidden,))
        check_shape(reader, names[0], (conv_rows, *tail))
        qkv = torch.cat([reader.read(names[0], rows=heads(dk)), reader.read(names[0], rows=heads(dk, s.key_heads * dk)),
                         reader.read(names[0], rows=heads(dv, 2 * s.key_heads * dk))])
        if kind == "delta_conv":
            return conv_from_hf(qkv, s, groups=n)
        for name, width in zip(names[1:], (dv, s.ratio, s.ratio)):
            check_shape(reader, name, (s.key_heads * width, d.hidden))
        z, b, a = (reader.read(name, rows=heads(width)) for name, width in zip(names[1:], (dv, s.ratio, s.ratio)))
        return in_proj_from_parts(qkv, z, b, a, s, groups=n)
    if kind == "mamba_in":  # Mamba-2's z / x / dt rows of this rank's heads, grouped per head (mamba_layout)
        s = d.mamba
        heads = _chunk(s.heads, tp, rank, "mamba_num_heads")
        for name, width in zip(names, (s.head_dim, s.head_dim, 1)):
            check_shape(reader, name, (s.heads * width, d.hidden))
        z, x, dt = (reader.read(name, rows=slice(heads.start * width, heads.stop * width))
                    for name, width in zip(names, (s.head_dim, s.head_dim, 1)))
        return zxdt_from_parts(z, x, dt, s, heads=heads.stop - heads.start)
    if kind == "mamba_row":  # Mamba-2's out_proj (h, heads * head_dim): split the input dim
        expected = (d.hidden, d.mamba.inner)
        check_shape(reader, names[0], expected)
        return reader.read(names[0], cols=_chunk(expected[1], tp, rank, names[0] + " columns"))
    if kind == "conv_in":  # LFM2's in_proj [B | C | x] (3h, ...): this rank's channels of each, interleaved
        tail = () if names[0].endswith(".bias") else (d.hidden,)
        check_shape(reader, names[0], (3 * d.hidden, *tail))
        ch = _chunk(d.hidden, tp, rank, "hidden_size")
        return bcx_from_parts(*(reader.read(names[0], rows=slice(o + ch.start, o + ch.stop))
                                for o in (0, d.hidden, 2 * d.hidden)))
    if kind == "conv_row":  # LFM2's conv out_proj (h, h): split the input dim
        check_shape(reader, names[0], (d.hidden, d.hidden))
        return reader.read(names[0], cols=_chunk(d.hidden, tp, rank, names[0] + " columns"))
    if kind == "delta_row":  # Gated DeltaNet's out_proj (h, value heads * dv): split the input dim
        expected = (d.hidden, d.delta.value_heads * d.delta.value_head_dim)
        check_shape(reader, names[0], expected)
        return reader.read(names[0], cols=_chunk(expected[1], tp, rank, names[0] + " columns"))
    raise ValueError(f"unknown layout kind {kind!r}")


# ---------------------------------------------------------------------------------------------
# full (unsharded) megatron state dict -> HF


def to_hf(mcore: Mapping[str, torch.Tensor], args: Mapping[str, Any], vocab_size: int) -> dict[str, torch.Tensor]:
    """Convert a full TP=1/PP=1 megatron state dict (global layer numbers) to HF tensors.

    Args:
        mcore: {megatron name: tensor}; `_extra_state` entries are skipped.
        args: Megatron-named architecture args.
        vocab_size: the HF vocabulary (padding rows past it are dropped).
    """
    model_dims, out = Dims.from_args(args), {}  # tied embeddings: no output_layer.weight, hence no lm_head
    for name, tensor in mcore.items():
        if name.endswith("_extra_state"):
            continue
        kind, names = model_hf_names(name, None, args, tied=False)
        d = model_dims.at(names[0])
        if kind in ("replicated", "row", "expert_row", "shared_row", "column", "expert_bias", "delta_row", "mamba_row",
                    "expert_up", "shared_up", "conv_row"):
            out[names[0]] = tensor
        elif kind == "conv_in":
            out[names[0]] = bcx_to_hf(tensor)
        elif kind == "mamba_in":
            out.update(zip(names, zxdt_to_parts(tensor, d.mamba)))
        elif kind == "delta_in":
            out.update(zip(names, in_proj_to_parts(tensor, d.delta)))
        elif kind == "delta_conv":
            out[names[0]] = conv_to_hf(tensor, d.delta)
        elif kind == "vocab":
            out[names[0]] = tensor[:vocab_size]
        elif kind in ("fc1", "expert_fc1", "shared_fc1"):
            out[names[0]], out[names[1]] = tensor.chunk(2, dim=0)
        elif kind == "qkv" and d.q_only:  # queries only (Gemma 4 E2B's KV-sharing layers)
            out[names[0]] = tensor
        elif kind == "qkv" and d.k_eq_v:  # per group [q | k] (Gemma 4's full layers: no v_proj)
            per_group = d.heads // d.groups
            grouped = tensor.reshape(d.groups, (per_group + 1) * d.head_dim, *tensor.shape[1:])
            q, k = grouped.split([per_group * d.head_dim, d.head_dim], dim=1)
            for n, t in zip(names, (q, k)):
                out[n] = t.reshape(-1, *tensor.shape[1:])
        elif kind == "qkv":
            per_group, q_rows = d.heads // d.groups, 2 if d.attention_gate else 1
            grouped = tensor.reshape(d.groups, (q_rows * per_group + 2) * d.head_dim, *tensor.shape[1:])
            q, k, v = grouped.split([q_rows * per_group * d.head_dim, d.head_dim, d.head_dim], dim=1)
            if d.attention_gate:  # per group [queries | gates] -> per head [query | gate] (HF's q_proj)
                q = q.reshape(d.groups, 2, per_group, d.head_dim, *tensor.shape[1:]).transpose(1, 2)
            for n, t in zip(names, (q, k, v)):
                out[n] = t.reshape(-1, *tensor.shape[1:])
    return out
