"""preprocess_data round trips: raw rows -> indexed datasets -> PromptDataset -> the templated prompt and labels."""

import filecmp
import os

import pytest
from data_helpers import GSM8K_SLICE, write_jsonl

from mindspeed_rl.data.indexed import packed_keys
from mindspeed_rl.data.preprocess import preprocess
from mindspeed_rl.data.prompt_dataset import build_prompt_dataset

QWEN_PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
               "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
ALPACA = [
    {"instruction": "What is 2+3?", "input": "", "output": "5", "level": "easy"},
    {"instruction": "Add these:", "input": "40 and 2", "output": "42", "level": "hard"},
]
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "What is 2+3?"}, {"from": "gpt", "value": "5"}]},
    {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Add these:\n40 and 2"},
                       {"from": "gpt", "value": "42"}]},
]


def _roundtrip(tmp_path, tokenizer_dir, tokenizer, rows, handler, hf_cache, **kwargs):
    src = write_jsonl(tmp_path / "raw.jsonl", rows)
    prefix = str(tmp_path / "out" / "data")
    result = preprocess(src, tokenizer_dir, prefix, handler_name=handler, cache_dir=hf_cache, **kwargs)
    assert result.num_written == len(rows)
    data_path = result.outputs["text"] if handler == "GeneralPretrainHandler" else prefix
    ds = build_prompt_dataset(data_path, tokenizer, max_prompt_length=512)
    return result, [(tokenizer.decode(ds[i]["prompt_ids"]), ds[i]["label"], ds[i]["extras"]) for i in range(len(ds))]


@pytest.mark.parametrize("handler", ["AlpacaStyleInstructionHandler", "PPOAlpacaStyleInstructionHandler",
                                     "R1AlpacaStyleInstructionHandler"])
def test_alpaca_handlers_round_trip(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, hf_cache, handler):
    extra = {"dataset_additional_keys": ("labels", "level")} if handler.startswith("R1") else {}
    result, got = _roundtrip(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, ALPACA, handler, hf_cache,
                             prompt_type="qwen", **extra)
    keys = {"AlpacaStyleInstructionHandler": ["attention_mask", "input_ids", "labels"],
            "PPOAlpacaStyleInstructionHandler": ["attention_mask", "input_ids"],
            "R1AlpacaStyleInstructionHandler": ["attention_mask", "input_ids", "labels", "level"]}[handler]
    assert packed_keys(str(tmp_path / "out" / "data")) == keys
    assert [g[0] for g in got] == [QWEN_PROMPT.format("What is 2+3?"), QWEN_PROMPT.format("Add these:\n40 and 2")]
    # SFT data gives its answer back (without the stop word); prompt-only data has none
    labels = {"AlpacaStyleInstructionHandler": ["5", "42"],
              "PPOAlpacaStyleInstructionHandler": ["", ""],
              "R1AlpacaStyleInstructionHandler": ["5", "42"]}[handler]
    assert [g[1] for g in got] == labels
    if handler.startswith("R1"):
        assert [g[2] for g in got] == [{"level": "easy"}, {"level": "hard"}]


@pytest.mark.parametrize("handler", ["SharegptStyleInstructionHandler", "R1SharegptStyleInstructionHandler"])
def test_sharegpt_handlers_round_trip(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, hf_cache, handler):
    extra = {"dataset_additional_keys": ("labels",)} if handler.startswith("R1") else {}
    _, got = _roundtrip(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, SHAREGPT, handler, hf_cache,
                        prompt_type="qwen", **extra)
    assert got[0][0] == QWEN_PROMPT.format("What is 2+3?")
    assert got[1][0] == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                         "<|im_start|>user\nAdd these:\n40 and 2<|im_end|>\n<|im_start|>assistant\n")
    assert [g[1] for g in got] == ["5", "42"]


def test_pretrain_handler_writes_text_document(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, hf_cache):
    rows = [{"text": "Natalia sold clips."}, {"text": "Weng earns $12 an hour."}]
    result, got = _roundtrip(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, rows, "GeneralPretrainHandler", hf_cache,
                             append_eod=True)
    assert result.outputs == {"text": str(tmp_path / "out" / "data_text_document")}
    assert [g[0] for g in got] == ["Natalia sold clips.<|im_end|>", "Weng earns $12 an hour.<|im_end|>"]


