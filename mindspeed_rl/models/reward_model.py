"""Reward model: the GPT trunk with a scalar head, loading HF `*ForSequenceClassification`
checkpoints (num_labels=1, e.g. Qwen2ForSequenceClassification).

    args = model_config_from_hf(read_hf_config(rm_dir))
    model = build_reward_model(args)                 # TP/PP from parallel_state, like build_gpt_model
    load_hf_checkpoint(model, rm_dir, reward_args(args))
    scores = compute_scores(model, input_ids, attention_mask, micro_batch_size=4)   # (B,) last stage

Design: megatron's output layer is a ColumnParallelLinear over the vocabulary; a 1-row "vocab"
cannot be split over TP. After the decoder (which applies the final norm on the last stage) every
TP rank holds the same full hidden states (B, S, h), so the head is a plain nn.Linear(h, 1)
replicated on TP ranks, installed as GPTModel.output_layer: GPTModel's own forward (pipeline
schedule, masks, rope) is reused unchanged and returns (B, S, 1). Its state-dict name
`output_layer.score.weight` maps to HF `score.weight` (hf_bridge.mapping). The vocabulary
projection is allocated at build time and dropped right after (untied, so nothing shares it).
The score of a sequence is the head's output at its last real token (attention_mask == 1), which
is HF's "last non-pad token" whenever padding tokens sit exactly where the mask is 0.
Sequence parallelism is not supported (the hidden states would be split over the sequence).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from mindspeed_rl.models.builder import build_gpt_model
from mindspeed_rl.models.forward import forward_microbatches


class ScoreHead(torch.nn.Module):
    """HF's `score` Linear (h -> 1, no bias), called by GPTModel as its output layer."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device, std: float):
        super().__init__()
        self.score = torch.nn.Linear(hidden_size, 1, bias=False, dtype=dtype, device=device)
        torch.nn.init.normal_(self.score.weight, 0.0, std)

    def forward(self, hidden_states: torch.Tensor, weight=None, runtime_gather_output=None):
        return self.score(hidden_states), None  # (S, B, h) -> (S, B, 1); GPTModel transposes to (B, S, 1)


def reward_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The args a reward model is built and loaded with: never tied (the head is not the embedding)."""
    return dict(args, untie_embeddings_and_output_weights=True)


def build_reward_model(args: Mapping[str, Any], params_dtype: torch.dtype = torch.float32,
                       pre_process: Optional[bool] = None, post_process: Optional[bool] = None,
                       device: Optional[torch.device] = None):
    """A GPTModel chunk whose last stage ends in ScoreHead, on `device` (builder.build_gpt_model's
    default when None); forward returns (B, S, 1) there."""
    model = build_gpt_model(reward_args(args), params_dtype, sequence_parallel=False,
                            pre_process=pre_process, post_process=post_process, device=device)
    if model.post_process:
        device = model.decoder.final_layernorm.weight.device
        model.output_layer = ScoreHead(int(args["hidden_size"]), params_dtype, device,
                                       float(args.get("init_method_std") or 0.02))
    return model


def last_token_scores(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S, 1) head outputs -> (B,) float32 at the last position where attention_mask is 1."""
    seq = attention_mask.shape[1]
    positions = torch.arange(seq, device=attention_mask.device)
    last = (positions * attention_mask.bool()).argmax(-1)  # (B,)
    return values[torch.arange(values.shape[0], device=values.device), last, 0].float()


def compute_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   micro_batch_size: int) -> Optional[torch.Tensor]:
    """Scores (B,) float32 on the last pipeline stage, None elsewhere.

    Args:
        input_ids, attention_mask: (B, S); left or right padding (mask 0 on padding).
    """
    out = forward_microbatches(model, input_ids, attention_mask, micro_batch_size,
                               post_fn=lambda values, mb: last_token_scores(values, mb["attention_mask"]))
    return None if out is None else torch.cat(out)
