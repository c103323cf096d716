"""platform/wgrad_fusion.py's word-embedding gradient (rows into main_grad) on 2 gloo processes:
after a 2-micro-batch policy update (megatron's schedule, finalize_model_grads: DP all-reduce, the
embedding group's all-reduce of the tied copies at PP=2) every main_grad equals megatron's own
embedding backward's, at TP=2 (vocab-parallel masking; with and without sequence parallelism),
PP=2 and DP=2, tied and untied."""
import pytest
import torch

from testing_utils import run_gloo

pytestmark = pytest.mark.dist

VOCAB = 40
ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=8, padded_vocab_size=VOCAB, max_position_embeddings=32,
            add_qkv_bias=True, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)
CASES = [  # (name, tp, pp, sequence parallel, tied)
    ("tp2", 2, 1, False, True), ("tp2-untied", 2, 1, False, False), ("tp2-sp", 2, 1, True, True),
    ("pp2", 1, 2, False, True), ("pp2-untied", 1, 2, False, False), ("dp2", 1, 1, False, True)]


def _batch(rank):
    g = torch.Generator().manual_seed(rank)  # DP ranks see different rows
    ids = torch.randint(0, VOCAB, (4, 11), generator=g)  # (B, S): both TP halves of the vocab
    mask = torch.ones(4, 11, dtype=torch.long)
    mask[0, :2] = 0
    rmask = mask[:, 5:].float()
    return {"input_ids": ids, "attention_mask": mask, "response_mask": rmask,
            "advantages": torch.randn(4, 6, generator=g) * rmask,
            "old_log_probs": -3.0 + 0.1 * torch.randn(4, 6, generator=g)}


def _job(rank, world_size):
    from megatron.core import parallel_state as ps

    from mindspeed_rl.models.builder import build_model_chunks, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.parallel import parallel_config_kwargs
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step
    from mindspeed_rl.platform import wgrad_fusion

    res = {}
    for name, tp, pp, sp, tied in CASES:
        init_parallel_state(tp=tp, pp=pp, seed=1)
        args = dict(ARGS, untie_embeddings_and_output_weights=not tied)
        overrides = parallel_config_kwargs(sequence_parallel=sp)
        fused, plain = (build_model_chunks(args, config_overrides=overrides) for _ in range(2))
        for f, p in zip(fused, plain):
            p.load_state_dict(f.state_dict())
        grads = {}
        for which, chunks in (("fused", fused), ("plain", plain)):
            ddp = [wrap_ddp(c, use_distributed_optimizer=False, bucketing=i == 0) for i, c in enumerate(chunks)]
            if which == "plain":
                for d in ddp:
                    wgrad_fusion.unfuse_embeddings(d.module)
            embeddings = [m for d in ddp for m in d.module.modules() if type(m).__name__ == "VocabParallelEmbedding"]
            assert len(embeddings) == (1 if ps.is_pipeline_first_stage() else 0)
            assert all(("forward" in vars(m)) == (which == "fused") for m in embeddings)
            opt, sched = build_optimizer(ddp, lr=1.0, train_iters=2, clip_grad=1e9, optimizer="sgd",
                                         use_distributed_optimizer=False)
            s = PolicyLossSettings(vocab_size=VOCAB)
            batch = _batch(ps.get_data_parallel_rank())
            policy_update_step(ddp if len(ddp) > 1 else ddp[0], opt, sched, batch, 5, 2, s)  # 2 micro-batches
            grads[which] = {n: p.main_grad.clone() for d in ddp for n, p in d.module.named_parameters()}
        res[name] = grads
    ps.destroy_model_parallel()
    return res


@pytest.fixture(scope="module")
def results():
    return run_gloo(_job, 2, timeout_s=300, name="embedding gradient job")


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_embedding_rows_into_main_grad_equal_megatron(results, case):
    for rank, r in enumerate(results):
        fused, plain = r[case]["fused"], r[case]["plain"]
        assert fused.keys() == plain.keys()
        for name, theirs in plain.items():
            diff = (fused[name] - theirs).abs().max().item()
            assert diff <= 1e-6 * theirs.abs().max().item(), f"{case} rank {rank} {name}: max |diff| {diff:.3g}"
        shared = [n for n in plain if "word_embeddings" in n or "output_layer" in n]
        assert shared and all(plain[n].abs().max() > 0 for n in shared), f"{case} rank {rank}: {shared}"
