"""One rank of tests/vllm/test_vllm_tp.py (not a test module): builds a VLLMEngine at inference TP
`--tp` in a gloo world from RANK / WORLD_SIZE / MASTER_* (as a ray_gpt worker has), streams a HF
checkpoint's weights into it in shuffled chunks, and writes greedy and sampled generations to
`--out`/rank<RANK>.json."""
import argparse
import datetime
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17], [3, 1]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hf-dir", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="float32")
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    from mindspeed_rl.models.hf_bridge.checkpoint_io import SafetensorsReader
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    with open(os.path.join(a.hf_dir, "config.json"), encoding="utf-8") as f:
        hf_config = json.load(f)
    engine = VLLMEngine(hf_config, vocab_size=hf_config["vocab_size"], max_length=128, eos_token_ids=[0],
                        pad_token_id=0, seed=0, tensor_parallel_size=a.tp, platform_name="cpu", dtype=a.dtype)
    reader = SafetensorsReader(a.hf_dir)
    named = [(n, reader.read(n)) for n in sorted(reader.weight_map)]
    random.Random(3).shuffle(named)  # shuffled, chunks of 3 tensors: chunk boundaries inside layers
    engine.update_weights_chunks([named[i:i + 3] for i in range(0, len(named), 3)])
    greedy = engine.generate(PROMPTS, SamplingParams(do_sample=False, max_new_tokens=16, ignore_eos=True))
    sampled = engine.generate(PROMPTS, SamplingParams(n=2, do_sample=True, temperature=1.0, max_new_tokens=16,
                                                      ignore_eos=True, seed=5))
    with open(os.path.join(a.out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump({name: {"tokens": o.responses.tolist(), "log_probs": o.log_probs.tolist()}
                   for name, o in (("greedy", greedy), ("sampled", sampled))}, f)
    engine.close()
    from mindspeed_rl.distributed.worker_env import destroy_world

    destroy_world()  # left to the interpreter's exit, a gloo group can abort the process (exit 134)


if __name__ == "__main__":
    main()
