"""Youtu-LLM's config.json (youtu: Youtu-LLM-2B and -Base), the one form a dense model with multi-latent attention has:
DeepSeek-V3's attention (q = q_b(norm(q_a(x))), keys and values from a compressed latent, RoPE over interleaved pairs
of qk_rope_head_dim dimensions) and Llama's SwiGLU MLP in every layer. hf_config.model_config_from_hf reads it
(MLA_ARCHS, mla_args) and this writes it back the same; rollout/vllm_hf_config.py hands vLLM, which has no Youtu module,
the DeepSeek-V3 whose every layer is dense.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from mindspeed_rl.models.hf_export_base import base_config, plain_scaling, rope_parameters


def youtu_config(args: Mapping[str, Any], vocab_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """config.json (youtu, YoutuForCausalLM) for megatron args with multi_latent_attention and no experts; what it
    cannot say is refused in one sentence (other norm layouts earlier, by hf_export_config's dispatch, naming the
    model type that has them)."""
    problems = [what for what, bad in (
        ("RMSNorms on the compressed query and key / value (qk_layernorm: true)", not args.get("qk_layernorm")),
        ("no biases", args.get("add_qkv_bias") or args.get("add_bias_linear")),
        ("full attention with RoPE in every layer", args.get("sliding_window") or args.get("no_rope_freq")
         or args.get("window_attn_skip_freq") is not None),
        ("a SwiGLU MLP", not args.get("swiglu") or any(args.get(k) for k in ("squared_relu", "geglu", "xielu"))),
        ("no multipliers or soft caps", not plain_scaling(args) or args.get("attn_logit_softcapping")
         or args.get("output_logit_softcapping")),
    ) if bad]
    if problems:
        raise ValueError(f"a dense model with multi-latent attention has a config.json form only as Youtu-LLM (youtu), "
                         f"which needs {'; '.join(problems)}.")
    config = base_config(args, vocab_size, dtype, "youtu", "YoutuForCausalLM", rope_parameters(args), eps=1e-6)
    config.update(hidden_act="silu", attention_bias=False, rope_interleave=True,
                  q_lora_rank=int(args["q_lora_rank"]) if args.get("q_lora_rank") else None,
                  kv_lora_rank=int(args["kv_lora_rank"]), qk_nope_head_dim=int(args["qk_head_dim"]),
                  qk_rope_head_dim=int(args["qk_pos_emb_head_dim"]), v_head_dim=int(args["v_head_dim"]),
                  head_dim=int(args["qk_pos_emb_head_dim"]))  # (YoutuConfig's head_dim: the rotary part)
    return config
