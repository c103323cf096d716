"""A compiled vLLM engine (enforce_eager=False: torch.compile with inductor on CPU) sees every
streamed weight update. Stale weights after an update are the most reported bug class with
compiled / graph-captured engines (a graph or a prepacked GEMM handle keeping the old tensors):
here new weights streamed in shuffled chunks that split layers make the compiled engine generate
exactly what a fresh compiled engine built from them generates, greedy and sampled, tokens and
log-probs; streaming the old weights back gives the old generations again. Qwen2: tied lm_head
(re-pointed and re-packed after every update) and q/k/v biases. Head dim 32 (vLLM's CPU attention
has no kernel for 16)."""
import json
import random

import pytest
import torch

import testing_utils
from mindspeed_rl.rollout.interface import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14, 15, 16, 17], [3, 1]]
PARAMS = [SamplingParams(do_sample=False, max_new_tokens=16, ignore_eos=True),
          SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=11, ignore_eos=True)]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(engine factory, HF config, weights A, weights B); every engine built is closed at the end
    (closing tears down the process's torch.distributed groups: only when the module is done)."""
    from mindspeed_rl.rollout.vllm_engine import VLLMEngine

    out = tmp_path_factory.mktemp("compiled")
    weights = []
    for seed in (0, 1):
        model = testing_utils.make_tiny_hf("qwen2", str(out / f"s{seed}"), seed=seed, hidden_size=128)
        weights.append({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})  # tied
    hf_config = json.loads((out / "s0" / "config.json").read_text())
    built = []

    def build(enforce_eager):
        engine = VLLMEngine(hf_config, vocab_size=hf_config["vocab_size"], max_length=128, eos_token_ids=[0],
                            seed=0, enforce_eager=enforce_eager)
        built.append(engine)
        return engine

    yield build, hf_config, weights[0], weights[1]
    for engine in built:
        engine.close()


def _generations(engine):
    return [engine.generate(PROMPTS, p) for p in PARAMS]


def _same(a, b):
    return all(torch.equal(x.responses, y.responses) and torch.equal(x.log_probs, y.log_probs) for x, y in zip(a, b))


def test_compiled_engine_sees_updates_streamed_in_shuffled_chunks(engines):
    build, _, a, b = engines
    compiled = build(enforce_eager=False)
    compiled.update_weights(a.items())
    before = _generations(compiled)
    items = list(b.items())
    random.Random(0).shuffle(items)
    chunks = [items[i:i + 3] for i in range(0, len(items), 3)]
    where = {name: i for i, chunk in enumerate(chunks) for name, _ in chunk}
    assert any(len({where[f"model.layers.{layer}.self_attn.{p}_proj.weight"] for p in "qkv"}) > 1
               for layer in range(2)), "the shuffle must put a layer's q/k/v in different chunks"
    compiled.update_weights_chunks(chunks)
    after = _generations(compiled)
    assert not torch.equal(after[0].responses, before[0].responses)  # the update reached the compiled graph

    fresh = build(enforce_eager=False)  # a compiled engine that only ever held the new weights
    fresh.update_weights(b.items())
    assert _same(after, _generations(fresh))

    eager = build(enforce_eager=True)  # compiled and eager kernels: same greedy tokens, log-probs ~1e-6
    eager.update_weights(b.items())
    greedy = eager.generate(PROMPTS, PARAMS[0])
    assert torch.equal(greedy.responses, after[0].responses)
    assert (greedy.log_probs - after[0].log_probs).abs().max() <= 1e-4

    compiled.update_weights(a.items())  # back to the old weights: the old generations, bit for bit
    assert _same(_generations(compiled), before)
