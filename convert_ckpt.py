"""HF <-> Megatron-core checkpoint conversion, with MindSpeed-LLM's flags.

    python convert_ckpt.py --load-model-type hf --save-model-type mg \
        --load-dir ./models/Qwen2.5-7B-Instruct --save-dir ./ckpt/qwen25-7b-tp2pp2 \
        --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2 --model-type-hf qwen2
    # MoE (Qwen3-MoE): add --target-expert-parallel-size 2 [--target-expert-tensor-parallel-size 1]

    python convert_ckpt.py --load-model-type mg --save-model-type hf \
        --load-dir ./ckpt/qwen25-7b-tp2pp2 --save-dir ./export/qwen25-7b-hf

Offline conversion is optional: `load:` takes a HF directory or any of our Megatron checkpoints
and shards it at load time. The conversion runs in this one process (no torch.distributed):
mindspeed_rl/models/convert.py does the TP/PP sharding math on tensors. The Megatron side is this
project's format (mindspeed_rl/models/checkpoint.py), not Megatron-LM's torch_dist format.
Architecture comes from config.json (hf) or manifest.json (mg); MindSpeed's architecture flags
(--add-qkv-bias, ...) are accepted for script compatibility and ignored.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

MODEL_TYPES_HF = ("llama2", "llama3", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "phi3", "smollm3", "granite", "gemma3", "gemma2", "gemma", "olmo2", "olmo3", "ministral3", "exaone4", "seed_oss", "glm4", "ernie4_5", "arcee", "glm4_moe", "deepseek3", "deepseek2", "glm4_moe_lite", "gpt_oss", "minimax_m2", "ernie4_5_moe", "apertus", "qwen3_5", "qwen3_5_moe", "qwen3_next", "olmoe", "flex_olmo", "hunyuan", "hunyuan_moe", "granitemoe", "granitemoeshared", "granitemoehybrid", "glm", "helium", "stablelm", "starcoder2", "nemotron", "cohere", "cohere2", "phi", "gpt_neox", "falcon", "olmo", "nemotron_h", "falcon_h1", "lfm2", "lfm2_moe", "exaone", "exaone_moe", "hy_v3", "afmoe", "sarvam_moe", "sarvam_mla", "jais2", "mellum", "hyperclovax", "gemma4", "youtu", "mimo", "nanochat", "vaultgemma", "dots1", "solar_open")  # = convert.HF_TYPES
IGNORED = ("use_mcore_models", "model_type", "tokenizer_model", "add_qkv_bias")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="convert_ckpt.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--load-model-type", choices=("hf", "mg"), required=True)
    p.add_argument("--save-model-type", choices=("hf", "mg"), required=True)
    p.add_argument("--load-dir", required=True)
    p.add_argument("--save-dir", required=True)
    p.add_argument("--target-tensor-parallel-size", type=int, default=1)
    p.add_argument("--target-pipeline-parallel-size", type=int, default=1)
    p.add_argument("--target-expert-parallel-size", type=int, default=1, help="EP of an MoE model (mg output)")
    p.add_argument("--target-expert-tensor-parallel-size", type=int, default=None,
                   help="ETP of an MoE model (mg output; default: the target TP)")
    p.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None,
                   help="mg target: layers per virtual pipeline chunk (the run's virtual pipeline); any run loads any layout")
    p.add_argument("--model-type-hf", choices=MODEL_TYPES_HF, default=None)
    p.add_argument("--params-dtype", choices=("fp32", "bf16", "fp16"), default=None,
                   help="cast tensors on save (default: keep the stored dtype)")
    p.add_argument("--hf-cfg-dir", default=None, help="config.json + tokenizer to write next to an HF export")
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=1,
                   help="pad the vocabulary to a multiple of this x TP (mg output)")
    p.add_argument("--use-mcore-models", action="store_true", help="accepted for MindSpeed-LLM scripts; ignored")
    p.add_argument("--model-type", default=None, help="accepted for MindSpeed-LLM scripts (GPT); ignored")
    p.add_argument("--tokenizer-model", default=None, help="accepted for MindSpeed-LLM scripts; ignored")
    p.add_argument("--add-qkv-bias", action="store_true", help="accepted; config.json decides; ignored")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mindspeed_rl.utils.errors import UserInputError

    ignored = [f"--{k.replace('_', '-')}" for k in IGNORED if getattr(args, k)]
    if ignored:
        print(f"convert_ckpt.py: ignoring {', '.join(ignored)} (the architecture comes from the checkpoint).", file=sys.stderr)
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine) (is|and Apex are) not installed")
    start = time.perf_counter()
    try:
        from mindspeed_rl.models.convert import convert, describe

        out = convert(args.load_model_type, args.save_model_type, args.load_dir, args.save_dir,
                      args.target_tensor_parallel_size, args.target_pipeline_parallel_size, args.model_type_hf,
                      args.params_dtype, args.hf_cfg_dir, args.make_vocab_size_divisible_by,
                      args.num_layers_per_virtual_pipeline_stage, args.target_expert_parallel_size,
                      args.target_expert_tensor_parallel_size)
    except UserInputError as err:
        print(f"convert_ckpt.py: {err}", file=sys.stderr)
        return 2
    print(f"convert_ckpt.py: wrote {describe(out)} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
