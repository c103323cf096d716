"""Deterministic, resumable batching of a PromptDataset into left-padded prompt batches.

    loader = build_prompt_loader(data_path, tokenizer, batch_size=32, max_prompt_length=512)
    batch = next(loader)        # endless: epoch after epoch, reshuffled each epoch
    state = loader.state_dict() # {"epoch", "position", "consumed_samples", ...} -> checkpoint
    loader.load_state_dict(state)  # continue with exactly the batch that would have come next

The order of epoch e is permutation(seed, e) of the dataset (numpy's PCG64 seeded with
[seed, e]), so it depends only on (seed, epoch, dataset size): any process rebuilds it, and a
resumed run sees the same batches as an uninterrupted one. Training drops the last partial batch
of an epoch (every GRPO step has global_batch_size prompts); `iter_epoch()` (validation) walks
the whole dataset once in order, the last batch possibly smaller.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.data.prompt_dataset import PromptDataset, build_prompt_dataset
from mindspeed_rl.utils.errors import UserInputError


def collate_prompts(items: list[dict], pad_token_id: int) -> dict:
    """Left-pad prompts into a batch keyed by data/keys.py.

    Args:
        items: PromptDataset samples.
        pad_token_id: fills the left padding (masked out by PROMPT_MASK).

    Returns:
        {PROMPT_IDS: (B, P) int64, PROMPT_MASK: (B, P) int64, PROMPT_LENGTH: (B,) int64,
         LABELS: list[str] (B,), SOURCE: list[str] (B,), EXTRAS: list[dict] (B,)}, P = longest prompt.
    """
    lengths = [len(it["prompt_ids"]) for it in items]
    width = max(lengths)
    ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for i, (it, n) in enumerate(zip(items, lengths)):
        if n:
            ids[i, width - n:] = torch.as_tensor(it["prompt_ids"], dtype=torch.long)
            mask[i, width - n:] = 1
    return {
        K.PROMPT_IDS: ids,
        K.PROMPT_MASK: mask,
        K.PROMPT_LENGTH: torch.tensor(lengths, dtype=torch.long),
        K.LABELS: [it["label"] for it in items],
        K.SOURCE: [it["source"] for it in items],
        K.EXTRAS: [it["extras"] for it in items],
    }


class PromptLoader:
    """Endless iterator of prompt batches with seeded per-epoch shuffling and resumable state.

    drop_last=False only lifts the at-least-one-batch check (validation uses iter_epoch);
    the endless iterator always serves full batches.
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, pad_token_id: int, seed: int = 1234,
                 shuffle: bool = True, drop_last: bool = True, what: str = "data_path"):
        if batch_size < 1:
            raise UserInputError(f"batch size {batch_size} must be at least 1.")
        if drop_last and len(dataset) < batch_size:
            raise UserInputError(
                f"{what} has {len(dataset)} prompts (after filtering), fewer than one batch of {batch_size}; "
                "add data or lower the batch size."
            )
        self.dataset, self.batch_size, self.pad_token_id = dataset, batch_size, pad_token_id
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.position = 0, 0  # position: samples of this epoch's order already served
        self._order_epoch, self._order = None, None

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(N,) dataset indices in the order epoch `epoch` serves them."""
        if self._order_epoch != epoch:
            n = len(self.dataset)
            self._order = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                           else np.arange(n))
            self._order_epoch = epoch
        return self._order

    def __iter__(self) -> "PromptLoader":
        return self

    def __next__(self) -> dict:
        if len(self.dataset) < self.batch_size:
            raise UserInputError(
                f"the data has {len(self.dataset)} prompts, fewer than one training batch of {self.batch_size}; "
                "add data or lower the batch size."
            )
        if self.position + self.batch_size > len(self.dataset):
            self.epoch, self.position = self.epoch + 1, 0
        order = self.epoch_order(self.epoch)
        picked = order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return collate_prompts([self.dataset[int(i)] for i in picked], self.pad_token_id)

    def iter_epoch(self) -> Iterator[dict]:
        """One ordered pass over the whole dataset (validation); does not touch the training state."""
        for start in range(0, len(self.dataset), self.batch_size):
            stop = min(start + self.batch_size, len(self.dataset))
            yield collate_prompts([self.dataset[i] for i in range(start, stop)], self.pad_token_id)

    @property
    def consumed_samples(self) -> int:
        return self.epoch * self.steps_per_epoch * self.batch_size + self.position

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "consumed_samples": self.consumed_samples,
                "seed": self.seed, "dataset_size": len(self.dataset), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()`, or from {"consumed_samples": n} alone (a Megatron-style sample index).

        Raises:
            UserInputError: the checkpoint was made with a different dataset size (other data or filtering).
        """
        size = state.get("dataset_size")
        if size is not None and size != len(self.dataset):
            raise UserInputError(
                f"the data loader state was saved with {size} prompts but the data now has {len(self.dataset)}; "
                "resume with the same data_path, max_prompt_length and truncation."
            )
        if "epoch" in state and "position" in state:
            self.epoch, self.position = int(state["epoch"]), int(state["position"])
        else:
            per_epoch = self.steps_per_epoch * self.batch_size
            self.epoch, self.position = divmod(int(state["consumed_samples"]), per_epoch)
        if "seed" in state:
            self.seed = int(state["seed"])
        self._order_epoch = None


def build_prompt_loader(
    data_path: str,
    tokenizer,
    batch_size: int,
    max_prompt_length: int,
    truncation: str = "error",
    seed: int = 1234,
    shuffle: bool = True,
    drop_last: bool = True,
    prompt_type: Optional[str] = None,
    prompt_key: str = "prompt",
    label_key: Optional[str] = "labels",
    source: Optional[str] = None,
    what: str = "data_path",
    system_prompt: Optional[str] = None,
    instruction_template: Optional[str] = None,
    enable_thinking: Optional[bool] = None,
) -> PromptLoader:
    """PromptDataset + PromptLoader in one call (see build_prompt_dataset for the arguments).

    For validation pass shuffle=False, drop_last=False and iterate `loader.iter_epoch()`.
    """
    dataset = build_prompt_dataset(data_path, tokenizer, max_prompt_length, truncation, prompt_type,
                                   prompt_key, label_key, source, seed, what, system_prompt, instruction_template,
                                   enable_thinking)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return PromptLoader(dataset, batch_size, pad, seed, shuffle, drop_last, what)
