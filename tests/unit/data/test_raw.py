"""Raw input forms: file, glob, directory; jsonl, json array, parquet, csv, txt."""

import json

import pytest

from mindspeed_rl.data.raw import load_raw_dataset, resolve_input_files
from mindspeed_rl.utils.errors import UserInputError

ROWS = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]


def _write_all(d):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (d / "b.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), d / "c.parquet")
    (d / "d.csv").write_text("question,answer\nq1,1\nq2,2\n")
    (d / "e.txt").write_text("line one\nline two\n")
    return d


@pytest.mark.parametrize("name", ["a.jsonl", "b.json", "c.parquet", "d.csv"])
def test_formats(tmp_path, hf_cache, name):
    d = _write_all(tmp_path / "raw")
    data = load_raw_dataset(str(d / name), cache_dir=hf_cache)
    assert [str(r["answer"]) for r in data] == ["1", "2"] and data[0]["question"] == "q1"


def test_txt_gives_a_text_column(tmp_path, hf_cache):
    d = _write_all(tmp_path / "raw")
    assert load_raw_dataset(str(d / "e.txt"), cache_dir=hf_cache)["text"] == ["line one", "line two"]


def test_directory_and_glob(tmp_path, hf_cache):
    d = tmp_path / "shards"
    d.mkdir()
    for i in range(3):
        (d / f"part{i}.jsonl").write_text(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n")
    (d / "notes.md").write_text("ignored: not a data file")
    assert load_raw_dataset(str(d), cache_dir=hf_cache)["answer"] == ["0", "1", "2"]
    assert load_raw_dataset(str(d / "part[12].jsonl"), cache_dir=hf_cache, max_samples=1)["answer"] == ["1"]


def test_mixed_formats_and_no_match(tmp_path):
    d = _write_all(tmp_path / "raw")
    with pytest.raises(UserInputError, match="mixes data formats"):
        resolve_input_files(str(d))
    with pytest.raises(UserInputError, match="matches no file"):
        resolve_input_files(str(tmp_path / "*.parquet"))


def test_json_line_that_is_not_an_object(tmp_path, hf_cache):
    src = tmp_path / "x.jsonl"
    src.write_text('{"question": "q"}\n[1, 2]\n')
    with pytest.raises(UserInputError, match="line 2 is a JSON list, not an object|could not be read"):
        load_raw_dataset(str(src), cache_dir=hf_cache)
