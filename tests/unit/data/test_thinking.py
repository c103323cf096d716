"""enable_thinking: the thinking switch of Qwen3-style reasoning models, in the named `qwen3` template
(MindSpeed-LLM's ReasoningTemplate) and passed to the tokenizer's own chat template (`hf`)."""

import pytest
from data_helpers import write_jsonl

import preprocess_data
import ray_gpt
from mindspeed_rl.data.preprocess import preprocess
from mindspeed_rl.data.prompt_dataset import build_prompt_dataset
from mindspeed_rl.data.templates import encode_conversation, encode_prompt, remove_thought
from mindspeed_rl.utils.errors import UserInputError

EMPTY = "<think>\n\n</think>\n\n"
USER = [{"role": "user", "content": "What is 2+3?"}]
TURNS = [{"role": "user", "content": "What is 2+3?"},
         {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n5"},
         {"role": "user", "content": "And 4+4?"}]
# the shape of Qwen3's chat template: no default system, earlier answers without their reasoning,
# and the empty thought after the generation prompt when enable_thinking is false
QWEN3_LIKE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "<|im_start|>assistant\n{{ content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.fixture
def qwen3_tokenizer(qwen_tokenizer_dir):
    from mindspeed_rl.data.tokenizer import load_tokenizer

    tok = load_tokenizer(qwen_tokenizer_dir)
    tok.chat_template = QWEN3_LIKE
    return tok


def _text(tok, ids):
    return tok.decode(ids)


@pytest.mark.parametrize("enable_thinking", [None, False, True])
def test_qwen3_prompt_ends_with_an_empty_thought_unless_thinking(qwen_tokenizer, enable_thinking):
    text = _text(qwen_tokenizer, encode_prompt(qwen_tokenizer, "qwen3", USER, enable_thinking=enable_thinking))
    header = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"  # no default system prompt
    assert text == header + ("" if enable_thinking else EMPTY)


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_qwen3_template_renders_what_the_chat_template_renders(qwen3_tokenizer, enable_thinking):
    """The named template (MindSpeed-LLM's) and Qwen3's own chat template agree, earlier thoughts removed."""
    for messages in (USER, TURNS):
        named = _text(qwen3_tokenizer, encode_prompt(qwen3_tokenizer, "qwen3", messages, enable_thinking=enable_thinking))
        hf = _text(qwen3_tokenizer, encode_prompt(qwen3_tokenizer, "hf", messages, enable_thinking=enable_thinking))
        assert named == hf
    assert "add them" not in named and named.endswith("<|im_start|>assistant\n" + ("" if enable_thinking else EMPTY))


def test_hf_without_the_switch_is_refused_and_none_keeps_the_templates_default(qwen_tokenizer, qwen3_tokenizer):
    with pytest.raises(UserInputError, match="enable_thinking is set, but the chat template of .* has no "
                                             "enable_thinking switch .*; remove enable_thinking"):
        encode_prompt(qwen_tokenizer, "hf", USER, enable_thinking=False)
    # None: the template's own default (Qwen3's: thinking), nothing passed
    assert _text(qwen3_tokenizer, encode_prompt(qwen3_tokenizer, "hf", USER)).endswith("<|im_start|>assistant\n")
    assert encode_prompt(qwen_tokenizer, "hf", USER) == encode_prompt(qwen_tokenizer, "hf", USER, enable_thinking=None)


def test_qwen3_supervised_pairs_put_the_empty_thought_where_mindspeed_llm_does(qwen_tokenizer):
    conv = USER + [{"role": "assistant", "content": "5"}]
    (src_off, tgt_off), = encode_conversation(qwen_tokenizer, "qwen3", conv, enable_thinking=False)
    (src_on, tgt_on), = encode_conversation(qwen_tokenizer, "qwen3", conv, enable_thinking=True)
    assert _text(qwen_tokenizer, src_off).endswith("assistant\n" + EMPTY) and _text(qwen_tokenizer, tgt_off) == "5<|im_end|>"
    assert _text(qwen_tokenizer, src_on).endswith("assistant\n") and _text(qwen_tokenizer, tgt_on) == EMPTY + "5<|im_end|>"
    thought = USER + [{"role": "assistant", "content": "<think>\nadd\n</think>\n\n5"}]
    (_, kept), = encode_conversation(qwen_tokenizer, "qwen3", thought, enable_thinking=True)
    assert _text(qwen_tokenizer, kept) == "<think>\nadd\n</think>\n\n5<|im_end|>"  # learned as written
    (src, cut), = encode_conversation(qwen_tokenizer, "qwen3", thought, enable_thinking=False)
    assert _text(qwen_tokenizer, cut) == "5<|im_end|>" and _text(qwen_tokenizer, src).endswith(EMPTY)
    assert remove_thought("<think>\na\nb\n</think>\n\nx <think>\ny\n</think>\n\nz") == "x z"


def test_a_template_without_the_switch_is_one_sentence(tmp_path, qwen_tokenizer, capsys):
    raw = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "What is 2+3?", "labels": "5"}])
    with pytest.raises(UserInputError, match="enable_thinking is set, but prompt_type 'qwen' has no thinking switch; "
                                             "use a prompt_type that has one \\(qwen3, hf\\) or remove enable_thinking"):
        build_prompt_dataset(raw, qwen_tokenizer, 256, prompt_type="qwen", enable_thinking=False)
    with pytest.raises(UserInputError, match="is a preprocessed \\(indexed\\) dataset.*enable_thinking"):
        build_prompt_dataset(str(tmp_path / "gsm8k"), qwen_tokenizer, 256, prompt_type="qwen3", enable_thinking=True)
    code = ray_gpt.main(["--config-name", "grpo_trainer_tiny", "dry_run=true",
                         "actor_rollout_ref.actor_rollout.enable_thinking=false"])
    err = capsys.readouterr().err
    assert code == 2 and "enable_thinking is set, but prompt_type is not set: the text as it is has no thinking switch" in err, err
    assert "Traceback" not in err


