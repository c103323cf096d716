"""A tokenizer directory that ships its own Python class (tokenizer_config.json's auto_map, as InternLM3's release does):
refused in one sentence naming the key that runs it, loaded with that key, its code never run without it."""

import json
import os
import shutil

import pytest
from data_helpers import write_jsonl

from mindspeed_rl.data import tiny_task
from mindspeed_rl.data.preprocess import preprocess
from mindspeed_rl.data.tokenizer import load_tokenizer
from mindspeed_rl.utils.errors import UserInputError

SHIPPED = '''import os

from transformers import PreTrainedTokenizerFast

open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran"), "a").close()  # marks that this code ran


class InternLM3Tokenizer(PreTrainedTokenizerFast):
    shipped = True
'''


@pytest.fixture
def shipped_dir(tmp_path):
    """The tiny task's tokenizer as a directory whose class is its own code (tokenization_internlm3.py)."""
    path = tmp_path / "internlm3_tokenizer"
    shutil.copytree(tiny_task.TOKENIZER_DIR, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="InternLM3Tokenizer",
                  auto_map={"AutoTokenizer": ["tokenization_internlm3.InternLM3Tokenizer", None]})
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "tokenization_internlm3.py").write_text(SHIPPED)
    return path


def test_shipped_code_is_refused_in_one_sentence_and_not_run(shipped_dir):
    with pytest.raises(UserInputError) as err:
        load_tokenizer(str(shipped_dir))
    assert str(err.value) == (
        f"tokenizer_name_or_path {str(shipped_dir)!r} is a tokenizer with its own Python code (InternLM3Tokenizer in "
        f"tokenization_internlm3.py); set training.trust_remote_code=true to run it, or pass a directory with a "
        f"tokenizer.json saved by tokenizer.save_pretrained.")
    assert not (shipped_dir / "ran").exists()


def test_trust_remote_code_loads_the_shipped_class(shipped_dir):
    plain = load_tokenizer(tiny_task.TOKENIZER_DIR)
    tok = load_tokenizer(str(shipped_dir), trust_remote_code=True)
    assert type(tok).__name__ == "InternLM3Tokenizer" and tok.shipped
    assert tok("12+7=19").input_ids == plain("12+7=19").input_ids
    assert tok.pad_token_id == plain.pad_token_id


def test_a_transformers_class_with_an_auto_map_loads_without_the_flag(shipped_dir):
    """A directory naming one of transformers' own classes (with a leftover auto_map) needs no shipped code."""
    config = json.loads((shipped_dir / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (shipped_dir / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(str(shipped_dir))("1+1=2").input_ids == load_tokenizer(tiny_task.TOKENIZER_DIR)(
        "1+1=2").input_ids


def test_preprocess_names_its_own_flag(shipped_dir, tmp_path, hf_cache):
    data = tmp_path / "d.jsonl"
    write_jsonl(data, [{"text": "1+1=2"}, {"text": "2+2=4"}])
    with pytest.raises(UserInputError, match=r"own Python code .*; pass --trust-remote-code to run it, or pass"):
        preprocess(str(data), str(shipped_dir), str(tmp_path / "out" / "d"), cache_dir=hf_cache)
    assert not os.path.exists(tmp_path / "out") or not os.listdir(tmp_path / "out")
    result = preprocess(str(data), str(shipped_dir), str(tmp_path / "out" / "d"), cache_dir=hf_cache,
                        trust_remote_code=True)
    assert (result.num_rows, result.num_written) == (2, 2)
    assert all(os.path.isfile(prefix + ".bin") for prefix in result.outputs.values())


def test_ray_gpt_says_it_before_any_worker(shipped_dir, capsys):
    """dry_run (validation, no worker) refuses the directory with the key to set, and passes with it set."""
    import ray_gpt

    code = ray_gpt.main(["dry_run=true", f"training.tokenizer_name_or_path={shipped_dir}"])
    err = capsys.readouterr().err
    assert code == 2 and (f"`training.tokenizer_name_or_path: {shipped_dir}` is a tokenizer with its own Python code "
                          f"(InternLM3Tokenizer in tokenization_internlm3.py); set training.trust_remote_code=true to "
                          f"run it") in err, err
    assert not (shipped_dir / "ran").exists()
    assert ray_gpt.main(["dry_run=true", f"training.tokenizer_name_or_path={shipped_dir}",
                         "training.trust_remote_code=true"]) == 0
