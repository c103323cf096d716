"""Load time and peak host memory of a HF checkpoint into megatron GPTModel shards, TP=1 vs TP=2.

    OMP_NUM_THREADS=1 python bench/model_load.py              # Qwen2.5-0.5B shapes (494M params), bf16
    python bench/model_load.py --layers 2 --vocab 8192        # smoke run

The checkpoint is made locally in a temp dir: config.json from transformers' Qwen2Config, random
bf16 tensors under the names and shapes of Qwen2ForCausalLM (built on the meta device), saved in
~500 MB safetensors shards with an index, like a hub download. Each TP size runs on its own gloo
processes (one per rank). Per rank it prints: build time (random init of the empty model), load
time (load_hf_checkpoint), the rank's parameter bytes, RSS after build, and peak RSS (ru_maxrss)
after load. Peak minus after-build is what loading costs on top of the model; file pages of the
memory-mapped safetensors that a rank touches count in its RSS. A benchmark: nothing asserts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

GiB = 1024 ** 3


def make_checkpoint(out_dir: str, layers: int, vocab: int, shard_bytes: int = 500 * 1024 ** 2) -> int:
    """Random bf16 Qwen2.5-0.5B-shaped checkpoint in out_dir; returns the parameter count."""
    import transformers as tf
    from safetensors.torch import save_file

    config = tf.Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                            num_attention_heads=14, num_key_value_heads=2, vocab_size=vocab,
                            max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                            tie_word_embeddings=True, torch_dtype="bfloat16")
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in tf.Qwen2ForCausalLM(config).state_dict().items()}
    shapes.pop("lm_head.weight", None)  # tied
    config.save_pretrained(out_dir)
    gen = torch.Generator().manual_seed(0)
    shard, size, files, weight_map = {}, 0, [], {}

    def flush():
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, os.path.join(out_dir, name), metadata={"format": "pt"})
        files.append(name)
        weight_map.update({k: name for k in shard})

    for name, shape in shapes.items():
        t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        if size + t.numel() * 2 > shard_bytes and shard:
            flush()
            shard, size = {}, 0
        shard[name], size = t, size + t.numel() * 2
    flush()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return sum(s.numel() for s in shapes.values())


def _rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GiB


def _worker(rank, world, port, hf_dir, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from mindspeed_rl.platform import get_platform

    get_platform("cpu").patch()
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world,
                                         timeout=datetime.timedelta(seconds=1800))
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state, model_config_from_hf
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config

    args = model_config_from_hf(read_hf_config(hf_dir))
    init_parallel_state(tp=world, pp=1)
    t0 = time.perf_counter()
    model = build_gpt_model(args, params_dtype=torch.bfloat16)
    build_s, after_build = time.perf_counter() - t0, _rss_gib()
    torch.distributed.barrier()
    t0 = time.perf_counter()
    load_hf_checkpoint(model, hf_dir, args)
    load_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2  # KiB -> GiB
    params = sum(p.numel() * p.element_size() for p in model.parameters()) / GiB
    torch.save(dict(rank=rank, build_s=build_s, load_s=load_s, params=params, after_build=after_build, peak=peak),
               os.path.join(out_dir, f"rank{rank}.pt"))
    torch.distributed.destroy_process_group()


def run(tp: int, hf_dir: str) -> list[dict]:
    from mindspeed_rl.distributed.worker_env import free_port

    port = free_port("127.0.0.1")
    with tempfile.TemporaryDirectory() as out:
        torch.multiprocessing.start_processes(_worker, args=(tp, port, hf_dir, out), nprocs=tp, start_method="spawn")
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(tp)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as hf_dir:
        t0 = time.perf_counter()
        n = make_checkpoint(hf_dir, a.layers, a.vocab)
        disk = sum(os.path.getsize(os.path.join(hf_dir, f)) for f in os.listdir(hf_dir)) / GiB
        print(f"checkpoint: {n / 1e6:.0f}M params, {disk:.2f} GiB bf16 on disk, made in {time.perf_counter() - t0:.1f} s")
        print(f"{'TP':>3} {'rank':>4} {'build s':>8} {'load s':>7} {'params GiB':>10} {'RSS built GiB':>13} "
              f"{'peak RSS GiB':>12} {'load cost GiB':>13}")
        for tp in a.tp:
            for r in run(tp, hf_dir):
                print(f"{tp:>3} {r['rank']:>4} {r['build_s']:>8.1f} {r['load_s']:>7.1f} {r['params']:>10.2f} "
                      f"{r['after_build']:>13.2f} {r['peak']:>12.2f} {r['peak'] - r['after_build']:>13.2f}")


if __name__ == "__main__":
    main()
