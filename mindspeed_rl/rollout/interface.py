"""What every rollout engine offers (the `RolloutEngine` protocol), how a request is described
(`SamplingParams`) and what comes back (`RolloutOutput`).

Engines (native.py: megatron-core with a KV cache; a vLLM engine later) take prompts as lists of
token ids, the form vLLM consumes; `prompts_from_batch` strips the loader's left padding. The
worker adds group_index and the prompt metadata to `RolloutOutput.to_batch()`.

Weights reach an engine as (HF name, tensor) pairs streamed in chunks, the same feed a vLLM
engine consumes, so the actor can sync any engine the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Protocol, Sequence

import torch

from mindspeed_rl.data import keys
from mindspeed_rl.utils.errors import UserInputError

FINISH_EOS = "eos"  # stopped on an EOS / stop token (included in the response)
FINISH_LENGTH = "length"  # hit max_new_tokens or the model's maximum length


@dataclass(frozen=True)
class SamplingParams:
    """How to generate. Checked on construction; bad values raise UserInputError.

    Attributes:
        n: samples per prompt (ray_gpt: n_samples_per_prompt); the n samples of a prompt are
            adjacent in the output.
        do_sample: sample (True) or greedy argmax (False).
        temperature: T > 0 when sampling (ignored by greedy). Log-probs are log_softmax(logits / T)
            over the full vocabulary (rollout/sampling.py), at T = 1 for greedy: `logprob_temperature`.
        top_p / top_k: nucleus mass (1.0 = off) / top-k (0 = off), sampling only.
        max_new_tokens: response length limit; None = up to the engine's maximum length.
        max_total_length: cap on prompt + response tokens per sequence (None = the engine's maximum).
        stop_token_ids: extra token ids that end a response like EOS (included in the response).
        ignore_eos: do not stop on the engine's EOS ids (benchmarks); stop_token_ids still stop.
        seed: seeds the sampler's torch.Generator: same seed, prompts and weights -> same output.
    """

    n: int = 1
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: Optional[int] = None
    max_total_length: Optional[int] = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: Optional[int] = None

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not isinstance(self.n, int) or self.n < 1:
            raise UserInputError(f"n_samples_per_prompt is {self.n}; set it to an integer >= 1.")
        if self.do_sample and not self.temperature > 0:
            raise UserInputError(
                f"temperature is {self.temperature} with do_sample=true; set temperature > 0, "
                "or do_sample=false for greedy decoding.")
        if not 0.0 < self.top_p <= 1.0:
            raise UserInputError(f"top_p is {self.top_p}; set it in (0, 1] (1.0 turns it off).")
        if self.top_k < 0:
            raise UserInputError(f"top_k is {self.top_k}; set it to 0 (off) or a positive integer.")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UserInputError(f"max_new_tokens is {self.max_new_tokens}; set it to >= 1 or null.")
        if self.max_total_length is not None and self.max_total_length < 2:
            raise UserInputError(f"max total length (seq_length) is {self.max_total_length}; set it to >= 2.")

    @property
    def logprob_temperature(self) -> float:
        """The T of the returned log-probs: `temperature` when sampling, 1.0 for greedy (the model's
        own distribution). The trainer must compute its log-probs at the same T."""
        return self.temperature if self.do_sample else 1.0

    @classmethod
    def from_ray_gpt(cls, n_samples_per_prompt: int = 1, do_sample: bool = True, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, max_new_tokens: Optional[int] = None,
                     seq_length: Optional[int] = None, seed: Optional[int] = None,
                     stop_token_ids: Sequence[int] = ()) -> "SamplingParams":
        """From the ray_gpt rollout keys (config.schema.RolloutConfig, training.seq_length / seed).
        Engine-level keys (use_kv_cache, num_samples_per_step, rollout_engine) go to the engine."""
        return cls(n=n_samples_per_prompt, do_sample=do_sample, temperature=temperature, top_p=top_p,
                   top_k=top_k, max_new_tokens=max_new_tokens, max_total_length=seq_length,
                   stop_token_ids=tuple(stop_token_ids), seed=seed)


@dataclass
class RolloutOutput:
    """Generated responses for B = len(prompts) * n sequences (the n samples of a prompt adjacent).

    Attributes:
        prompts: (B, P) prompt ids, left-padded with pad_token_id; prompt_mask (B, P) 1 on real tokens.
        responses: (B, T) response ids, right-padded with pad_token_id; T = longest response.
        response_mask: (B, T) 1 on generated tokens (the EOS / stop token included).
        log_probs: (B, T) float32 log-probs of the sampled tokens under log_softmax(logits / T); 0 on padding.
        finish_reason: list[str] (B,) "eos" or "length".
        prompt_length / response_length: (B,) real token counts.
        temperature: the T of log_probs.
        routed_experts: (B, P + T, L, k) int16 MoE experts of every token and layer (-1: padding /
            not run), when the engine records routing for replay (models/moe_replay.py); else None.
    """

    prompts: torch.Tensor
    prompt_mask: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    log_probs: torch.Tensor
    finish_reason: list[str]
    prompt_length: torch.Tensor
    response_length: torch.Tensor
    temperature: float = 1.0
    stats: dict[str, float] = field(default_factory=dict)
    routed_experts: Optional[torch.Tensor] = None

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.prompt_length.sum())

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_length.sum())

    def to_batch(self) -> dict:
        """The rollout keys of data/keys.py: prompt + response as one left/right-padded sequence."""
        input_ids = torch.cat([self.prompts, self.responses], dim=1)  # (B, S)
        attention_mask = torch.cat([self.prompt_mask, self.response_mask], dim=1).long()
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return {
            keys.PROMPT_IDS: self.prompts, keys.PROMPT_MASK: self.prompt_mask,
            keys.PROMPT_LENGTH: self.prompt_length,
            keys.INPUT_IDS: input_ids, keys.ATTENTION_MASK: attention_mask, keys.POSITION_IDS: position_ids,
            keys.RESPONSES: self.responses, keys.RESPONSE_MASK: self.response_mask,
            keys.RESPONSE_LENGTH: self.response_length, keys.ROLLOUT_LOG_PROBS: self.log_probs,
            keys.FINISH_REASON: list(self.finish_reason),
            **({keys.ROUTED_EXPERTS: self.routed_experts} if self.routed_experts is not None else {}),
        }


class RolloutEngine(Protocol):
    """A generation engine. One instance per rollout rank; all TP and PP ranks of a model replica call
    it together with the same prompts and sampling, and all of them return the same output."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> RolloutOutput:
        """Generate sampling.n responses for each prompt (a list of token ids, no padding)."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take new weights as (HF name, full tensor) pairs, possibly streamed in chunks."""

    def sleep(self) -> None:
        """Release cache memory (colocated with training: before the update)."""

    def wake_up(self) -> None:
        """Re-take what sleep() released (before the next generate)."""

    def close(self) -> None:
        """Release everything; the engine is unusable afterwards."""


def prompts_from_batch(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    """(B, P) left-padded ids + mask -> B lists of the real token ids."""
    return [row[m.bool()].tolist() for row, m in zip(prompt_ids, prompt_mask)]


def sampling_seed(run_seed: int, call: int, dp_rank: int) -> int:
    """The seed of one generate call: different on every DP rank and call, the same on the TP and PP
    ranks of one DP group (they must draw identical tokens)."""
    return run_seed + 7919 * call + 104729 * dp_rank


def generate_batch(engine: "RolloutEngine", prompts: dict, n: int, params: SamplingParams) -> dict:
    """n samples per prompt of a loader batch, as a trainer batch (RolloutOutput.to_batch) carrying
    the prompts' labels / source / extras and group index, each repeated n times."""
    with torch.no_grad():
        out = engine.generate(prompts_from_batch(prompts[keys.PROMPT_IDS], prompts[keys.PROMPT_MASK]), params)
    batch = out.to_batch()
    for key in (keys.LABELS, keys.SOURCE, keys.EXTRAS):
        if key in prompts:
            batch[key] = [v for v in prompts[key] for _ in range(n)]
    batch[keys.GROUP_INDEX] = prompts[keys.GROUP_INDEX].repeat_interleave(n)
    return batch


def check_prompts(prompts: Sequence[Sequence[int]], max_total: int, vocab_size: int) -> list[list[int]]:
    """Prompts as lists of ints, each non-empty, shorter than max_total and inside the vocabulary;
    one sentence (UserInputError) for the first that is not. Shared by every engine."""
    if len(prompts) == 0:
        raise UserInputError("generate got no prompts; pass at least one prompt.")
    rows = []
    for i, p in enumerate(prompts):
        p = [int(t) for t in p]
        if not p:
            raise UserInputError(f"prompt {i} is empty; drop empty prompts from the data or give it tokens.")
        if len(p) >= max_total:
            raise UserInputError(
                f"prompt {i} has {len(p)} tokens, which leaves no room to generate within the maximum "
                f"length {max_total}; lower max_prompt_length or raise seq_length / max_position_embeddings.")
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise UserInputError(f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {vocab_size}); "
                                 "check that the tokenizer matches the model.")
        rows.append(p)
    return rows
