"""Joining rollout batches (the layout of data/keys.py): rows from different generate calls or
DP ranks have their own prompt width P and response width T; joined, they share the widest."""
from __future__ import annotations

import torch

from mindspeed_rl.data import keys as K

PROMPT_KEYS = {K.PROMPT_IDS, K.PROMPT_MASK}  # (B, P), left-padded
SEQUENCE_KEYS = {K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS}  # (B, P + T); other 2-D keys are (B, T)


def concat_rollouts(batches: list[dict]) -> dict:
    """Concatenate rollout batches along rows, re-padding to the widest prompt and response.

    Prompts are left-padded (width P), responses right-padded (width T), and full sequences
    (width S = P + T) are both, so each key is padded on the side(s) its layout needs. Used where
    rollouts of different widths meet: DP ranks' outputs of one generate call, DAPO's rounds.
    """
    if len(batches) == 1:
        return batches[0]
    P = max(b[K.PROMPT_IDS].shape[1] for b in batches)
    T = max(b[K.RESPONSES].shape[1] for b in batches)
    out = {}
    for key in batches[0]:
        values = [b[key] for b in batches]
        if isinstance(values[0], torch.Tensor) and values[0].dim() == 2:
            padded = []
            for b, v in zip(batches, values):
                dp, dt = P - b[K.PROMPT_IDS].shape[1], T - b[K.RESPONSES].shape[1]
                left, right = (dp, dt) if key in SEQUENCE_KEYS else (dp, 0) if key in PROMPT_KEYS else (0, dt)
                v = torch.nn.functional.pad(v, (left, right))
                padded.append(v)
            out[key] = torch.cat(padded)
        elif key == K.ROUTED_EXPERTS:  # (B, S, L, k): a full sequence per row; -1 = no recorded expert
            out[key] = torch.cat([torch.nn.functional.pad(
                v, (0, 0, 0, 0, P - b[K.PROMPT_IDS].shape[1], T - b[K.RESPONSES].shape[1]), value=-1)
                for b, v in zip(batches, values)])
        elif isinstance(values[0], torch.Tensor) and values[0].dim() > 0:
            out[key] = torch.cat(values)
        elif isinstance(values[0], list):
            out[key] = [x for v in values for x in v]
        else:
            out[key] = values[-1]
    return out
