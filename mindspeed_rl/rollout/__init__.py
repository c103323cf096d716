"""Rollout: generation engines behind one protocol (interface.RolloutEngine).

    from mindspeed_rl.rollout.interface import SamplingParams, prompts_from_batch
    from mindspeed_rl.rollout.native import NativeEngine      # imports megatron (after the platform patch)
    engine = NativeEngine(model, vocab_size=..., max_length=..., eos_token_ids=[...])
    out = engine.generate(prompts_from_batch(batch["prompts"], batch["prompt_mask"]),
                          SamplingParams.from_ray_gpt(n_samples_per_prompt=8, temperature=1.0, seed=step))
    batch.update(out.to_batch())                                # + group_index from the worker

Files: interface.py (protocol, SamplingParams, RolloutOutput), sampling.py (pure torch next-token
choice and log-probs), native.py (megatron-core engine with a KV cache), weights.py (streamed HF
weights into megatron shards). Submodules are imported explicitly; this package imports nothing heavy.
"""
