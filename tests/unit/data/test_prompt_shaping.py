"""Prompt shaping for raw data: system_prompt and instruction_template around each raw prompt,
rendered by a named template or the tokenizer's chat template; bad combinations are one sentence."""

import pytest
from data_helpers import write_jsonl

import ray_gpt
from mindspeed_rl.data.prompt_dataset import build_prompt_dataset
from mindspeed_rl.data.templates import shape_messages
from mindspeed_rl.utils.errors import UserInputError

INSTR = "{prompt}\nPut the final answer after ####."


@pytest.fixture
def raw(tmp_path):
    return write_jsonl(tmp_path / "q.jsonl", [
        {"prompt": "What is 2+3?", "labels": "5"},
        {"prompt": [{"role": "system", "content": "Own system."}, {"role": "user", "content": "What is 4+4?"}],
         "labels": "8"},
    ])


def test_shape_messages_wraps_the_last_user_turn_and_keeps_a_samples_own_system():
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "{x}"}]
    out, system = shape_messages(msgs, "", "Sys.", "Q: {prompt} A:")
    assert [m["content"] for m in out] == ["a", "b", "Q: {x} A:"] and system == "Sys."
    assert msgs[-1]["content"] == "{x}"  # the sample is not modified
    assert shape_messages(msgs, "Own.", "Sys.", None) == (msgs, "Own.")


@pytest.mark.parametrize("prompt_type", ["qwen", "hf"])
def test_named_and_hf_templates_place_system_prompt_and_instruction(raw, qwen_tokenizer, prompt_type):
    ds = build_prompt_dataset(raw, qwen_tokenizer, 256, prompt_type=prompt_type, system_prompt="Be brief.",
                              instruction_template=INSTR)
    texts = sorted(qwen_tokenizer.decode(ds[i]["prompt_ids"]) for i in range(len(ds)))
    assert texts == sorted([
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?\nPut the final answer after "
        "####.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nOwn system.<|im_end|>\n<|im_start|>user\nWhat is 4+4?\nPut the final answer after "
        "####.<|im_end|>\n<|im_start|>assistant\n",
    ])


def test_instruction_without_chat_template_is_plain_text(tmp_path, qwen_tokenizer):
    raw = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "What is 2+3?", "labels": "5"}])
    ds = build_prompt_dataset(raw, qwen_tokenizer, 256, instruction_template="Q: {prompt}\nA:")
    assert qwen_tokenizer.decode(ds[0]["prompt_ids"]) == "Q: What is 2+3?\nA:"


@pytest.mark.parametrize("kw,match", [
    (dict(instruction_template="Answer after ####."), r"instruction_template 'Answer after ####.' has no \{prompt\}"),
    (dict(system_prompt="Be brief."), r"system_prompt needs a chat template to place it: set prompt_type \(hf"),
])
def test_bad_shaping_is_one_sentence(raw, qwen_tokenizer, kw, match):
    with pytest.raises(UserInputError, match=match):
        build_prompt_dataset(raw, qwen_tokenizer, 256, **kw)


def test_bad_shaping_fails_in_dry_run(capsys):
    code = ray_gpt.main(["--config-name", "grpo_trainer_tiny", "dry_run=true",
                         "actor_rollout_ref.actor_rollout.instruction_template=no placeholder"])
    err = capsys.readouterr().err
    assert code == 2 and "has no {prompt} placeholder" in err and "Traceback" not in err, err


def test_indexed_data_cannot_be_shaped(qwen_tokenizer, tmp_path):
    prefix = str(tmp_path / "gsm8k")  # an indexed-dataset prefix (preprocess_data.py output): ids already
    with pytest.raises(UserInputError, match="is a preprocessed \\(indexed\\) dataset"):
        build_prompt_dataset(prefix, qwen_tokenizer, 256, instruction_template=INSTR)
