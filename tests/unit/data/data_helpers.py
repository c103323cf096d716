"""Helpers of the data tests: a small Qwen-style BPE tokenizer made locally (no downloads), jsonl writing."""

import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GSM8K_SLICE = os.path.join(REPO, "tests", "data", "gsm8k_slice", "train.jsonl")

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# the shape of Qwen2.5's chat template (system default, generation prompt), minus tools
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_qwen_like_tokenizer(out_dir: str, chat_template: bool = True, vocab_size: int = 600) -> str:
    """Train a byte-level BPE on the GSM8K slice with Qwen's special tokens; save it loadable by AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = []
    with open(GSM8K_SLICE) as f:
        for line in f:
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    texts.append("You are a helpful assistant. user assistant system")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if chat_template:
        fast.chat_template = QWEN_CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return out_dir


def write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)
