"""mindspeed_rl: GRPO training of LLMs with Ray orchestration and Megatron-core (NPU, CUDA, CPU).

Import this package lightly: heavy dependencies (ray, megatron) are imported by the subpackages
that need them, so that `mindspeed_rl.algorithms` and `mindspeed_rl.rewards` stay pure.
"""

__version__ = "0.1.0"
