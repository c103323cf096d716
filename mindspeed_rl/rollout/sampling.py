"""Next-token selection from full-vocabulary logits: temperature, top-k, top-p, seeded sampling,
greedy, and the log-prob of the chosen token. Pure torch (no megatron, no distributed).

Which distribution the log-probs come from: log_softmax(logits / T) over the whole vocabulary,
taken BEFORE top-k / top-p filtering. That is what the trainer computes for the same tokens
(models.forward.vocab_parallel_log_probs), what vLLM and verl return, and the only choice that
lets the trainer reuse rollout log-probs as old_log_probs when the update is exactly on-policy.
Filtering only decides which tokens can be drawn. Greedy decoding (do_sample=False) takes the
argmax of the raw logits; the functions here report log-probs at whatever T they are given (the
engine gives T = 1 for greedy, SamplingParams.logprob_temperature).
"""

from __future__ import annotations

from typing import Optional

import torch


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the top_k largest logits of each row, -inf elsewhere (top_k <= 0 or >= V: unchanged).

    Args:
        logits: (B, V) float.
    Returns:
        (B, V), a new tensor when filtering applies. Ties at the k-th value are all kept.
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability mass
    reaches top_p (the most likely token is always kept); -inf elsewhere. top_p >= 1: unchanged.

    Args:
        logits: (B, V) float, already divided by the temperature.
    Returns:
        (B, V).
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = mass_before >= top_p  # the first token has mass_before 0 and is always kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def make_generator(seed: Optional[int], device: torch.device) -> Optional[torch.Generator]:
    """A torch.Generator on `device` seeded with `seed`; None (the global RNG) when seed is None."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


def choose_tokens(
    logits: torch.Tensor,
    do_sample: bool,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
    uniforms: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One token per row: a draw from softmax(filter(logits / T)) or the argmax.

    Args:
        logits: (B, V) over the real vocabulary (padding ids removed or set to -inf).
        do_sample: sample (True) or take the argmax of the raw logits (False).
        temperature: T > 0 when sampling.
        top_k / top_p: filtering of the sampling distribution (0 / 1.0 = off).
        generator: seeded torch.Generator for reproducible draws.
        uniforms: (B,) U[0, 1) draws to use instead of the generator (the engine draws one per
            sequence per step, so a sequence's samples do not depend on which others still run).

    Returns:
        tokens (B,) int64.
    """
    if not do_sample:
        return logits.argmax(dim=-1)
    z = logits.float() / temperature  # (B, V)
    probs = torch.softmax(apply_top_p(apply_top_k(z, top_k), top_p), dim=-1)
    if uniforms is None:
        uniforms = torch.rand(probs.shape[0], generator=generator, device=probs.device)
    return inverse_cdf(probs, uniforms)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row of (B, V) probabilities given (B,) uniforms u: the first token whose CDF
    exceeds u * total.

    Same distribution as torch.multinomial(probs, 1) (up to fp32 rounding of the CDF) at a third
    of its CPU cost, with B uniforms per step instead of B * V (the exponential race). Tokens
    with probability 0 (filtered) are never returned: their CDF step is flat.
    """
    cdf = probs.cumsum(dim=-1)  # (B, V)
    u = uniforms.to(cdf.dtype)[:, None]  # (B, 1)
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)  # (B,)
    tokens = tokens.clamp(max=probs.shape[-1] - 1)
    # u * total rounding up to total (probability ~1e-7) would land past the last kept token
    zero = probs.gather(-1, tokens[:, None]).squeeze(-1) == 0
    return torch.where(zero, probs.argmax(dim=-1), tokens)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T)[token] over the full vocabulary (no filtering): (B, V), (B,) -> (B,) fp32."""
    z = logits.float() / temperature
    return torch.log_softmax(z, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


def sample_next_token(
    logits: torch.Tensor,
    do_sample: bool,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """choose_tokens and their token_log_probs: tokens (B,) int64, log_probs (B,) float32."""
    tokens = choose_tokens(logits, do_sample, temperature, top_k, top_p, generator)
    return tokens, token_log_probs(logits, tokens, temperature)
