"""The word embedding's forward + backward + accumulation into DDP's main_grad alone, on CPU:
megatron's path (F.embedding's backward: a zeroed (V, H) gradient, the rows scattered into it, the
hook's main_grad.add_) against platform/wgrad_fusion.py's (the rows index_add_-ed into main_grad).

    python bench/embedding_grad.py                        # SmolLM2-135M: 49152 x 576, 8 x 72 tokens
    python bench/embedding_grad.py --vocab 151936 --hidden 896 --repeat 20   # Qwen2.5-0.5B's table

One megatron VocabParallelEmbedding (TP=1, fp32) in megatron's DDP, a world-size-1 gloo group;
each timed step: forward of the token batch, backward of a fixed output gradient (the buffer is
zeroed before it, untimed: a (V, H) fill both variants pay once per update, not per micro-batch). The
two variants run interleaved, one step each per round; the table has the best and median process
CPU time (all threads) and wall time of a step. A benchmark: it prints a table and asserts nothing.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _embedding_ddp(vocab: int, hidden: int):
    from mindspeed_rl.models.optimizer import wrap_ddp  # the platform patch before megatron
    from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=1, use_cpu_initialization=True)

    class Embedding(torch.nn.Module):  # DDP wants a module with a config
        def __init__(self):
            super().__init__()
            self.config = config
            self.word_embeddings = VocabParallelEmbedding(vocab, hidden, init_method=torch.nn.init.zeros_,
                                                          config=config)

        def forward(self, ids):
            return self.word_embeddings(ids)

    return wrap_ddp(Embedding(), use_distributed_optimizer=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=72)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29873")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    from mindspeed_rl.models.builder import init_parallel_state
    from mindspeed_rl.platform import wgrad_fusion

    init_parallel_state(1, 1, seed=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, a.vocab, (a.rows, a.seq), generator=g)  # (B, S)
    grad = torch.randn(a.rows, a.seq, a.hidden, generator=g)  # (B, S, H)
    variants = {name: _embedding_ddp(a.vocab, a.hidden) for name in ("megatron (V, H) grad", "rows into main_grad")}
    wgrad_fusion.unfuse_embeddings(variants["megatron (V, H) grad"].module)
    if not wgrad_fusion.applies():
        print("not the cpu platform: both variants are megatron's", file=sys.stderr)

    def step(ddp):
        ddp(ids).backward(grad)

    for ddp in variants.values():
        step(ddp)
    times = {name: [] for name in variants}
    for _ in range(a.repeat):
        for name, ddp in variants.items():
            ddp.zero_grad_buffer()  # a (V, H) fill either way: not timed
            t0, c0 = time.perf_counter(), time.process_time()
            step(ddp)
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    ref, ours = (v.module.word_embeddings.weight.main_grad for v in variants.values())
    print(f"V {a.vocab} x H {a.hidden}, {a.rows * a.seq} tokens, {a.threads} threads, {a.repeat} rounds; "
          f"main_grad max |diff| {(ref - ours).abs().max().item():.3g}; load {os.getloadavg()[0]:.2f}")
    print(f"{'variant':<22} {'best cpu ms':>11} {'median cpu ms':>13} {'best wall ms':>12} {'median wall ms':>14}")
    for name, t in times.items():
        cpu, wall = [c for _, c in t], [w for w, _ in t]
        print(f"{name:<22} {1e3 * min(cpu):11.2f} {1e3 * statistics.median(cpu):13.2f} {1e3 * min(wall):12.2f} "
              f"{1e3 * statistics.median(wall):14.2f}")
    from mindspeed_rl.distributed.worker_env import destroy_world

    destroy_world()  # a process group left to the interpreter's exit can abort it
    return 0


if __name__ == "__main__":
    sys.exit(main())
