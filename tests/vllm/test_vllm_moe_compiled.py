"""A compiled vLLM engine (enforce_eager=False) with an MoE model sees every streamed weight update:
a tiny Qwen2-MoE (4 experts, top-2, a gated shared expert; hidden 128) updated to other weights in
shuffled chunks, then back, generates what an eager engine holding the same weights generates,
greedy and sampled. On CPU the experts' prepacked weights are rewritten in place after each reload
(rollout/vllm_engine._prepack_cpu_experts), so the compiled graph keeps reading them."""
import json
import random

import torch

import testing_utils
from mindspeed_rl.rollout.interface import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17], [3, 1]]
PARAMS = [SamplingParams(do_sample=False, max_new_tokens=16, ignore_eos=True),
          SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=11, ignore_eos=True)]


def test_compiled_moe_engine_sees_updates_like_an_eager_one(tmp_path):
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    weights = []
    for seed in (0, 1):
        model = testing_utils.make_tiny_hf("qwen2_moe", str(tmp_path / f"s{seed}"), seed=seed, hidden_size=128)
        weights.append(testing_utils.per_expert(model.state_dict()))
    hf_config = json.loads((tmp_path / "s0" / "config.json").read_text())
    engines = [VLLMEngine(hf_config, vocab_size=hf_config["vocab_size"], max_length=128, eos_token_ids=[0], seed=0,
                          enforce_eager=eager) for eager in (False, True)]
    compiled, eager = engines
    try:
        for i, w in enumerate((weights[0], weights[1], weights[0])):
            items = list(w.items())
            random.Random(i).shuffle(items)
            compiled.update_weights_chunks([items[j:j + 3] for j in range(0, len(items), 3)])
            eager.update_weights(w.items())
            for params in PARAMS:
                a, b = compiled.generate(PROMPTS, params), eager.generate(PROMPTS, params)
                assert torch.equal(a.responses, b.responses), (i, params)
                assert (a.log_probs - b.log_probs).abs().max() <= 1e-5, (i, params)
    finally:
        for engine in engines:
            engine.close()
