"""Keys that MindSpeed-LLM ray_gpt configs carry but that are not part of our typed schema.

Two kinds:
- MINDSPEED_SWITCHES: MindSpeed feature switches. Forwarded to MindSpeed on NPU (platform/npu.py
  sets them on the Megatron args MindSpeed's adaptor reads); reported once as ignored elsewhere.
- NO_EFFECT_KEYS: Megatron-LM training arguments that only make sense in megatron/training's own
  loop. Accepted so an existing ray_gpt config parses; reported once with the reason.
Any other unknown key is an error with a "did you mean" suggestion (config/loader.py).
"""

# The names live with the code that forwards them (platform/base.py): one list.
from mindspeed_rl.platform.base import MINDSPEED_SWITCHES  # noqa: E402

NO_EFFECT_KEYS = {
    "use_mcore_models": "models are always megatron-core GPTModel",
    "distributed_backend": "the platform picks hccl, nccl or gloo",
    "no_shared_storage": "every node reads its own paths (checked before spawning)",
    "no_load_optim": "RL runs start from weights only; resume restores the optimizer",
    "no_load_rng": "RL runs start from weights only; resume restores rng states",
    "is_instruction_dataset": "the prompt dataset format is detected from data_path",
    "variable_seq_lengths": "sequences always have variable lengths here",
    "finetune": "load: always starts from the checkpoint's weights",
    "split": "only the training split is used; validation comes from val_data_path",
    "pad_to_multiple_of": "batches are padded to the longest sequence",
    "has_labels": "labels travel with every prompt that has them",
    "no_masked_softmax_fusion": "a CUDA/NPU kernel choice",
    "attention_softmax_in_fp32": "softmax is computed in fp32",
    "no_gradient_accumulation_fusion": "a CUDA kernel choice",
    "masked_softmax_fusion": "a CUDA/NPU kernel choice",
    "bias_gelu_fusion": "a CUDA/NPU kernel choice",
    "bias_dropout_fusion": "a CUDA/NPU kernel choice",
    "gradient_accumulation_fusion": "a CUDA kernel choice",
    "no_bias_swiglu_fusion": "a CUDA/NPU kernel choice",
    "no_rope_fusion": "a CUDA/NPU kernel choice",
    "cliprange_value": "PPO critic only",
    "critic_mini_batch_size": "PPO critic only",
    "critic_update_epochs": "PPO critic only",
    "eval_interval": "use training.test_freq",
    "eval_iters": "validation runs over the whole val_data_path",
    "log_throughput": "throughput is always logged",
    "sequence_parallel_size": "not supported",
}


def normalize_key(key: str) -> str:
    """ray_gpt configs mix `max-tokens-to-oom` and `max_tokens_to_oom`; both mean the same."""
    return key.replace("-", "_")
