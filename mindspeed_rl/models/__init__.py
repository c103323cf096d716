"""Models: build a megatron-core GPTModel from Megatron-named args (builder.py), HF <-> megatron
weights with TP/PP sharding at load time (hf_bridge/), and forward helpers that turn
vocab-parallel logits into per-token log-probs / entropy (forward.py).

Importing builder or forward applies the platform patch first (megatron must come after it).
Submodules are imported explicitly; this package imports nothing heavy.
"""
