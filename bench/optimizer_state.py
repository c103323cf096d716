"""What saving the optimizer's state per parameter, and resuming it at another layout, costs (side by side).

    .venv/bin/python bench/optimizer_state.py               # a ~100M-parameter Llama shape on 2 gloo ranks, ~2 min
    .venv/bin/python bench/optimizer_state.py --layers 4    # smaller

Two ranks train one Adam step at DP 2 (the distributed optimizer) and save a checkpoint, which holds the
optimizer's state per parameter (models/optimizer_state.py). A fresh model then loads it, timed each way
(model building not timed; the slower rank's time is printed):
  same         at DP 2: the same TP / PP, so each rank reads its own directory and takes its range;
  other        at TP 2, the optimizer included: every state tensor re-sharded the way the weights are;
  weights      at TP 2, weights only: what a resume at another layout did before 2026-11-30 (Adam's moments fresh).
Also printed: the checkpoint's bytes by kind of file. Nothing asserts a time (README: Tests and benchmarks).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def model_args(layers: int) -> dict:
    return dict(num_layers=layers, hidden_size=768, ffn_hidden_size=2048, num_attention_heads=12,
                group_query_attention=True, num_query_groups=4, kv_channels=64, padded_vocab_size=32000,
                max_position_embeddings=256, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)


def _batch(rank: int):
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(1, 32000, (2, 48), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": torch.ones(2, 16),
            "advantages": torch.randn(2, 16, generator=g), "old_log_probs": torch.full((2, 16), -10.0),
            "ref_log_probs": torch.full((2, 16), -10.0)}


def _worker(rank: int, world: int, port: int, root: str, layers: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    from mindspeed_rl.models.builder import build_model_chunks, init_parallel_state
    from mindspeed_rl.models.checkpoint import load_checkpoint, save_checkpoint
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    args = model_args(layers)

    def fresh(tp: int):
        init_parallel_state(tp, 1, seed=1)
        distributed = tp == 1
        ddp = [wrap_ddp(c, use_distributed_optimizer=distributed) for c in build_model_chunks(args)]
        return (ddp[0], *build_optimizer(ddp, lr=1e-4, train_iters=10, use_distributed_optimizer=distributed))

    def timed(fn) -> float:
        torch.distributed.barrier()
        start = time.perf_counter()
        fn()
        torch.distributed.barrier()
        return time.perf_counter() - start

    parts = fresh(1)
    policy_update_step(*parts, _batch(rank), 32, 2, PolicyLossSettings())
    times = {"save": timed(lambda: save_checkpoint(root, 1, parts[0], args, parts[1], parts[2]))}
    parts = None  # noqa: F841 (frees the first model before the others are built)
    path = os.path.join(root, "iter_0000001")
    for name, tp, with_optimizer in (("same", 1, True), ("other", 2, True), ("weights", 2, False)):
        again = fresh(tp)
        times[name] = timed(lambda: load_checkpoint(path, again[0], args, again[1], again[2],
                                                    load_optimizer=with_optimizer, load_rng=False))
    slowest = [None] * world
    torch.distributed.all_gather_object(slowest, times)
    if rank == 0:
        torch.save({k: max(t[k] for t in slowest) for k in times}, out)
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    opts = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="optimizer-state-") as tmp:
        out = os.path.join(tmp, "times.pt")
        torch.multiprocessing.spawn(_worker, args=(2, port, os.path.join(tmp, "ckpt"), opts.layers, out), nprocs=2)
        times = torch.load(out)
        sizes: dict[str, int] = {}
        for where, _, files in os.walk(os.path.join(tmp, "ckpt")):
            for f in files:
                kind = ("optimizer state" if f.startswith("optim_state") else "weights" if f == "model.safetensors"
                        else "other")
                sizes[kind] = sizes.get(kind, 0) + os.path.getsize(os.path.join(where, f))
    return _report(opts, times, sizes)


def _report(opts, times: dict, sizes: dict) -> int:
    print(f"optimizer state per parameter, {opts.layers} layers (hidden 768, vocab 32000), 2 gloo ranks; slower rank's time")
    print(f"{'step':<40}{'s':>8}{'x weights-only load':>22}")
    rows = [("save at DP 2 (distributed optimizer)", "save"), ("load at DP 2 (same TP / PP)", "same"),
            ("load at TP 2, optimizer included", "other"), ("load at TP 2, weights only", "weights")]
    for label, key in rows:
        print(f"{label:<40}{times[key]:8.2f}{times[key] / times['weights']:22.2f}")
    print("checkpoint bytes: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(sizes.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