def test_raw_file_and_preprocess_data_give_the_same_prompt(tmp_path, qwen_tokenizer_dir, qwen_tokenizer):
    raw = write_jsonl(tmp_path / "q.jsonl", [{"prompt": "What is 2+3?", "labels": "5"}])
    ds = build_prompt_dataset(raw, qwen_tokenizer, 256, prompt_type="qwen3", enable_thinking=False)
    args = preprocess_data.parse_args(["--input", raw, "--tokenizer-name-or-path", qwen_tokenizer_dir,
                                       "--output-prefix", str(tmp_path / "out" / "q"), "--prompt-type", "qwen3",
                                       "--handler-name", "R1AlpacaStyleInstructionHandler",
                                       "--map-keys", '{"prompt": "prompt", "response": "labels"}',
                                       "--dataset-additional-keys", "labels", "--enable-thinking", "False"])
    assert args.enable_thinking is False
    preprocess(raw, qwen_tokenizer_dir, str(tmp_path / "out" / "q"), handler_name=args.handler_name,
               map_keys=args.map_keys, prompt_type="qwen3", enable_thinking=args.enable_thinking,
               dataset_additional_keys=("labels",), cache_dir=str(tmp_path / "cache"))
    indexed = build_prompt_dataset(str(tmp_path / "out" / "q"), qwen_tokenizer, 256)
    assert list(indexed[0]["prompt_ids"]) == list(ds[0]["prompt_ids"])
    assert _text(qwen_tokenizer, ds[0]["prompt_ids"]).endswith(EMPTY)
    with pytest.raises(UserInputError, match="--enable-thinking is set, but --prompt-type 'qwen' has no thinking switch"):
        preprocess(raw, str(tmp_path / "no_tokenizer_needed"), str(tmp_path / "x"), prompt_type="qwen",
                   enable_thinking=True)
    with pytest.raises(SystemExit):
        preprocess_data.parse_args(["--input", raw, "--tokenizer-name-or-path", qwen_tokenizer_dir,
                                    "--output-prefix", "x", "--enable-thinking", "maybe"])
