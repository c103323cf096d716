"""Chat templates: MindSpeed-LLM's piecewise encoding, defaults, and the hf chat_template."""

import pytest

from mindspeed_rl.data.templates import TEMPLATES, check_prompt_type, encode_conversation, encode_prompt
from mindspeed_rl.utils.errors import UserInputError

USER = [{"role": "user", "content": "How many clips?"}]


def test_qwen_prompt_uses_default_system_and_ends_with_assistant_header(qwen_tokenizer):
    ids = encode_prompt(qwen_tokenizer, "qwen", USER)
    assert qwen_tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHow many clips?<|im_end|>\n<|im_start|>assistant\n"
    )
    # piecewise: system block and user turn are encoded separately (MindSpeed-LLM's _encode)
    system = qwen_tokenizer.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", add_special_tokens=False)
    assert ids[: len(system)] == system


def test_given_system_replaces_default_and_chatml_has_none(qwen_tokenizer):
    text = qwen_tokenizer.decode(encode_prompt(qwen_tokenizer, "qwen", USER, system="Be brief."))
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert qwen_tokenizer.decode(encode_prompt(qwen_tokenizer, "chatml", USER)).startswith("<|im_start|>user\n")


def test_empty_template_is_the_text_and_r1_adds_its_instruction(qwen_tokenizer):
    assert qwen_tokenizer.decode(encode_prompt(qwen_tokenizer, None, USER)) == "How many clips?"
    assert qwen_tokenizer.decode(encode_prompt(qwen_tokenizer, "empty", USER)) == "How many clips?"
    r1 = qwen_tokenizer.decode(encode_prompt(qwen_tokenizer, "qwen_r1", USER))
    assert "<think> </think>" in r1 and r1.endswith("How many clips?<|im_end|>\n<|im_start|>assistant\n")


def test_multi_turn_sft_pairs_end_with_stop_word(qwen_tokenizer):
    messages = USER + [{"role": "assistant", "content": "72"}, {"role": "user", "content": "And May?"},
                       {"role": "assistant", "content": "24"}]
    pairs = encode_conversation(qwen_tokenizer, "qwen", messages)
    assert len(pairs) == 2
    assert qwen_tokenizer.decode(pairs[0][1]) == "72<|im_end|>"
    assert qwen_tokenizer.decode(pairs[1][0]) == "\n<|im_start|>user\nAnd May?<|im_end|>\n<|im_start|>assistant\n"


def test_hf_uses_the_tokenizers_chat_template(qwen_tokenizer):
    ids = encode_prompt(qwen_tokenizer, "hf", USER)
    expected = qwen_tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert qwen_tokenizer.decode(ids) == expected
    pairs = encode_conversation(qwen_tokenizer, "hf", USER + [{"role": "assistant", "content": "72"}])
    assert qwen_tokenizer.decode(pairs[0][0]) == expected
    assert qwen_tokenizer.decode(pairs[0][1]) == "72<|im_end|>\n"


def test_llama3_starts_with_bos(qwen_tokenizer):
    qwen_tokenizer_bos = qwen_tokenizer  # has no BOS: the template then adds nothing, as MindSpeed-LLM
    text = qwen_tokenizer_bos.decode(encode_prompt(qwen_tokenizer_bos, "llama3", USER))
    assert text.startswith("<|start_header_id|>user<|end_header_id|>\n\nHow many clips?")


def test_unknown_template_lists_valid_names():
    with pytest.raises(UserInputError, match="unknown --prompt-type 'qwen9'; valid: .*chatml.*qwen.*hf"):
        check_prompt_type("qwen9")
    assert "qwen" in TEMPLATES


def test_hf_without_chat_template_is_a_plain_error(tmp_path):
    from data_helpers import make_qwen_like_tokenizer

    from mindspeed_rl.data.tokenizer import load_tokenizer

    tok = load_tokenizer(make_qwen_like_tokenizer(str(tmp_path / "tok"), chat_template=False))
    with pytest.raises(UserInputError, match="needs the tokenizer's chat_template"):
        encode_prompt(tok, "hf", USER)
