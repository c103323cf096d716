"""The workload of bench/grpo_step.py: tokenizer, prompts, random-init Qwen2 checkpoints, FLOP counts.

Everything here is written to a work directory once and read by both trainers, so the two sides
start from the same files: the same tokenizer, the same prompts, the same initial weights.

Tokenizer (built offline with `tokenizers`, one token per character): the tiny task's 13 tokens
("<eos>" = EOS = pad, the digits, "x", "=") followed by filler characters (CJK ideographs) up to
VOCAB_SIZE. Why not the tiny task's own 13-token tokenizer: a random-init model over 13 tokens
emits EOS about every 13th token, so response lengths, and with them the work per step, would be
random and differ between the two sides; with 2048 tokens ~97 % of responses run the full
max_new_tokens, so both sides generate and train on (almost) exactly the same token count. It also
gives the output layer a realistic share of the FLOPs at 10M-50M parameters.

Prompts: the tiny task's training prompts ("7x3=", label "777"), 4 tokens each; with `--task arith`
(a chat model given with --model) the SmolLM2 example's questions, a task a real model learns.
Models: Qwen2ForCausalLM (GQA, qkv bias, SwiGLU, RMSNorm, RoPE, tied embeddings) saved with
`save_pretrained` in fp32 from a fixed seed; SIZES lists the shapes.
"""
from __future__ import annotations

import json
import os
import shutil

VOCAB_SIZE = 2048
TINY_TOKENS = ["<eos>", *"0123456789", "x", "="]  # the tiny task's vocabulary, same ids
FILLER_START = 0x4E00  # CJK Unified Ideographs: plain letters, one code point each

# name -> Qwen2 shape; parameters are counted by `param_counts` (the table prints them)
SIZES = {
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64),                                      # ~0.08M
    "10m": dict(hidden_size=256, num_hidden_layers=10, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=1024),                                     # ~10M
    "50m": dict(hidden_size=512, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                intermediate_size=2304),                                     # ~51M
}


# ---------------------------------------------------------------------------- files
def build_tokenizer(out_dir: str) -> str:
    """Write the character tokenizer to out_dir (tokenizer.json + config); returns out_dir."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = TINY_TOKENS + [chr(FILLER_START + i) for i in range(VOCAB_SIZE - len(TINY_TOKENS))]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every character a token
    tok.decoder = decoders.Fuse()  # join tokens without spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>",
                                   padding_side="left", model_max_length=128)
    fast.save_pretrained(out_dir)
    return out_dir


def write_prompts(path: str) -> str:
    """The tiny task's training prompts as {"prompt", "labels"} jsonl (both sides read this file)."""
    from mindspeed_rl.data.tiny_task import TRAIN_FILE

    with open(TRAIN_FILE, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
        for line in src:
            row = json.loads(line)
            dst.write(json.dumps({"prompt": row["prompt"], "labels": row["labels"]}) + "\n")
    return path


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARITH_DIR = os.path.join(ROOT, "mindspeed_rl", "assets", "arith_task")
SMOLLM2_EXAMPLE = os.path.join(ROOT, "configs", "rlxf", "grpo_trainer_smollm2_135m.yaml")


def write_arith_prompts(path: str) -> str:
    """`--task arith`: the SmolLM2 example's training questions with its instruction_template applied
    ("What is 7 + 8?\nReply with the result only, written as: #### <number>"), as {"prompt", "labels"}
    jsonl. Both sides send the prompt as one user message through the tokenizer's chat template."""
    import yaml

    from mindspeed_rl.data.templates import PROMPT

    with open(SMOLLM2_EXAMPLE, encoding="utf-8") as f:
        template = yaml.safe_load(f)["actor_rollout_ref"]["actor_rollout"]["instruction_template"]
    with open(os.path.join(ARITH_DIR, "train.jsonl"), encoding="utf-8") as src, \
            open(path, "w", encoding="utf-8") as dst:
        for line in src:
            row = json.loads(line)
            dst.write(json.dumps({"prompt": template.replace(PROMPT, row["prompt"]),
                                  "labels": row["labels"]}) + "\n")
    return path


def qwen2_config(size: str, max_positions: int = 128):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=VOCAB_SIZE, max_position_embeddings=max_positions, rope_theta=10000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", attention_dropout=0.0,
                       initializer_range=0.02, bos_token_id=None, eos_token_id=0, pad_token_id=0,
                       use_sliding_window=False, **SIZES[size])


