"""Parameters the actor does not train (`freeze_parameters`: shell-style patterns over megatron's parameter names, with
global layer and expert numbers, as convert_ckpt and the checkpoints name them).

A frozen parameter has requires_grad off before megatron's DDP wraps the model, so it gets no gradient buffer, no
optimizer state and no weight decay; the forward and the weight sync to a rollout engine read it as before, and
checkpoints still hold it. What it saves is what training it would cost: Gemma 4 E2B's per-layer table
(`embedding.per_layer.embeddings.weight`, 2.3 B of its 5.1 B parameters) would take ~38 GB of fp32 gradient, master
copy and Adam moments.

    patterns_problem(["embedding.per_layer.*"], names)   # None, or the sentence naming what is wrong
    freeze(chunks, ["embedding.per_layer.*"])           # -> number of tensors frozen on this rank

With tied embeddings the last pipeline stage's output layer is the word embedding's copy and follows its pattern;
megatron's all-reduce of the two copies' gradients is skipped for a frozen pair (`tied_sync_of_frozen_skipped`,
around finalize_model_grads: megatron-core 0.12 would read the gradient a frozen weight does not have).
"""
from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional, Sequence

import torch


def matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether a global parameter name matches one of `patterns` (fnmatch: *, ?, [...]; case-sensitive)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def patterns_problem(patterns: Sequence[str], names: Iterable[str], key: str = "freeze_parameters") -> Optional[str]:
    """One sentence for patterns that match none of `names` (the model's parameters) or match them all; None when each
    pattern matches some parameter and some parameter stays trained."""
    names = list(names)
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) and p for p in patterns):
        return f"`{key}: {patterns}` must be a list of parameter-name patterns (e.g. [embedding.per_layer.*])."
    idle = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if idle:
        return (f"`{key}`: {', '.join(repr(p) for p in idle)} matches no parameter of the model, whose names look "
                f"like {', '.join(names[:2])} (megatron's, global layer numbers: README, Freezing parameters); fix "
                f"the pattern or drop it.")
    if names and all(matches(n, patterns) for n in names):
        return f"`{key}: {list(patterns)}` freezes every parameter of the model; leave some to train."
    return None


def freeze(chunks: Sequence[torch.nn.Module], patterns: Sequence[str]) -> int:
    """Turn requires_grad off for the parameters of this rank's model chunks whose global names match `patterns`;
    call before wrapping them in DDP. Returns how many tensors were frozen."""
    from mindspeed_rl.models.hf_bridge.loader import global_param_name

    frozen = 0
    for chunk in chunks:
        tied = getattr(chunk, "share_embeddings_and_output_weights", False)
        for local, param in chunk.named_parameters():
            name = global_param_name(chunk, local)[0]
            if tied and name == "output_layer.weight":  # the last stage's copy of the tied word embedding
                name = "embedding.word_embeddings.weight"
            if matches(name, patterns):
                param.requires_grad_(False)
                frozen += 1
    return frozen


@contextmanager
def tied_sync_of_frozen_skipped(chunks: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Around megatron's finalize_model_grads: chunks whose tied word embedding / output weight is frozen are marked
    untied for the call, so the all-reduce of that weight's gradient over the pipeline's first and last stages (which
    freeze it alike) is skipped; restored after."""
    untied = []
    for chunk in chunks:
        inner = getattr(chunk, "module", chunk)
        if getattr(inner, "share_embeddings_and_output_weights", False):
            weight = inner.shared_embedding_or_output_weight()
            if weight is not None and not weight.requires_grad:
                inner.share_embeddings_and_output_weights = False
                untied.append(inner)
    try:
        yield
    finally:
        for inner in untied:
            inner.share_embeddings_and_output_weights = True
