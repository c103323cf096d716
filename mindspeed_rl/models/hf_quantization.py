"""The quantized checkpoints `load:` reads (hf_config.model_config_from_hf checks config.json's quantization_config
before anything else is read; hf_bridge/checkpoint_io.py dequantizes them), without megatron.
"""
from __future__ import annotations

from typing import Any, Mapping


def check_quantization(hf: Mapping[str, Any]) -> None:
    """A quantized checkpoint is read dequantized (hf_bridge/checkpoint_io.py) when its format is one
    the reader knows: gpt-oss's MXFP4 experts (quant_method mxfp4) and block-wise FP8 with 128 x 128
    blocks (quant_method fp8, weight_block_size [128, 128]: DeepSeek-V3 / R1, Kimi K2, Qwen3-FP8);
    anything else is refused in one sentence (its weights would be read as if they were not quantized)."""
    quant = hf.get("quantization_config")
    if not quant:
        return
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if method == "mxfp4" and hf.get("model_type") == "gpt_oss":
        return
    block = list(quant.get("weight_block_size") or []) if isinstance(quant, Mapping) else []
    if method == "fp8" and block == [128, 128] and quant.get("fmt", "e4m3") in ("e4m3", "float8_e4m3fn"):
        return
    raise ValueError(f"config.json quantization_config (quant_method {method!r}"
                     f"{f', weight_block_size {block}' if block else ''}) is a quantization load: does not read; "
                     f"it reads bf16 / fp16 / fp32 weights, block-wise FP8 with 128 x 128 blocks (DeepSeek-V3's) and "
                     f"gpt-oss's MXFP4 experts. Load the model's unquantized release instead.")