def build_model(size: str, out_dir: str, tokenizer_dir: str, seed: int) -> str:
    """Save a random-init fp32 Qwen2 of `size` (and the tokenizer) to out_dir; returns out_dir."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_config(size)).float()
    model.generation_config.eos_token_id = 0
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in os.listdir(tokenizer_dir):
        shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
    return out_dir


def add_model_dir(model_dir: str) -> str:
    """Register a Hugging Face directory (--model) as a size: its shape from config.json. Returns
    the size name ("model:<dir name>"). Llama / Qwen2 / Qwen3-style dense decoders."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        c = json.load(f)
    name = f"model:{os.path.basename(os.path.normpath(model_dir))}"
    SIZES[name] = dict(hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
                       num_attention_heads=c["num_attention_heads"],
                       num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                       intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"],
                       head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                       qkv_bias=c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
                       tied=bool(c.get("tie_word_embeddings", False)), dir=os.path.abspath(model_dir))
    return name


# ---------------------------------------------------------------------------- FLOPs
def param_counts(size: str) -> dict[str, int]:
    """Parameters of a size: total (tied embedding once) and `matmul` (weights that multiply every
    token: all linear layers plus the output projection, i.e. the tied embedding counted as lm_head)."""
    s = SIZES[size]
    d, L, f = s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"]
    head = s.get("head_dim", d // s["num_attention_heads"])
    q, kv = s["num_attention_heads"] * head, s["num_key_value_heads"] * head
    bias = (q + 2 * kv) if s.get("qkv_bias", True) else 0
    attn = d * q + 2 * d * kv + q * d + bias  # q,k,v,o weights + qkv bias
    mlp = 3 * d * f
    norms = 2 * d
    emb = s.get("vocab_size", VOCAB_SIZE) * d
    untied = 0 if s.get("tied", True) else emb
    linear = L * (d * q + 2 * d * kv + q * d + mlp)
    return {"total": L * (attn + mlp + norms) + d + emb + untied, "matmul": linear + emb}


def attention_flops_fwd(size: str, seq_lens: list[int]) -> float:
    """Forward FLOPs of causal attention scores and values (QK^T and AV) over whole sequences:
    token i attends to i keys, 2 matmuls x 2 FLOPs x q_dim per key, per layer."""
    s = SIZES[size]
    q_dim = s["num_attention_heads"] * s.get("head_dim", s["hidden_size"] // s["num_attention_heads"])
    return sum(4.0 * s["num_hidden_layers"] * q_dim * n * (n + 1) / 2 for n in seq_lens)


def phase_flops(size: str, prompt_len: float, response_len: float, sequences: int) -> dict[str, float]:
    """Model FLOPs of one GRPO step's phases (useful tokens only; padding is not counted).

    update: forward + backward of the policy = 6 x matmul params x tokens + 3 x attention (forward);
    ref: one forward = 2 x params x tokens + attention; generation: one forward per token with a KV
    cache, which costs the same model FLOPs as one forward over the finished sequence.
    """
    n = param_counts(size)["matmul"]
    seq = prompt_len + response_len
    tokens = sequences * seq
    attn = attention_flops_fwd(size, [round(seq)] * sequences)
    fwd = 2.0 * n * tokens + attn
    return {"update": 3.0 * fwd, "ref": fwd, "gen": fwd, "tokens": tokens}


def matmul_peak(threads: int, n: int = 2048, repeats: int = 5, dtype: str = "fp32", device: str = "cpu") -> float:
    """Best FLOP/s of an n x n x n torch.mm in `dtype` (fp32 or bf16) on `threads` threads (this CPU's
    practical peak for that precision); an accelerator ("cuda", "npu"): on it, n 8192, between the
    platform's synchronizations (also scripts/gpu_smoke.py's roofline)."""
    import time

    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        from mindspeed_rl.platform import get_platform
        from mindspeed_rl.platform.placement import params_dtype

        dt = params_dtype(dtype)
        gpu = device != "cpu"
        n = 8192 if gpu else n
        platform = get_platform(device) if gpu else None
        sync = platform.synchronize if gpu else (lambda: None)
        a, b = torch.randn(n, n, dtype=dt, device=device), torch.randn(n, n, dtype=dt, device=device)
        for _ in range(3 if gpu else 1):  # warm-up
            torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            torch.mm(a, b)
            sync()
            best = min(best, time.perf_counter() - t0)
        del a, b
        if gpu:
            platform.empty_cache()  # the sides run in their own processes: leave them the memory
        return 2.0 * n ** 3 / best
    finally:
        torch.set_num_threads(old)
