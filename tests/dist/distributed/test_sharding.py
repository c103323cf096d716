"""Pure parts of the Ray layer (no Ray session): batch split/concat, DP layouts, device choice."""
import pytest
import torch

from mindspeed_rl.distributed.worker_env import pick_device
from mindspeed_rl.distributed.worker_group import DPLayout, concat_batches, split_batch


def test_split_and_concat_round_trip():
    batch = {"input_ids": torch.arange(16).view(8, 2), "labels": list("abcdefgh")}
    shards = split_batch(batch, 4)  # (8, 2) -> 4 x (2, 2)
    assert [s["labels"] for s in shards] == [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]]
    assert torch.equal(shards[3]["input_ids"], torch.tensor([[12, 13], [14, 15]]))
    back = concat_batches(shards)
    assert torch.equal(back["input_ids"], batch["input_ids"]) and back["labels"] == batch["labels"]
    assert concat_batches([{"loss": 1.0}, {"loss": 2.0}]) == {"loss": [1.0, 2.0]}  # scalars: per shard
    assert concat_batches([(1,), (2, 3)]) == (1, 2, 3)


def test_split_refuses_uneven_or_ragged_batches():
    with pytest.raises(ValueError, match="8 rows cannot be split evenly over 3"):
        split_batch({"x": torch.zeros(8)}, 3)
    with pytest.raises(ValueError, match="same number of rows"):
        split_batch({"x": torch.zeros(8), "y": [0] * 7}, 2)


def test_layout_from_rank_info_tp2_pp2():
    # 8 ranks, TP=2 x PP=2 x DP=2 in Megatron order (tp fastest, then dp, then pp); outputs come
    # from tp_rank 0 of the last pipeline stage.
    infos = []
    for rank in range(8):
        tp, dp, pp = rank % 2, (rank // 2) % 2, rank // 4
        infos.append(dict(rank=rank, dp_rank=dp, tp_rank=tp, pp_rank=pp, is_output_rank=tp == 0 and pp == 1))
    layout = DPLayout.from_rank_info(infos)
    assert layout.dp_of_rank == [0, 0, 1, 1, 0, 0, 1, 1] and layout.output_ranks == [4, 6]
    assert layout.dp_size == 2
    with pytest.raises(ValueError, match="each with one output rank"):
        DPLayout.from_rank_info([dict(dp_rank=0, is_output_rank=False)])


def test_pick_device_in_both_visible_device_modes():
    assert pick_device(["3"], [3], local_rank=1) == 0  # Ray isolation: only its device
    assert pick_device(["3"], None, local_rank=1) == 3  # NOSET: every device visible
    assert pick_device(["5"], [4, 5, 6, 7], local_rank=0) == 1  # node restricted before `ray start`
    assert pick_device([], None, local_rank=2) == 2  # not a Ray actor with a device
    with pytest.raises(RuntimeError, match="assigned device 2 but ASCEND_RT_VISIBLE_DEVICES=0,1 hides it"):
        pick_device(["2"], [0, 1], 0, "ASCEND_RT_VISIBLE_DEVICES")
