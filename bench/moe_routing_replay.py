"""MoE routing replay (R3), measured: the rollout-vs-training log-prob gap with and without replaying
the rollout's expert choices in the training forward (models/moe_replay.py).

    OMP_NUM_THREADS=2 python bench/moe_routing_replay.py                 # fp32 and bf16, 0 / 1 / 4 updates
    python bench/moe_routing_replay.py --dtypes fp32 --updates 0 --prompts 4   # smoke run

One random-init MoE GPTModel on one process (hidden 128, 4 layers, 8 experts, top-2, renormalised).
The native engine samples responses with its KV cache and records every token's experts; then the
training forward (full sequences, megatron's modules, the path compute_log_prob / update_actor take)
scores the same tokens (a) with the rollout's weights and (b) after N optimizer steps (Adam on a
GRPO-like loss with random +-1 sequence advantages: the later mini-batches of a PPO epoch, where the
routers have moved). Per row, over response tokens: max / mean |training - rollout log-prob|, the
importance ratio exp(training - rollout) (std, max |r - 1|), and the fraction of (token, MoE layer)
pairs whose top-k set in the training forward differs from the rollout's (0 with replay, by
construction). bf16 = bf16 parameters and compute (the engine's decode and the training forward
round differently); fp32 is the numerics floor. A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspeed_rl.platform import get_platform  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rollout_decode import init_world  # noqa: E402  (bench/ is not a package)

PLATFORM = get_platform()
PLATFORM.patch()

ARGS = dict(num_layers=4, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, padded_vocab_size=256, max_position_embeddings=128, normalization="RMSNorm",
            swiglu=True, disable_bias_linear=True, qk_layernorm=True, num_experts=8, moe_router_topk=2,
            moe_ffn_hidden_size=64, norm_topk_prob=True, init_method_std=0.02)
VOCAB = 250


# ---------------------------------------------------------------------------------------------

def _rollout(model, prompts: int, n: int, new_tokens: int, seed: int) -> dict:
    from mindspeed_rl.rollout.interface import SamplingParams
    from mindspeed_rl.rollout.native import NativeEngine

    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, VOCAB, (int(torch.randint(6, 17, (1,), generator=g)),), generator=g).tolist()
            for _ in range(prompts)]
    engine = NativeEngine(model, vocab_size=VOCAB, max_length=ARGS["max_position_embeddings"], eos_token_ids=(),
                          pad_token_id=0, record_routing=True)
    out = engine.generate(rows, SamplingParams(n=n, do_sample=True, temperature=1.0, max_new_tokens=new_tokens,
                                               seed=seed))
    return out.to_batch()


def _train_log_probs(model, batch: dict, replay: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) response log-probs of the training forward, and its own routing (B, S, L, k)."""
    from mindspeed_rl.data import keys as K
    from mindspeed_rl.models.forward import attention_mask_4d, compute_log_probs, position_ids_from_mask
    from mindspeed_rl.models.moe_replay import RoutingRecorder

    ids, attn = batch[K.INPUT_IDS], batch[K.ATTENTION_MASK]
    P, T = batch[K.PROMPT_IDS].shape[1], batch[K.RESPONSES].shape[1]
    with torch.no_grad():
        lp, _ = compute_log_probs(model, ids, attn, 4, vocab_size=VOCAB,
                                  routed_experts=batch[K.ROUTED_EXPERTS] if replay else None)
        recorder = RoutingRecorder(model, *ids.shape)
        recorder.at(torch.arange(ids.shape[0]), 0)
        with recorder:
            model(ids, position_ids_from_mask(attn), attention_mask_4d(attn))
    return lp[:, P - 1:P - 1 + T], recorder.result(attn)


def _update(model, optimizer, batch: dict, seed: int) -> None:
    """One Adam step on -(A * response log-prob) with random +-1 advantages per sequence."""
    from mindspeed_rl.data import keys as K
    from mindspeed_rl.models.forward import attention_mask_4d, position_ids_from_mask, vocab_parallel_log_probs

    ids, attn, rmask = batch[K.INPUT_IDS], batch[K.ATTENTION_MASK], batch[K.RESPONSE_MASK].float()
    P, T = batch[K.PROMPT_IDS].shape[1], batch[K.RESPONSES].shape[1]
    adv = torch.randint(0, 2, (ids.shape[0], 1), generator=torch.Generator().manual_seed(seed)).float() * 2 - 1
    logits = model(ids, position_ids_from_mask(attn), attention_mask_4d(attn))
    lp, _ = vocab_parallel_log_probs(logits[:, P - 1:P - 1 + T], ids[:, P:], vocab_size=VOCAB)
    loss = -(adv * lp * rmask).sum() / rmask.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _row(batch: dict, train_lp: torch.Tensor, own_routing: torch.Tensor, replay: bool) -> dict:
    from mindspeed_rl.data import keys as K

    mask = batch[K.RESPONSE_MASK].bool()
    diff = (train_lp.float() - batch[K.ROLLOUT_LOG_PROBS].float())[mask]
    ratio = diff.exp()
    recorded = batch[K.ROUTED_EXPERTS]
    valid = (recorded >= 0).all(-1)  # (B, S, L): tokens the rollout ran
    differs = (own_routing != recorded).any(-1)[valid].float().mean()
    return {"max": float(diff.abs().max()), "mean": float(diff.abs().mean()), "ratio_std": float(ratio.std()),
            "ratio_dev": float((ratio - 1).abs().max()), "routing": 0.0 if replay else float(differs)}


def run(dtype_name: str, updates: list[int], prompts: int, n: int, new_tokens: int, lr: float, seed: int) -> list:
    from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    init_parallel_state(1, 1, seed=seed)
    torch.manual_seed(seed)
    model = build_gpt_model(ARGS, params_dtype=dtype)
    model.eval()  # no dropout; the update below runs with autograd all the same
    batch = _rollout(model, prompts, n, new_tokens, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rows, done = [], 0
    for target in sorted(updates):
        while done < target:
            _update(model, optimizer, batch, seed + done)
            done += 1
        for replay in (False, True):
            lp, own = _train_log_probs(model, batch, replay)
            rows.append(dict(dtype=dtype_name, updates=done, replay=replay, **_row(batch, lp, own, replay)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--updates", default="0,1,4", help="optimizer steps before the training forward")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args(argv)
    init_world()
    updates = [int(u) for u in a.updates.split(",")]
    print(f"MoE {ARGS['num_layers']} layers, {ARGS['num_experts']} experts top-{ARGS['moe_router_topk']}, hidden "
          f"{ARGS['hidden_size']}; {a.prompts} prompts x {a.n} samples, {a.new_tokens} new tokens; Adam lr {a.lr}")
    print("| dtype | updates | replay | max abs logp diff | mean abs logp diff | ratio std | max abs(ratio-1) "
          "| routing differs |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in a.dtypes.split(","):
        for r in run(dtype, updates, a.prompts, a.n, a.new_tokens, a.lr, a.seed):
            print(f"| {r['dtype']} | {r['updates']} | {'on' if r['replay'] else 'off'} | {r['max']:.2e} | "
                  f"{r['mean']:.2e} | {r['ratio_std']:.2e} | {r['ratio_dev']:.2e} | {100 * r['routing']:.2f} % |",
                  flush=True)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
