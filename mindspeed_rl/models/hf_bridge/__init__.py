"""Hugging Face <-> megatron-core weights for Llama / Qwen2 / Qwen3, sharded at load time.

    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, to_hf
    args = model_config_from_hf(read_hf_config(hf_dir))      # models.builder
    model = build_gpt_model(args)
    load_hf_checkpoint(model, hf_dir, args)                   # each rank reads only its slices

Files: checkpoint_io.py (safetensors directory reading, errors), mapping.py (names, layouts,
TP shards, full mcore -> HF), loader.py (walks a model chunk and fills it), sharding.py (PP stage
contents and TP merging on plain tensors, for checkpoints, conversion and export).
"""

from mindspeed_rl.models.hf_bridge.checkpoint_io import DictReader, SafetensorsReader
from mindspeed_rl.models.hf_bridge.loader import load_hf_checkpoint, load_into_model, read_hf_config
from mindspeed_rl.models.hf_bridge.mapping import ARCHITECTURES, to_hf

__all__ = ["ARCHITECTURES", "DictReader", "SafetensorsReader", "load_hf_checkpoint", "load_into_model",
           "read_hf_config", "to_hf"]
