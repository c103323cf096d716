"""Peak host memory of one policy-update step (forward + backward through megatron) with and
without activation recompute, on CPU.

    OMP_NUM_THREADS=2 python bench/recompute_memory.py                 # 8 layers, h 256, 8 x 512 tokens
    python bench/recompute_memory.py --layers 2 --hidden 128 --seq 64  # smoke run

Each setting runs in its own process (a world-size-1 gloo group, TP=PP=1, fp32): build the model,
make the batch, then one `policy_update_step` (SGD, so no optimizer state skews the numbers).
Columns:
  peak MiB   ru_maxrss after the step minus RSS before it: what the step added to the process's
             peak (the activations autograd holds between forward and backward, the recomputed
             ones, gradients; allocator effects included);
  step s     wall time of the step (recompute re-runs forwards; on shared cores only indicative);
  pg_loss    the step's loss, equal in every row (recompute changes memory, not maths).
A benchmark: it prints a table and asserts nothing.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
MiB = 2 ** 20

SETTINGS = {
    "none": {},
    "selective": {"recompute_granularity": "selective"},
    "full uniform 1": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    "full uniform 4": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 4},
    "full block 4": {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 4},
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(setting: str, layers: int, hidden: int, seq: int, batch: int) -> dict:
    import torch

    from mindspeed_rl.platform import get_platform

    get_platform("cpu").patch()
    from mindspeed_rl.distributed.worker_env import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1")))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=120))
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
    from mindspeed_rl.models.optimizer import build_optimizer, wrap_ddp
    from mindspeed_rl.models.parallel import parallel_config_kwargs
    from mindspeed_rl.models.train_step import PolicyLossSettings, policy_update_step

    init_parallel_state(1, 1, seed=1)
    args = dict(num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=8,
                padded_vocab_size=4096, max_position_embeddings=seq, normalization="RMSNorm", swiglu=True)
    recompute = dict(SETTINGS[setting])
    if "recompute_num_layers" in recompute:  # at most the model's layers (a smoke run has fewer)
        recompute["recompute_num_layers"] = min(recompute["recompute_num_layers"], layers)
    model = build_gpt_model(args, config_overrides=parallel_config_kwargs(**recompute)).train()
    ddp = wrap_ddp(model, use_distributed_optimizer=False)
    opt, sched = build_optimizer([ddp], lr=1e-3, train_iters=2, optimizer="sgd", use_distributed_optimizer=False)
    g = torch.Generator().manual_seed(0)
    prompt = seq // 4
    ids = torch.randint(0, 4096, (batch, seq), generator=g)
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "response_mask": torch.ones(batch, seq - prompt), "advantages": torch.randn(batch, seq - prompt, generator=g)}
    before = _rss_bytes()
    t0 = time.perf_counter()
    stats = policy_update_step(ddp, opt, sched, data, prompt, batch, PolicyLossSettings())
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    torch.distributed.destroy_process_group()
    return {"setting": setting, "peak_mib": (peak - before) / MiB, "seconds": seconds,
            "pg_loss": stats["actor/pg_loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.layers, a.hidden, a.seq, a.batch)))
        return
    print(f"one policy-update step, {a.layers} layers, hidden {a.hidden}, {a.batch} x {a.seq} tokens, fp32, CPU")
    print(f"{'recompute':<16} {'peak MiB':>9} {'step s':>7} {'pg_loss':>10}")
    for setting in SETTINGS:
        cmd = [sys.executable, __file__, "--child", setting, "--layers", str(a.layers), "--hidden", str(a.hidden),
               "--seq", str(a.seq), "--batch", str(a.batch)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=REPO)
        if out.returncode:
            print(f"{setting:<16} failed: {out.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{setting:<16} {r['peak_mib']:>9.1f} {r['seconds']:>7.2f} {r['pg_loss']:>10.6f}")


if __name__ == "__main__":
    main()
