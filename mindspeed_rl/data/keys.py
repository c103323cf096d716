"""The one spelling of every batch key that travels between roles (DESIGN.md, "One GRPO step").

Batches are plain dicts of tensors (plus a few lists for non-tensor metadata such as labels).
Shapes: B = sequences in the batch, P = prompt length (left-padded), T = response length
(right-padded), S = P + T.
"""

# ---- prompts (from the data loader)
PROMPT_IDS = "prompts"  # (B, P) left-padded prompt token ids
PROMPT_MASK = "prompt_mask"  # (B, P) 1 on real prompt tokens
PROMPT_LENGTH = "prompt_length"  # (B,) number of real prompt tokens
LABELS = "labels"  # list[str] (B,) ground truth for the rule verifiers
SOURCE = "source"  # list[str] (B,) which dataset / verifier a prompt comes from
EXTRAS = "extras"  # list[dict[str, str]] (B,) other ground-truth keys of the dataset (may be empty)
GROUP_INDEX = "group_index"  # (B,) prompt id shared by the n samples of one prompt

# ---- rollout output
INPUT_IDS = "input_ids"  # (B, S) prompt followed by response
ATTENTION_MASK = "attention_mask"  # (B, S) 1 on real tokens
POSITION_IDS = "position_ids"  # (B, S) positions counted over real tokens only
RESPONSES = "responses"  # (B, T) response token ids, right-padded
RESPONSE_MASK = "response_mask"  # (B, T) 1 on generated tokens (EOS included), 0 on padding
RESPONSE_LENGTH = "response_length"  # (B,)
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # (B, T) log-probs of the sampled tokens under the sampler
FINISH_REASON = "finish_reason"  # list[str] (B,) "eos" | "length"
ROUTED_EXPERTS = "routed_experts"  # (B, S, L, k) int16 MoE experts each token was routed to in rollout, -1 = none (models/moe_replay.py)

# ---- scoring and training
SCORES = "scores"  # (B,) sequence-level reward
OLD_LOG_PROBS = "old_log_probs"  # (B, T)
REF_LOG_PROBS = "ref_log_probs"  # (B, T)
ADVANTAGES = "advantages"  # (B, T)
RETURNS = "returns"  # (B, T)
