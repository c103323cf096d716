"""freeze_parameters (models/freeze.py) at PP 2 with tied embeddings, on 2 gloo processes: the word embedding frozen
on the first stage freezes its copy, the output layer, on the last; megatron's all-reduce of the two copies'
gradients is skipped (megatron-core 0.12 would read a gradient the frozen weight does not have); both copies keep
their values and every other weight takes PP 1's step."""
import pytest
import torch

from testing_utils import make_tiny_hf, run_gloo

pytestmark = pytest.mark.dist

VOCAB, PADDED, SEQ, P = 120, 128, 12, 5
FROZEN = ["embedding.word_embeddings.weight", "decoder.layers.0.self_attention.*"]


def _batch():
    torch.manual_seed(3)
    ids = torch.randint(0, VOCAB, (4, SEQ))
    mask = torch.ones(4, SEQ, dtype=torch.long)
    mask[0, :2] = 0
    rmask = mask[:, P:].float()
    return {"input_ids": ids, "attention_mask": mask, "response_mask": rmask,
            "advantages": torch.randn(4, SEQ - P) * rmask, "old_log_probs": -4.0 + 0.1 * torch.randn(4, SEQ - P)}


def _job(rank, world_size, hf_dir):
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.builder import build_model_chunks, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.checkpoint import chunk_state_dict, load_weights
    from mindspeed_rl.models.freeze import freeze
    from mindspeed_rl.models.hf_bridge import read_hf_config
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    args = dict(model_config_from_hf(read_hf_config(hf_dir)), padded_vocab_size=PADDED)
    init_parallel_state(tp=1, pp=world_size, seed=1)
    chunks = build_model_chunks(args)
    load_weights(chunks, hf_dir, args)
    before = {k: v.clone() for k, v in chunk_state_dict(chunks).items()}
    frozen = freeze(chunks, FROZEN)
    ddp = [wrap_ddp(c, use_distributed_optimizer=False) for c in chunks]
    opt, sched = build_optimizer(ddp, lr=1.0, train_iters=2, clip_grad=1e9, optimizer="sgd", weight_decay=0.1,
                                 use_distributed_optimizer=False)
    for c in chunks:
        c.train()
    policy_update_step(ddp[0], opt, sched, _batch(), P, 1, PolicyLossSettings(temperature=0.7, vocab_size=VOCAB))
    after = chunk_state_dict(chunks)
    ps.destroy_model_parallel()
    return {"frozen": frozen, "before": before, "after": after}


def test_a_frozen_tied_embedding_at_pp2_keeps_both_copies_and_the_rest_steps_as_at_pp1(tmp_path):
    make_tiny_hf("qwen2", str(tmp_path), num_hidden_layers=4)  # tie_word_embeddings: true
    one = run_gloo(_job, 1, str(tmp_path), name="PP 1 step")[0]
    two = run_gloo(_job, 2, str(tmp_path), name="PP 2 step")
    # PP 2: rank 0 freezes the embedding and layer 0's attention, rank 1 the output layer (the tied copy)
    assert one["frozen"] == 1 + 3 and [r["frozen"] for r in two] == [1 + 3, 1]  # (qkv weight and bias, proj)
    assert "output_layer.weight" in two[1]["after"] and "output_layer.weight" not in one["after"]
    for r in two:
        for name, w in r["after"].items():
            if name == "output_layer.weight" or name.startswith(("embedding.", "decoder.layers.0.self_attention.")):
                assert torch.equal(w, r["before"][name]), name
            else:
                step, pp1_step = w - r["before"][name], one["after"][name] - one["before"][name]
                assert not torch.equal(w, r["before"][name]), name
                torch.testing.assert_close(step, pp1_step, rtol=0, msg=name, atol=1e-6 * w.abs().max().item()
                                           + 1e-5 * pp1_step.abs().max().item())
    assert torch.equal(two[1]["after"]["output_layer.weight"], two[0]["after"]["embedding.word_embeddings.weight"])
