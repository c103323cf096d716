"""models.reward_model: the trunk + scalar head loads a HF Qwen2ForSequenceClassification (num_labels=1)
and scores padded batches like transformers (fp32, 1e-4), at TP=1 in one process (TP=2 and PP=2:
tests/dist/models/test_checkpoint_dist.py)."""

import pytest
import torch

from testing_utils import TINY_HF, save_random_reward_model


def make_tiny_rm(out_dir, seed=0):
    """A random fp32 Qwen2ForSequenceClassification (num_labels=1, pad id 0) saved to out_dir."""
    import transformers as tf

    config = tf.Qwen2Config(**TINY_HF, num_labels=1, pad_token_id=0, tie_word_embeddings=True)
    return save_random_reward_model(config, out_dir, seed)


def padded_batch():
    """(B, S) ids with pad id 0 exactly where the mask is 0: rows 0/1 left-padded, rows 2/3 right-padded."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 120, (4, 24), generator=g)
    mask = torch.ones(4, 24, dtype=torch.long)
    mask[0, :5], mask[1, :11], mask[2, 17:], mask[3, 9:] = 0, 0, 0, 0
    return ids * mask, mask


def hf_scores(hf, ids, mask):
    from mindspeed_rl.models.forward import position_ids_from_mask

    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, 0]


def test_scores_match_sequence_classification(gloo_world1, tmp_path):
    from mindspeed_rl.models.builder import init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.models.reward_model import build_reward_model, compute_scores, reward_args

    hf = make_tiny_rm(str(tmp_path))
    args = reward_args(dict(model_config_from_hf(read_hf_config(str(tmp_path))), padded_vocab_size=128))
    init_parallel_state(1, 1)
    model = build_reward_model(args).eval()
    assert load_hf_checkpoint(model, str(tmp_path), args) == 1 + 2 * 7 + 2  # embedding, 7 per layer, final norm, score
    assert "output_layer.weight" not in model.state_dict()  # no vocab projection
    ids, mask = padded_batch()
    scores = compute_scores(model, ids, mask, micro_batch_size=2)  # (B,)
    torch.testing.assert_close(scores, hf_scores(hf, ids, mask), rtol=0, atol=1e-4)


def test_reward_model_exports_back_to_hf_names(gloo_world1, tmp_path):
    from mindspeed_rl.models.builder import init_parallel_state
    from mindspeed_rl.models.checkpoint import chunk_state_dict
    from mindspeed_rl.models.hf_bridge.sharding import mcore_to_hf
    from mindspeed_rl.models.reward_model import build_reward_model, compute_scores
    from tests.unit.models.test_checkpoint import ARGS

    init_parallel_state(1, 1)
    model = build_reward_model(ARGS)
    hf = {}
    for name, t in chunk_state_dict(model).items():
        hf.update(mcore_to_hf(name, t, ARGS, vocab_size=40))
    assert hf["score.weight"].shape == (1, 32) and "lm_head.weight" not in hf
    with pytest.raises(ValueError, match="not divisible"):
        compute_scores(model, torch.zeros(3, 4, dtype=torch.long), torch.ones(3, 4), micro_batch_size=2)
