"""The reward-model role: one Ray actor per device of `resource_pool.reward`, scoring sequences.

Each worker joins the reward group's process group, builds its shard of the reward model
(models/reward_model.py: the GPT trunk with a scalar head) at `reward.tensor_model_parallel_size`
/ `pipeline_model_parallel_size`, loads `reward.load` (a HF `*ForSequenceClassification`
directory with num_labels=1, or a checkpoint of this project) and answers compute_rm_score on
its DP shard. The score of a sequence is the head's output at its last real token, which for a
rollout batch (prompt left-padded, response right-padded) is the last response token.

The reward model reads the actor's token ids as they are: it must share the actor's tokenizer
(ray_gpt's assumption too); a vocabulary smaller than the tokenizer's stops at start-up.
"""
from __future__ import annotations

import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.platform import get_platform, on_device, params_dtype


class RewardModelWorker:
    def __init__(self, cfg):
        role = cfg.reward
        platform = get_platform(cfg.run.platform)
        platform.patch(role.mindspeed_switches)
        from mindspeed_rl.data.tokenizer import load_tokenizer
        from mindspeed_rl.distributed.worker_env import init_distributed
        from mindspeed_rl.models.builder import init_parallel_state
        from mindspeed_rl.models.checkpoint import load_weights
        from mindspeed_rl.models.reward_model import build_reward_model, reward_args
        from mindspeed_rl.utils.errors import UserInputError
        from mindspeed_rl.models.arch_check import model_args

        self.cfg, self.role_cfg = cfg, role
        self.env = init_distributed(platform)
        self.device = platform.device(self.env.device_index)  # the model lives here; @on_device moves batches
        init_parallel_state(role.parallel.tensor_model_parallel_size, role.parallel.pipeline_model_parallel_size,
                            seed=cfg.run.seed)
        vocab = len(load_tokenizer(cfg.run.tokenizer_name_or_path, trust_remote_code=cfg.run.trust_remote_code))
        self.args = reward_args(model_args(role, vocab))
        if int(self.args["padded_vocab_size"]) < vocab:
            raise UserInputError(f"`reward.load: {role.load}` has a vocabulary of {self.args['padded_vocab_size']} "
                                 f"tokens but the tokenizer has {vocab}; the reward model must share the actor's "
                                 f"tokenizer, so train or pick a reward model on it.")
        self.model = build_reward_model(self.args, params_dtype=params_dtype(role.params_dtype), device=self.device)
        load_weights(self.model, role.load, self.args)  # validate.py makes reward.load required
        self.model.requires_grad_(False)
        self.model.eval()

    def rank_info(self) -> dict:
        from mindspeed_rl.distributed.worker_env import rank_info
        return rank_info()

    @on_device
    def compute_rm_score(self, batch: dict) -> torch.Tensor:
        """(B,) float32 scores of this DP shard: the head at each sequence's last real token.

        Args:
            batch: input_ids (B, S), attention_mask (B, S) of prompt + response.
        Returns:
            (B,) on the output rank (TP rank 0 of the last stage); zeros on the other ranks.
        """
        from mindspeed_rl.models.reward_model import compute_scores
        from mindspeed_rl.models.forward import micro_batch_divisor

        rows = batch[K.INPUT_IDS].shape[0]
        out = compute_scores(self.model, batch[K.INPUT_IDS], batch[K.ATTENTION_MASK],
                             micro_batch_divisor(rows, self.role_cfg.micro_batch_size))
        return torch.zeros(rows, device=self.device) if out is None else out
