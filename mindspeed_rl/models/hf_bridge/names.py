"""HF tensor names an architecture stores differently from the bridge's canonical ones.

The bridge (hf_bridge/mapping.py) names HF tensors one way for every architecture (Llama / Qwen
layer names, Qwen-MoE expert names). Mixtral's checkpoints (and vLLM's Mixtral) call the router
`block_sparse_moe.gate` and an expert's gate / up / down projections w1 / w3 / w2. The three places
where names meet the outside rename with these two functions: reading a HF directory
(checkpoint_io.SafetensorsReader), writing one (hf_export.write_shard) and vLLM's load_weights
(rollout/vllm_engine.py); everything between them sees canonical names only.
"""
from __future__ import annotations

import re

# config.json model_type -> (canonical layer-relative name, that architecture's), {e} = expert number
_STORED_AS = {
    "mixtral": (("mlp.experts.{e}.gate_proj.weight", "block_sparse_moe.experts.{e}.w1.weight"),
                ("mlp.experts.{e}.up_proj.weight", "block_sparse_moe.experts.{e}.w3.weight"),
                ("mlp.experts.{e}.down_proj.weight", "block_sparse_moe.experts.{e}.w2.weight"),
                ("mlp.gate.weight", "block_sparse_moe.gate.weight")),
}


def _renames(pairs, reverse: bool):
    """(regex of one side's suffix, the other side's replacement) for each pair."""
    out = []
    for canonical, stored in pairs:
        src, dst = (stored, canonical) if reverse else (canonical, stored)
        pattern = re.compile(r"\." + re.escape(src).replace(re.escape("{e}"), r"(\d+)") + "$")
        out.append((pattern, "." + dst.replace("{e}", r"\1")))
    return tuple(out)


_TO_STORED = {t: _renames(pairs, reverse=False) for t, pairs in _STORED_AS.items()}
_TO_CANONICAL = {t: _renames(pairs, reverse=True) for t, pairs in _STORED_AS.items()}


def own_names(model_type: str | None) -> bool:
    """Whether `model_type` checkpoints store some tensors under names of their own."""
    return model_type in _STORED_AS


def stored_name(name: str, model_type: str | None) -> str:
    """The name a `model_type` checkpoint (and vLLM) uses for the canonical HF name `name`."""
    for pattern, repl in _TO_STORED.get(model_type or "", ()):
        if pattern.search(name):
            return pattern.sub(repl, name)
    return name


def canonical_name(name: str, model_type: str | None) -> str:
    """The canonical HF name of a tensor a `model_type` checkpoint stores as `name`."""
    for pattern, repl in _TO_CANONICAL.get(model_type or "", ()):
        if pattern.search(name):
            return pattern.sub(repl, name)
    return name
