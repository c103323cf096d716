"""Chat templates (`--prompt-type`, `prompt_type`): messages -> prompt token ids.

The named templates reproduce MindSpeed-LLM's configs/finetune/templates.json entries of the same
name (LlamaFactory 0.8.2 semantics), token for token: each piece (BOS, system block, user turn,
separator, assistant turn) is encoded on its own with `add_special_tokens=False` and the pieces
are concatenated, and a template with a default system prompt uses it when the sample has none.
So a prompt preprocessed here equals the one MindSpeed-LLM makes for the same --prompt-type.

`hf` renders the tokenizer's own `chat_template` (`apply_chat_template`) instead.

Thinking (`enable_thinking`, MindSpeed-LLM's `--enable-thinking`; Qwen3-style reasoning models):
- `qwen3` is MindSpeed-LLM's ReasoningTemplate: unless enable_thinking is true, the generation
  prompt ends with an empty thought (THOUGHT: "<think>\n\n</think>\n\n"), so the model answers
  without reasoning, as Qwen3's own chat template does for enable_thinking=False; earlier
  assistant turns lose their thoughts. In supervised pairs the empty thought goes to the source
  (not learned) when thinking is off and to the target when it is on; false also removes the
  thoughts from every assistant turn. None behaves as false there, as in MindSpeed-LLM.
- `hf` passes enable_thinking to the tokenizer's chat template when it is set (None: the
  template's own default, thinking on for Qwen3); a template without that switch is refused
  rather than silently ignoring it.

Prompt shaping for raw data (`system_prompt`, `instruction_template`): raw prompts (a question, a
problem) rarely say how to answer, and a small model needs to be told ("put the final answer
after ####"). `shape_messages` wraps the last user message in the instruction template (its
PROMPT placeholder is replaced by the text) and supplies a system prompt where the sample has
none, before the chat template renders the conversation; the data files stay as they are.

Differences from MindSpeed-LLM: tool calls and observation turns are not supported (RL prompts
here are question -> answer); only the templates below exist (add one to TEMPLATES when needed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from mindspeed_rl.utils.errors import UserInputError

CONTENT = "{content}"  # placeholder in the format strings (str.replace, so "{" in data is safe)
PROMPT = "{prompt}"  # placeholder of instruction_template (str.replace as well)
HF = "hf"  # the tokenizer's own chat template


@dataclass(frozen=True)
class ChatTemplate:
    """One chat format. Format strings contain CONTENT where the message text goes.

    Attributes:
        user: a user turn, ending with the assistant header (the generation prompt).
        system: the system block, placed before the first user turn.
        assistant: an assistant turn's text (its end-of-turn token is `stop`).
        separator: put between an assistant turn and the next user turn.
        default_system: the system prompt used when a sample has none ("" = no system block).
        bos: start the conversation with the tokenizer's BOS token.
        stop: the end-of-turn token text appended to assistant turns (None: nothing, as
            MindSpeed-LLM's "empty"; pass --append-eod to end documents with EOS).
        reasoning: enable_thinking applies (MindSpeed-LLM's ReasoningTemplate; module docstring).
    """

    user: str
    system: str = CONTENT
    assistant: str = CONTENT
    separator: str = ""
    default_system: str = ""
    bos: bool = False
    stop: Optional[str] = None
    reasoning: bool = False


THOUGHT = ("<think>\n", "\n</think>\n\n")  # MindSpeed-LLM's (LlamaFactory's) thought_words
_THOUGHT_RE = re.compile(re.escape(THOUGHT[0]) + "(.*?)" + re.escape(THOUGHT[1]), re.DOTALL)
_IM_USER = "<|im_start|>user\n" + CONTENT + "<|im_end|>\n<|im_start|>assistant\n"
_IM_SYSTEM = "<|im_start|>system\n" + CONTENT + "<|im_end|>\n"
_R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>. "
    "Put your final answer within \\boxed{}.\n"
)

TEMPLATES: dict[str, ChatTemplate] = {
    # the prompt text as it is (the tiny task, base models, already-templated data)
    "empty": ChatTemplate(user=CONTENT),
    "qwen": ChatTemplate(
        user=_IM_USER, system=_IM_SYSTEM, separator="\n",
        default_system="You are a helpful assistant.", stop="<|im_end|>",
    ),
    "qwen_r1": ChatTemplate(
        user="<|im_start|>user\n" + _R1_INSTRUCTION + CONTENT + "<|im_end|>\n<|im_start|>assistant\n",
        system=_IM_SYSTEM, separator="\n", default_system="You are a helpful assistant.", stop="<|im_end|>",
    ),
    "qwen_math_r1": ChatTemplate(
        user=_IM_USER, system=_IM_SYSTEM, separator="\n",
        default_system="Please reason step by step, and put your final answer within \\boxed{}.",
        stop="<|im_end|>",
    ),
    "chatml": ChatTemplate(user=_IM_USER, system=_IM_SYSTEM, separator="\n", stop="<|im_end|>"),
    # Qwen3 (and its MoE): ChatML without a default system prompt, with the thinking switch
    "qwen3": ChatTemplate(user=_IM_USER, system=_IM_SYSTEM, separator="\n", stop="<|im_end|>", reasoning=True),
    "llama3": ChatTemplate(
        user="<|start_header_id|>user<|end_header_id|>\n\n" + CONTENT
        + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        system="<|start_header_id|>system<|end_header_id|>\n\n" + CONTENT + "<|eot_id|>",
        bos=True, stop="<|eot_id|>",
    ),
}


def check_prompt_type(name: Optional[str], what: str = "--prompt-type") -> None:
    """Raise UserInputError unless `name` is None, "hf" or a key of TEMPLATES."""
    if name is not None and name != HF and name not in TEMPLATES:
        valid = ", ".join(sorted(TEMPLATES) + [HF])
        raise UserInputError(f"unknown {what} {name!r}; valid: {valid}.")


def thinking_problem(prompt_type: Optional[str], enable_thinking: Optional[bool], type_key: str = "prompt_type",
                     key: str = "enable_thinking") -> Optional[str]:
    """One sentence when enable_thinking is set for a template without a thinking switch, or None
    (the keys as the caller's users name them: config keys or preprocess_data.py's flags)."""
    if enable_thinking is None or prompt_type == HF or TEMPLATES.get(prompt_type or "empty", TEMPLATES["empty"]).reasoning:
        return None
    switches = ", ".join(sorted(n for n, t in TEMPLATES.items() if t.reasoning) + [HF])
    which = f"{type_key} {prompt_type!r}" if prompt_type else f"{type_key} is not set: the text as it is"
    return f"{key} is set, but {which} has no thinking switch; use a {type_key} that has one ({switches}) or remove {key}."


def shaping_problem(prompt_type: Optional[str], system_prompt: Optional[str],
                    instruction_template: Optional[str], enable_thinking: Optional[bool] = None) -> Optional[str]:
    """One sentence on what is wrong with the prompt-shaping keys, or None."""
    thinking = thinking_problem(prompt_type, enable_thinking)
    if thinking:
        return thinking
    if instruction_template is not None and PROMPT not in instruction_template:
        return (f"instruction_template {instruction_template!r} has no {PROMPT} placeholder; write where the "
                f"prompt goes, e.g. '{PROMPT}\\nPut the final answer after ####.'")
    if system_prompt and prompt_type in (None, "empty"):
        return ("system_prompt needs a chat template to place it: set prompt_type (hf = the tokenizer's own "
                f"chat template, or one of {', '.join(sorted(t for t in TEMPLATES if t != 'empty'))}).")
    return None


def shape_messages(messages: list[dict], system: str, system_prompt: Optional[str] = None,
                   instruction_template: Optional[str] = None) -> tuple[list[dict], str]:
    """(messages, system) with the instruction template around the last user message and the
    system prompt where the sample brings none (a sample's own system message wins)."""
    if instruction_template is not None:
        last = dict(messages[-1], content=instruction_template.replace(PROMPT, messages[-1]["content"]))
        messages = list(messages[:-1]) + [last]
    return messages, system or (system_prompt or "")


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) if text else []


def _hf_messages(messages: list[dict], system: str) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + list(messages)


def remove_thought(content: str) -> str:
    """An assistant message without its <think>...</think> block (MindSpeed-LLM's remove_thought)."""
    return _THOUGHT_RE.sub("", content).lstrip("\n")


def _without_thoughts(messages: list[dict]) -> list[dict]:
    """The messages with every assistant turn's thought removed (the samples are not modified)."""
    return [dict(m, content=remove_thought(m["content"])) if m["role"] == "assistant" else m for m in messages]


def _has_thought(content: str) -> bool:
    return THOUGHT[0] in content or THOUGHT[1] in content


def _hf_kwargs(tokenizer, enable_thinking: Optional[bool]) -> dict:
    """apply_chat_template's keyword for the thinking switch; refused where the template has none."""
    if enable_thinking is None:
        return {}
    if "enable_thinking" not in str(tokenizer.chat_template):
        raise UserInputError(
            f"enable_thinking is set, but the chat template of {tokenizer.name_or_path!r} has no enable_thinking "
            "switch (it decides by itself whether the model thinks); remove enable_thinking."
        )
    return {"enable_thinking": bool(enable_thinking)}


def _check_hf(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise UserInputError(
            f"prompt type 'hf' needs the tokenizer's chat_template, and {tokenizer.name_or_path!r} has none; "
            f"pick a named template ({', '.join(sorted(TEMPLATES))})."
        )


def encode_turns(tokenizer, prompt_type: Optional[str], messages: list[dict], system: str = "") -> list[list[int]]:
    """Token ids of each message of a conversation, templated (MindSpeed-LLM's `_encode`).

    Args:
        tokenizer: a `transformers` tokenizer.
        prompt_type: a key of TEMPLATES, or None (= "empty"). Not "hf" (use `encode_prompt`).
        messages: [{"role": "user"|"assistant", "content": str}, ...] alternating, user first.
        system: the system prompt ("" = the template's default).

    Returns:
        One id list per message. A user message's ids end with the assistant header, an
        assistant message's ids end with the template's end-of-turn token.
    """
    template = TEMPLATES[prompt_type or "empty"]
    system = system or template.default_system
    turns = []
    for i, message in enumerate(messages):
        ids: list[int] = []
        if i == 0:
            if template.bos and tokenizer.bos_token_id is not None:
                ids.append(tokenizer.bos_token_id)
            if system:
                ids += _encode(tokenizer, template.system.replace(CONTENT, system))
        elif message["role"] == "user":
            ids += _encode(tokenizer, template.separator)
        if message["role"] == "user":
            ids += _encode(tokenizer, template.user.replace(CONTENT, message["content"]))
        elif message["role"] == "assistant":
            ids += _encode(tokenizer, template.assistant.replace(CONTENT, message["content"]))
            ids += stop_ids(tokenizer, prompt_type)
        else:
            raise UserInputError(f"message role {message['role']!r} is not supported; use user or assistant.")
        turns.append(ids)
    return turns


def stop_ids(tokenizer, prompt_type: Optional[str]) -> list[int]:
    """The end-of-turn token ids a named template appends to assistant turns ([] for "empty")."""
    template = TEMPLATES[prompt_type or "empty"]
    return _encode(tokenizer, template.stop) if template.stop else []


def encode_prompt(tokenizer, prompt_type: Optional[str], messages: list[dict], system: str = "",
                  enable_thinking: Optional[bool] = None) -> list[int]:
    """Token ids of the generation prompt: the conversation so far, ending with the assistant header.

    Args:
        tokenizer: a `transformers` tokenizer.
        prompt_type: a key of TEMPLATES, "hf" (the tokenizer's chat_template) or None (= "empty").
        messages: the conversation, ending with a user message.
        system: the system prompt ("" = the template's default).
        enable_thinking: the thinking switch of a reasoning template or of the chat template (module
            docstring); None = the template's default.

    Returns:
        list[int] (P,) prompt token ids.
    """
    if prompt_type == HF:
        _check_hf(tokenizer)
        text = tokenizer.apply_chat_template(_hf_messages(messages, system), tokenize=False, add_generation_prompt=True,
                                             **_hf_kwargs(tokenizer, enable_thinking))
        return _encode(tokenizer, text)
    reasoning = TEMPLATES[prompt_type or "empty"].reasoning
    if reasoning:  # earlier answers without their thoughts
        messages = _without_thoughts(messages)
    ids = [t for turn in encode_turns(tokenizer, prompt_type, messages, system) for t in turn]
    if reasoning and not enable_thinking:  # an empty thought: the model answers at once
        ids += _encode(tokenizer, THOUGHT[0] + THOUGHT[1])
    return ids


def encode_conversation(
    tokenizer, prompt_type: Optional[str], messages: list[dict], system: str = "",
    enable_thinking: Optional[bool] = None,
) -> list[tuple[list[int], list[int]]]:
    """(source, target) id pairs of a conversation for supervised data (one pair per exchange).

    Args:
        messages: alternating user/assistant messages, ending with an assistant message.
        enable_thinking: as in encode_prompt; a reasoning template adds an empty thought to each
            answer without one, in the source when thinking is off, in the target when on.

    Returns:
        [(source_ids, target_ids), ...]: source = templated user turn (with the system block and
        BOS on the first), target = assistant text + end-of-turn token.
    """
    if prompt_type == HF:
        # the chat template renders whole conversations: cut it at each generation prompt
        _check_hf(tokenizer)
        pairs, done = [], []
        for k in range(0, len(messages), 2):
            prompt = encode_prompt(tokenizer, HF, messages[: k + 1], system, enable_thinking)
            full = _encode(tokenizer, tokenizer.apply_chat_template(
                _hf_messages(messages[: k + 2], system), tokenize=False, **_hf_kwargs(tokenizer, enable_thinking)))
            pairs.append((prompt[len(done):], full[len(prompt):]))
            done = full
        return pairs
    reasoning = TEMPLATES[prompt_type or "empty"].reasoning
    if reasoning and enable_thinking is False:
        messages = _without_thoughts(messages)
    turns = encode_turns(tokenizer, prompt_type, messages, system)
    pairs = [(turns[k], turns[k + 1]) for k in range(0, len(turns) - 1, 2)]
    if reasoning:  # MindSpeed-LLM's ReasoningTemplate.encode_multiturn
        empty = _encode(tokenizer, THOUGHT[0] + THOUGHT[1])
        pairs = [(source, target) if _has_thought(messages[2 * k + 1]["content"])
                 else (source + empty, target) if not enable_thinking else (source, empty + target)
                 for k, (source, target) in enumerate(pairs)]
    return pairs