def test_hf_template_and_raw_file_agree(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, hf_cache):
    """The indexed path and the raw-file path give the same prompt ids for the same template."""
    src = write_jsonl(tmp_path / "raw.jsonl", [{"prompt": r["instruction"], "labels": r["output"]} for r in ALPACA])
    prefix = str(tmp_path / "data")
    preprocess(src, qwen_tokenizer_dir, prefix, handler_name="R1AlpacaStyleInstructionHandler", prompt_type="hf",
               map_keys={"prompt": "prompt", "query": "", "response": "labels"},
               dataset_additional_keys=("labels",), cache_dir=hf_cache)
    indexed = build_prompt_dataset(prefix, qwen_tokenizer, 512)
    raw = build_prompt_dataset(src, qwen_tokenizer, 512, prompt_type="hf")
    for i in range(2):
        assert indexed[i]["prompt_ids"].tolist() == raw[i]["prompt_ids"].tolist()
        assert indexed[i]["label"] == raw[i]["label"] == ALPACA[i]["output"]
    assert indexed[0]["source"] == "data" and raw[0]["source"] == "raw"


def _gsm8k(tmp_path, tokenizer_dir, hf_cache, name, **kwargs):
    prefix = str(tmp_path / name / "train")
    return preprocess(
        GSM8K_SLICE, tokenizer_dir, prefix, handler_name="R1AlpacaStyleInstructionHandler", prompt_type="qwen",
        map_keys={"prompt": "question", "query": "", "response": "answer"}, dataset_additional_keys=("labels",),
        label_pattern=r"####\s*(.+)$", cache_dir=hf_cache, log_interval=0, **kwargs)


def test_gsm8k_end_to_end(tmp_path, qwen_tokenizer_dir, qwen_tokenizer, hf_cache):
    result = _gsm8k(tmp_path, qwen_tokenizer_dir, hf_cache, "one")
    assert result.num_written == 200
    ds = build_prompt_dataset(str(tmp_path / "one" / "train"), qwen_tokenizer, max_prompt_length=1024)
    first = ds[0]
    assert qwen_tokenizer.decode(first["prompt_ids"]) == QWEN_PROMPT.format(
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?")
    labels = [ds[i]["label"] for i in range(len(ds))]
    assert labels[:2] == ["72", "10"] and "1,080" in labels and "-12" in labels


def test_workers_and_subsets_give_identical_bytes(tmp_path, qwen_tokenizer_dir, hf_cache):
    one = _gsm8k(tmp_path, qwen_tokenizer_dir, hf_cache, "w1", workers=1)
    two = _gsm8k(tmp_path, qwen_tokenizer_dir, hf_cache, "w2", workers=2, n_subs=2)
    three = _gsm8k(tmp_path, qwen_tokenizer_dir, hf_cache, "w2s3", workers=2, n_subs=3)
    for key, prefix in one.outputs.items():
        for other in (two, three):
            for ext in (".bin", ".idx"):
                assert filecmp.cmp(prefix + ext, other.outputs[key] + ext, shallow=False), (key, ext)
    # staging directories are gone
    assert not [n for n in os.listdir(tmp_path / "w2") if n.startswith(".")]


def test_seq_length_drops_long_samples(tmp_path, qwen_tokenizer_dir, hf_cache):
    full = _gsm8k(tmp_path, qwen_tokenizer_dir, hf_cache, "full")
    short = _gsm8k(tmp_path, qwen_tokenizer_dir, hf_cache, "short", seq_length=90)
    assert 0 < short.num_written < full.num_written and short.num_skipped == 200 - short.num_written


def test_mindspeed_llm_written_data_loads(tmp_path, qwen_tokenizer):
    """Files written the way MindSpeed-LLM writes them (add_item + end_document, int32) load here."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prompt = qwen_tokenizer.encode(QWEN_PROMPT.format("What is 2+3?"), add_special_tokens=False)
    label = qwen_tokenizer.encode("5", add_special_tokens=False)
    prefix = str(tmp_path / "ms")
    for key, ids in (("input_ids", prompt), ("attention_mask", [1] * len(prompt)), ("labels", label)):
        builder = IndexedDatasetBuilder(f"{prefix}_packed_{key}_document.bin")
        builder.add_item(torch.IntTensor(ids))
        builder.end_document()
        builder.finalize(f"{prefix}_packed_{key}_document.idx")
    ds = build_prompt_dataset(prefix, qwen_tokenizer, 512)
    assert ds[0]["prompt_ids"].tolist() == prompt and ds[0]["label"] == "5"


def test_gsm8k_raw_file_needs_no_preprocessing(qwen_tokenizer):
    ds = build_prompt_dataset(GSM8K_SLICE, qwen_tokenizer, 1024, prompt_type="qwen", prompt_key="question",
                              label_key="answer")
    assert len(ds) == 200 and ds[0]["label"].endswith("#### 72") and ds[0]["source"] == "train"
    assert qwen_tokenizer.decode(ds[0]["prompt_ids"]).startswith(QWEN_PROMPT.format("Natalia sold clips")[:60])
