"""Apertus's MLP activation, xIELU ("Deriving Activation Functions Using Integration", 2024), with the
two learnable scalars every layer has, on megatron's local-spec MLP (megatron-core 0.12 and 0.16 have
no such activation).

    xIELU(x) = a_p x^2 + beta x                          for x > 0
               a_n (expm1(min(x, eps)) - x) + beta x     for x <= 0
    a_p = softplus(alpha_p), a_n = beta + softplus(alpha_n)

as transformers' XIELUActivation computes it in Python (and vLLM's XIELU): alpha_p and alpha_n are
(1,) parameters, beta (0.5) and eps (-1e-6) buffers, all stored in the checkpoint
(model.layers.N.mlp.act_fn.*; hf_bridge/mapping.py). Apertus's MLP has no gate: down(xIELU(up(x))).

`install` puts one `XIELU` on each layer's MLP as its `activation_func` (megatron's MLP calls that
attribute), so the scalars are per-layer parameters under `mlp.activation_func.*`; the rollout
engine's lean decode step calls the same module (rollout/kv_cache.py). Under tensor parallelism each
rank applies the activation to its slice of the MLP's features, so the scalars' gradients are
partial sums: they carry `tp_partial_grad` and `train_step.finalize_grads` sums them over TP
(megatron would sum them only under sequence parallelism, and only as SP norms).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

PARAMS = ("alpha_p", "alpha_n", "beta", "eps")  # state-dict order: the two parameters, then the buffers


class XIELU(torch.nn.Module):
    """xIELU with learnable alpha_p / alpha_n (module docstring); initialised as transformers' (a_p = a_n =
    0.8, beta 0.5, eps -1e-6) and normally loaded from the checkpoint."""

    def __init__(self, alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, beta: float = 0.5,
                 eps: float = -1e-6, dtype: torch.dtype = torch.float32):
        super().__init__()
        inverse_softplus = lambda v: torch.log(torch.expm1(torch.tensor(v, dtype=dtype))).unsqueeze(0)  # noqa: E731
        self.alpha_p = torch.nn.Parameter(inverse_softplus(alpha_p_init))
        self.alpha_n = torch.nn.Parameter(inverse_softplus(alpha_n_init - beta))
        self.alpha_p.tp_partial_grad = self.alpha_n.tp_partial_grad = True
        self.register_buffer("beta", torch.tensor(beta, dtype=dtype))
        self.register_buffer("eps", torch.tensor(eps, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x)


def install(model) -> int:
    """An XIELU as the activation of every dense MLP of `model` (a GPTModel chunk); returns how many."""
    from megatron.core.transformer.mlp import MLP

    count = 0
    for layer in model.decoder.layers:
        mlp = getattr(layer, "mlp", None)
        if type(mlp) is MLP and not isinstance(mlp.activation_func, XIELU):
            weight = mlp.linear_fc1.weight
            mlp.activation_func = XIELU(dtype=weight.dtype).to(weight.device)
            count += 1
    return count


def tp_partial_grads(chunks) -> list[torch.Tensor]:
    """The trained parameters of `chunks` whose gradient each TP rank holds only a part of (tp_partial_grad; frozen
    ones, freeze_parameters, have none)."""
    return [p for chunk in chunks for p in chunk.parameters()
            if getattr(p, "tp_partial_grad", False) and p.requires_grad]
