"""Loading a Hugging Face tokenizer from a local directory, with plain-words errors.

Only `PretrainedFromHF` tokenizers exist here (MindSpeed-LLM's other tokenizer types are for
pre-training BERT/GPT-2 vocab files and are not used by RL). Nothing is downloaded: the path
must be a directory holding tokenizer.json and/or tokenizer_config.json (+ vocab files).
"""

from __future__ import annotations

import os

from mindspeed_rl.utils.errors import UserInputError

# any one of these marks a directory as a Hugging Face tokenizer
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | os.PathLike, what: str = "tokenizer_name_or_path", trust_remote_code: bool = False,
                   remote_key: str = "training.trust_remote_code"):
    """Load a `transformers` tokenizer from a local directory.

    A tokenizer without a pad token gets its EOS token as pad (Llama-3 has none); prompts are
    left-padded with it and the padding is masked, so its identity does not matter.

    Args:
        path: a directory made by `tokenizer.save_pretrained` (or a model checkpoint directory).
        what: the option or key the path came from, named in error messages.
        trust_remote_code: run the tokenizer class a directory ships as Python (tokenizer_config.json's auto_map:
            InternLM3's); without it such a directory is refused in one sentence naming `remote_key`.
        remote_key: the key or option that turns trust_remote_code on, named in that sentence.

    Returns:
        A `transformers.PreTrainedTokenizerBase`.

    Raises:
        UserInputError: the path is missing, is not a directory, or does not load as a tokenizer.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserInputError(f"{what} {path!r} does not exist; pass a local Hugging Face tokenizer directory.")
    if not os.path.isdir(path):
        raise UserInputError(
            f"{what} {path!r} is a file, not a tokenizer directory; pass the directory that holds tokenizer.json."
        )
    if not any(os.path.isfile(os.path.join(path, name)) for name in _TOKENIZER_FILES):
        raise UserInputError(
            f"{what} {path!r} has none of {', '.join(_TOKENIZER_FILES)}, so it is not a tokenizer directory; "
            "pass the directory that holds tokenizer.json."
        )

    from transformers import AutoTokenizer  # heavy import, only when a tokenizer is needed

    problem = None if trust_remote_code else own_code_problem(path, f"{what} {path!r}", remote_key)
    if problem:
        raise UserInputError(problem)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as err:  # transformers raises many types for a broken directory
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserInputError(
            f"{what} {path!r} does not load as a Hugging Face tokenizer ({first_line}); "
            "pass a directory saved by tokenizer.save_pretrained."
        ) from None
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def own_code_problem(path: str, named: str, remote_key: str = "training.trust_remote_code"):
    """The sentence for a tokenizer directory whose class is Python it ships (`named`: how the path is named in it),
    or None for any other directory (config/validate.py says it before any worker starts)."""
    own_code = _own_tokenizer_code(path)
    if not own_code:
        return None
    turn_on = f"pass {remote_key}" if remote_key.startswith("--") else f"set {remote_key}=true"
    return (f"{named} is a tokenizer with its own Python code ({own_code}); {turn_on} to run it, or pass a directory "
            f"with a tokenizer.json saved by tokenizer.save_pretrained.")


def _own_tokenizer_code(path: str):
    """'<class> in <file>' when tokenizer_config.json names a tokenizer class that transformers does not have and that
    the directory ships as Python (auto_map.AutoTokenizer), else None."""
    import json

    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    auto = (config.get("auto_map") or {}).get("AutoTokenizer") if isinstance(config, dict) else None
    ref = next((r for r in (auto if isinstance(auto, (list, tuple)) else [auto]) if isinstance(r, str)), None)
    name = config.get("tokenizer_class")
    if not ref or not isinstance(name, str):
        return None
    import transformers

    if hasattr(transformers, name) or hasattr(transformers, name.removesuffix("Fast")):
        return None  # (transformers' own class: it loads without the shipped code)
    module, _, cls = ref.rpartition(".")
    return f"{cls} in {module.split('--')[-1]}.py"


def eos_token_ids(tokenizer, load) -> list[int]:
    """The tokenizer's EOS plus every id of the checkpoint's generation_config.json (Qwen ends chat
    turns with <|im_end|> while its tokenizer's eos is <|endoftext|>)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    path = os.path.join(load, "generation_config.json") if load else None
    if path and os.path.isfile(path):
        import json
        with open(path, encoding="utf-8") as f:
            extra = json.load(f).get("eos_token_id")
        ids += extra if isinstance(extra, list) else [extra] if extra is not None else []
    return sorted(set(int(i) for i in ids))
