"""Megatron features beyond TP/PP/DP that the builder, the forward helpers and the train step share:
sequence parallelism (SP), virtual pipeline chunks (VPP) and activation recompute.

Sequence parallelism: with TP > 1 the activations outside attention/MLP (norms, dropout,
residuals) are split along the sequence over the TP ranks; megatron's linears all-gather before
and reduce-scatter after. Two things megatron-core leaves to us on a machine without Apex /
Transformer Engine:
  - its torch-norm fallback (WrappedTorchNorm, the local spec's norm) refuses SP outright, though a
    norm is per token and splits fine. `SequenceParallelNorm` builds the same torch module and marks
    its weights `sequence_parallel`, so finalize_model_grads all-reduces their gradients over TP
    (each rank saw only its share of the tokens); `sequence_parallel_spec` puts it into the spec.
  - the sequence must split evenly: `pad_for_sequence_parallel` right-pads a batch to a multiple
    of TP (mask 0: causal attention never lets a real token see the padding); callers drop the
    padded positions' logits.
The native rollout engine decodes one token per step, which cannot be split over ranks:
`sequence_parallel_off` turns SP off in every module for the duration of a `with` block (same
weights, same math; SP only changes which rank holds which activations).

Recompute (megatron's keys, as MindSpeed-LLM uses them): recompute_granularity full (a layer's
whole forward is recomputed in backward; recompute_method uniform = every recompute_num_layers
layers form one checkpointed group, block = only the first recompute_num_layers layers of each
chunk) or selective (only core attention). Only training forwards recompute (megatron checks
`self.training`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Union

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.torch_norm import WrappedTorchNorm  # noqa: E402
from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules  # noqa: E402

from mindspeed_rl.models.chunks import Model, as_chunks, unwrap  # noqa: E402
from mindspeed_rl.models.spec_tree import swap_in_spec  # noqa: E402

RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")


# ---------------------------------------------------------------------------- sequence parallelism
class SequenceParallelNorm:
    """WrappedTorchNorm's signature and modules (torch RMSNorm / LayerNorm), usable with SP: the
    weights carry `sequence_parallel` so their gradients are all-reduced over TP."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        norm_cls = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}.get(config.normalization)
        if norm_cls is None:
            raise ValueError(f"normalization {config.normalization!r} is not supported; use RMSNorm or LayerNorm.")
        norm = norm_cls(hidden_size, eps=eps)
        for p in norm.parameters():
            setattr(p, "sequence_parallel", bool(config.sequence_parallel))
        return norm


def _swap_norm(node: Any) -> Any:
    """A copy of a spec tree with every WrappedTorchNorm replaced by SequenceParallelNorm."""
    return swap_in_spec(node, WrappedTorchNorm, SequenceParallelNorm)


def sequence_parallel_spec(spec: Union[ModuleSpec, TransformerBlockSubmodules],
                           num_layers_here: int) -> TransformerBlockSubmodules:
    """A block spec whose norms, the final one included, work with SP: a layer spec (dense or MoE,
    built on megatron's local spec) becomes `num_layers_here` layers (this chunk's); a block spec
    keeps its layers. Norms that already support SP (Apex's FusedLayerNorm) are left as they are."""
    if isinstance(spec, TransformerBlockSubmodules):
        return _swap_norm(spec)
    return TransformerBlockSubmodules(layer_specs=[_swap_norm(spec)] * num_layers_here,
                                      layer_norm=_swap_norm(LayerNormImpl))


def sequence_parallel_multiple(model: Model) -> int:
    """The multiple the sequence length must be of for this model: TP with SP on, else 1."""
    config = unwrap(as_chunks(model)[0]).config
    return config.tensor_model_parallel_size if config.sequence_parallel else 1


def pad_for_sequence_parallel(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                              multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad (B, S) ids (with 0) and mask (with 0) to a multiple of `multiple` along S."""
    extra = -input_ids.shape[1] % multiple
    if not extra:
        return input_ids, attention_mask
    pad = torch.nn.functional.pad
    return pad(input_ids, (0, extra), value=0), pad(attention_mask, (0, extra), value=0)


@contextlib.contextmanager
def sequence_parallel_off(model: Model) -> Iterator[None]:
    """Run megatron's layers without SP inside the block (decode steps of one token); restore after.
    Covers the config flag (read at forward time by the embedding and the block), the linears'
    `sequence_parallel` and the embeddings' `reduce_scatter_embeddings` (read from attributes)."""
    saved: list[tuple[Any, str, Any]] = []
    for chunk in as_chunks(model):
        for module in unwrap(chunk).modules():
            config = getattr(module, "config", None)
            if getattr(config, "sequence_parallel", False):
                saved.append((config, "sequence_parallel", True))
            for attr in ("sequence_parallel", "reduce_scatter_embeddings"):
                if getattr(module, attr, None) is True:
                    saved.append((module, attr, True))
    try:
        for owner, attr, _ in saved:
            setattr(owner, attr, False)
        yield
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


# ---------------------------------------------------------------------------- TransformerConfig fields
def parallel_config_kwargs(sequence_parallel: bool = False, virtual_pipeline_size: int = 1,
                           recompute_granularity: Optional[str] = None, recompute_method: Optional[str] = None,
                           recompute_num_layers: Optional[int] = None) -> dict[str, Any]:
    """TransformerConfig fields for SP, VPP and recompute (flat settings in, megatron's names out)."""
    out: dict[str, Any] = {"sequence_parallel": bool(sequence_parallel)}
    if virtual_pipeline_size > 1:
        out["virtual_pipeline_model_parallel_size"] = int(virtual_pipeline_size)
        # the interleaved schedule sends activations and gradients to the same peer at once; in one
        # batch_isend_irecv their order differs between the two ranks and, at PP=2, where prev ==
        # next, they are matched crosswise (found by the VPP gradient test). Megatron-LM turns
        # batching off with interleaving too; its per-op path orders even/odd ranks and, at PP=2,
        # sends the two directions over two groups
        out["batch_p2p_comm"] = False
    if recompute_granularity:
        if recompute_granularity not in RECOMPUTE_GRANULARITIES:
            raise ValueError(f"recompute_granularity {recompute_granularity!r} is not one of {RECOMPUTE_GRANULARITIES}")
        out["recompute_granularity"] = recompute_granularity
        if recompute_granularity == "full":
            method = recompute_method or "uniform"
            if method not in RECOMPUTE_METHODS:
                raise ValueError(f"recompute_method {method!r} is not one of {RECOMPUTE_METHODS}")
            out["recompute_method"] = method
            out["recompute_num_layers"] = int(recompute_num_layers or 1)
    return out
