"""PromptLoader: left padding, seeded per-epoch order, resume, blends, validation pass."""

import numpy as np
import pytest
import torch
from data_helpers import write_jsonl

from mindspeed_rl.data import keys as K
from mindspeed_rl.data.loader import PromptLoader, build_prompt_loader, collate_prompts
from mindspeed_rl.data.prompt_dataset import build_prompt_dataset, parse_data_path
from mindspeed_rl.data.tiny_task import TOKENIZER_DIR, TRAIN_FILE, VAL_FILE
from mindspeed_rl.data.tokenizer import load_tokenizer
from mindspeed_rl.utils.errors import UserInputError


@pytest.fixture(scope="module")
def tiny_tok():
    return load_tokenizer(TOKENIZER_DIR)


def _loader(tiny_tok, batch_size=16, seed=7, **kw):
    return build_prompt_loader(TRAIN_FILE, tiny_tok, batch_size=batch_size, max_prompt_length=16, seed=seed, **kw)


def test_collate_left_pads():
    items = [{"prompt_ids": np.array([5, 6, 7]), "label": "a", "source": "s", "extras": {}},
             {"prompt_ids": np.array([9]), "label": "b", "source": "t", "extras": {"k": "v"}}]
    batch = collate_prompts(items, pad_token_id=0)
    assert batch[K.PROMPT_IDS].tolist() == [[5, 6, 7], [0, 0, 9]]
    assert batch[K.PROMPT_MASK].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch[K.PROMPT_LENGTH].tolist() == [3, 1] and batch[K.PROMPT_IDS].dtype == torch.long
    assert batch[K.LABELS] == ["a", "b"] and batch[K.SOURCE] == ["s", "t"] and batch[K.EXTRAS][1] == {"k": "v"}


def test_tiny_task_batches_decode_to_prompt_and_label(tiny_tok):
    batch = next(_loader(tiny_tok))
    assert batch[K.PROMPT_IDS].shape == (16, 4)  # "dxk=" is 4 tokens
    for ids, label, source in zip(batch[K.PROMPT_IDS], batch[K.LABELS], batch[K.SOURCE]):
        digit, count = tiny_tok.decode(ids)[:-1].split("x")
        assert label == digit * int(count) and source == "tiny_repeat"


def test_same_seed_same_order_new_epoch_new_order(tiny_tok):
    a, b, c = _loader(tiny_tok), _loader(tiny_tok), _loader(tiny_tok, seed=8)
    first_a = [next(a)[K.LABELS] for _ in range(3)]
    assert first_a == [next(b)[K.LABELS] for _ in range(3)]
    assert first_a != [next(c)[K.LABELS] for _ in range(3)]
    assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))
    assert sorted(a.epoch_order(1)) == list(range(2000))


def test_epochs_roll_over_without_partial_batches(tmp_path, tiny_tok):
    rows = [{"prompt": f"{d}x1=", "labels": str(d)} for d in range(10)]
    loader = build_prompt_loader(write_jsonl(tmp_path / "p.jsonl", rows), tiny_tok, 4, 16)
    assert loader.steps_per_epoch == 2
    seen = [next(loader)[K.LABELS] for _ in range(4)]
    assert loader.epoch == 1 and loader.consumed_samples == 16
    assert len(set(sum(seen[:2], []))) == 8  # epoch 0: 8 distinct of 10, last 2 dropped


@pytest.mark.parametrize("resume", ["state", "consumed_samples"])
def test_resume_gives_the_same_batches(tiny_tok, resume):
    straight = _loader(tiny_tok, batch_size=300)
    expected = [next(straight)[K.LABELS] for _ in range(9)]  # crosses into epoch 1 (6 steps/epoch)
    first = _loader(tiny_tok, batch_size=300)
    for _ in range(4):
        next(first)
    state = first.state_dict()
    assert state["epoch"] == 0 and state["position"] == 1200 and state["consumed_samples"] == 1200
    resumed = _loader(tiny_tok, batch_size=300)
    resumed.load_state_dict(state if resume == "state" else {"consumed_samples": 1200})
    assert [next(resumed)[K.LABELS] for _ in range(5)] == expected[4:]


def test_resume_with_other_data_is_refused(tiny_tok):
    loader = _loader(tiny_tok)
    with pytest.raises(UserInputError, match="saved with 1999 prompts but the data now has 2000"):
        loader.load_state_dict({"epoch": 0, "position": 0, "dataset_size": 1999})


def test_validation_pass_is_ordered_and_complete(tiny_tok):
    val = build_prompt_loader(VAL_FILE, tiny_tok, batch_size=16, max_prompt_length=16, shuffle=False, drop_last=False)
    batches = list(val.iter_epoch())
    assert [len(b[K.LABELS]) for b in batches] == [16, 16, 16, 2]
    assert batches[0][K.LABELS][:2] == ["0", "1"] and val.consumed_samples == 0
    with pytest.raises(UserInputError, match="fewer than one batch of 64"):
        build_prompt_loader(VAL_FILE, tiny_tok, batch_size=64, max_prompt_length=16)


def test_blend_draws_weight_shares(tmp_path, tiny_tok):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "1x1=", "labels": "1"}] * 30)
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "2x1=", "labels": "2"}] * 10)
    ds = build_prompt_dataset(f"1,{a},3,{b}", tiny_tok, 16)
    labels = [ds[i]["label"] for i in range(len(ds))]
    assert len(labels) == 40 and labels.count("1") == 10 and labels.count("2") == 30  # b repeated 3x
    assert {ds[i]["source"] for i in range(len(ds))} == {"a", "b"}
    assert parse_data_path(f"1 {a} 3 {b}") == [(1.0, a), (3.0, b)]


def test_loader_is_a_plain_iterator(tiny_tok):
    loader = _loader(tiny_tok)
    assert iter(loader) is loader and isinstance(loader, PromptLoader)
