"""Data: tokenizer loading, chat templates, preprocessing handlers, prompt datasets, batch keys.

    keys.py            the one spelling of every batch key
    tokenizer.py       load_tokenizer(path): a local HF tokenizer, or one plain error
    templates.py       chat templates (qwen, qwen_r1, llama3, chatml, ..., hf) -> prompt ids
    raw.py             raw files (jsonl/json/parquet/csv/txt, file/glob/dir) via `datasets`
    formats.py         alpaca / sharegpt rows + --map-keys -> one conversation shape
    handlers.py        MindSpeed-LLM handler names -> token sequences per output key
    indexed.py         megatron-core .bin/.idx: atomic writing, prefix lookup
    preprocess.py      the pipeline behind preprocess_data.py (workers, shards, merge)
    prompt_dataset.py  the trainer's prompts + ground truth, from indexed prefixes, blends or raw files
    loader.py          seeded, epoch-aware, resumable batches of left-padded prompts
    tiny_task.py       the built-in tiny task's tokenizer and data (shipped under assets/tiny_task)

Import from the submodules (`from mindspeed_rl.data.loader import build_prompt_loader`): this
package imports nothing, so `mindspeed_rl.data.tiny_task` or `keys` cost no torch import, and
transformers, datasets and megatron-core are imported only by the functions that need them.
How-to: README.md in this folder.
"""
