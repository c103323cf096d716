"""The GRPO family as pure math on tensors: advantages, KL estimators, policy loss, aggregation.

Tensors in, tensors out. This package imports torch and the standard library only (no ray,
torch.distributed, megatron or config objects), so every function runs and is tested on CPU.
Shapes: B responses, T response tokens (right-padded), V vocabulary.
Formulas follow verl (verl/trainer/ppo/core_algos.py); each module says where others differ.
"""

from mindspeed_rl.algorithms.advantages import ESTIMATORS, compute_advantages, group_mean_std, token_level_scores
from mindspeed_rl.algorithms.aggregation import AGGREGATION_MODES, aggregate_loss
from mindspeed_rl.algorithms.dapo import filter_groups, overlong_penalty
from mindspeed_rl.algorithms.kl import KL_ESTIMATORS, kl_in_reward, kl_penalty
from mindspeed_rl.algorithms.kl_controllers import (
    KL_CONTROLLERS,
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
)
from mindspeed_rl.algorithms.masked import entropy_from_logits, masked_mean, masked_sum, masked_var, masked_whiten
from mindspeed_rl.algorithms.policy_loss import policy_loss
from mindspeed_rl.algorithms.tis import TIS_MODES, tis_stats, tis_weights

__all__ = [
    "AGGREGATION_MODES",
    "ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "TIS_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate_loss",
    "build_kl_controller",
    "compute_advantages",
    "entropy_from_logits",
    "filter_groups",
    "group_mean_std",
    "kl_in_reward",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss",
    "tis_stats",
    "tis_weights",
    "token_level_scores",
]
