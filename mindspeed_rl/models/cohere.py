"""Cohere's (Command R, Aya 23 / Expanse: cohere; Command R7B, Command A: cohere2) layer pieces that megatron-core's
local layer spec does not have (models/builder.py installs them from the keys hf_config.model_config_from_hf sets);
Phi-2 and GPT-NeoX / Pythia use the parallel residual too:

- parallel_residual: attention and MLP both read the layer's input normed by its one norm, and both outputs are added
  to it: x + attn(ln(x)) + mlp(ln(x)) (transformers' CohereDecoderLayer; vLLM's CohereDecoderLayer). Megatron's
  layer adds the attention output first and norms that sum for the MLP (pre_mlp_layernorm). `install_parallel_residual`
  makes each layer's pre_mlp_layernorm a `ParallelMLPInput`: a module without weights that applies the layer's
  input_layernorm to the layer's input, which a forward pre-hook on the layer hands it (a forward hook drops it
  again). The sum then is (x + attn) + mlp, transformers' order. Every forward through the modules (training,
  log-probs, the rollout's prefill) runs it; the rollout's lean and compiled decode steps feed the MLP themselves
  (rollout/kv_cache.py, `mlp_input`);
- parallel_residual_mlp_norm: the MLP reads the layer input normed by a norm of its own, x + attn(ln1(x)) +
  mlp(ln2(x)) (GPT-NeoX / Pythia's use_parallel_residual: its post_attention_layernorm): the ParallelMLPInput then
  owns that norm's weight and bias under the pre-MLP norm's names (pre_mlp_layernorm.weight / .bias), so the
  checkpoint bridge and the optimizer see megatron's usual layer;
- layernorm_bias false: LayerNorms with a weight and no bias (CohereLayerNorm: mean and variance in fp32, then the
  weight): `WeightOnlyLayerNorm`, torch's LayerNorm without a bias, swapped into the spec in place of megatron's
  norm classes, the final norm included (models/gemma.norms_replaced).

With sequence parallelism the layer input is this rank's sequence shard, as input_layernorm's is, and the norm
weights are marked `sequence_parallel` (models/parallel.SequenceParallelNorm's convention).
"""
from __future__ import annotations

import torch


class WeightOnlyLayerNorm:
    """torch.nn.LayerNorm without a bias, built with megatron's norm signature (Cohere's LayerNorm)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        if config.normalization != "LayerNorm":
            raise ValueError(f"layernorm_bias: false needs normalization: LayerNorm, not {config.normalization!r}.")
        norm = torch.nn.LayerNorm(hidden_size, eps=eps, bias=False)
        setattr(norm.weight, "sequence_parallel", bool(getattr(config, "sequence_parallel", False)))
        return norm


class ParallelMLPInput(torch.nn.Module):
    """pre_mlp_layernorm of a parallel-residual layer: a norm applied to the layer's input (set by the layer's hooks,
    install_parallel_residual), whatever it is called with. The norm is held outside the module tree: with
    `own_weights` false it is the layer's input_layernorm, whose weights the state dict, the optimizer and the
    checkpoint bridge then see once; with `own_weights` (GPT-NeoX) it is the pre-MLP norm megatron built, whose
    parameters this module registers under their own names (weight, bias), so they keep theirs."""

    def __init__(self, norm: torch.nn.Module, own_weights: bool = False):
        super().__init__()
        object.__setattr__(self, "_norm", norm)  # not a submodule
        if own_weights and len(list(norm.parameters(recurse=False))) != len(list(norm.parameters())):
            raise ValueError(f"parallel_residual_mlp_norm: the pre-MLP norm {type(norm).__name__} keeps its weights in "
                             f"submodules; use the local spec's norms (torch LayerNorm / RMSNorm).")
        for name, param in norm.named_parameters(recurse=False) if own_weights else ():
            self.register_parameter(name, param)  # the same tensors the norm computes with
        self.layer_input = None

    @torch.compiler.disable  # models/compiled_layers.py: the layer input changes every call; a graph break here
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.layer_input is None:
            raise RuntimeError("a parallel-residual layer's MLP input was asked for outside the layer's forward; "
                               "call the layer (its hooks set the input), or use input_layernorm's output directly.")
        return self._norm(self.layer_input)


def is_parallel(layer: torch.nn.Module) -> bool:
    """Whether this decoder layer's MLP reads the normed layer input (install_parallel_residual)."""
    return isinstance(getattr(layer, "pre_mlp_layernorm", None), ParallelMLPInput)


def mlp_input(layer: torch.nn.Module, layer_input: torch.Tensor, attention_input: torch.Tensor,
              attention_sum: torch.Tensor) -> torch.Tensor:
    """The MLP's input in a decode step that runs the layer's pieces itself (rollout/kv_cache.py): the attention's
    normed input (Cohere, Phi-2), the layer input normed by the MLP's own norm (GPT-NeoX), or megatron's
    pre_mlp_layernorm of the attention's residual sum."""
    if not is_parallel(layer):
        return layer.pre_mlp_layernorm(attention_sum)
    norm = layer.pre_mlp_layernorm._norm
    return attention_input if norm is layer.input_layernorm else norm(layer_input)


def install_parallel_residual(model: torch.nn.Module, mlp_norm: bool = False) -> None:
    """Make every layer of this GPTModel chunk a parallel-residual one (module docstring); `mlp_norm`: the MLP keeps a
    norm of its own (parallel_residual_mlp_norm). Call before the model is placed and its optimizer built
    (models/builder.py): without `mlp_norm` the pre-MLP norms' weights built from the spec go away."""
    for layer in model.decoder.layers:
        mlp_input = (ParallelMLPInput(layer.pre_mlp_layernorm, own_weights=True) if mlp_norm
                     else ParallelMLPInput(layer.input_layernorm))
        layer.pre_mlp_layernorm = mlp_input

        def keep(module, args, kwargs, mlp_input=mlp_input):
            mlp_input.layer_input = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        def drop(module, args, kwargs, output, mlp_input=mlp_input):
            mlp_input.layer_input = None

        layer.register_forward_pre_hook(keep, with_kwargs=True)
        layer.register_forward_hook(drop, with_kwargs=True, always_call=True)
