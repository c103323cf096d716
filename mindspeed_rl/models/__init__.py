"""Models: build a megatron-core GPTModel from Megatron-named args (builder.py), HF <-> megatron
weights with TP/PP sharding at load time (hf_bridge/), and forward helpers that turn
vocab-parallel logits into per-token log-probs / entropy (forward.py). Checkpoints of our own
format with re-sharding on load (checkpoint.py), HF export (hf_export.py; its config.json from the
args: hf_export_config.py), offline conversion (convert.py, behind convert_ckpt.py), model yaml vs
config.json (arch_check.py), and the reward model: the trunk with a scalar head (reward_model.py).

Importing builder or forward applies the platform patch first (megatron must come after it).
Submodules are imported explicitly; this package imports nothing heavy.
"""
