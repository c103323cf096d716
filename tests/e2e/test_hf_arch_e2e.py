"""ray_gpt.py runs every builder architecture from its config.json alone (empty model yaml).

The acceptance command of issue 14: `python ray_gpt.py --config-name X ...actor_rollout.load=DIR
...ref.load=DIR training.tokenizer_name_or_path=DIR` with a model entry that sets no key.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from testing_utils import HF_VARIANTS, make_tiny_hf, with_extended

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "ray_gpt_configs"
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# random weights whose rollouts earn some reward (all-zero rewards give zero advantages and no
# gradient): the image-text Gemma 3 with seed 0 earns none in its first step, the tiny Granite MoE with seeds 0,
# 1 and 3 none, the tiny Granite 4.0-H with seed 0 the same reward within each group of its first step
OVERRIDES = {"gemma3": {"seed": 1}, "granitemoeshared": {"seed": 2}, "granitemoehybrid-h": {"seed": 1}}


# one run per kind of checkpoint in CI: a MoE under its own expert names (mixtral), an image-text checkpoint's text
# model (gemma3), multi-latent attention with GLM-4.5's MoE layout and the expert bias (deepseek_v3) and Gated
# DeltaNet layers (qwen3_5), Mamba-2 layers beside attention without RoPE (granitemoehybrid-h: Granite 4.0-H's
# layout, since 2026-11-30). The `extended` cases (pytest --extended) run the other layouts the same way: each passed
# here on 2026-11-29 and each architecture's reading, writing, parity and decode have their own unit tests; CI leaves
# them out for its time (~7 min of a worker; phi3's fused q / k / v and gate / up and gpt_oss's MXFP4 release since
# 2026-11-30, ~3.5 min more: tests/unit/models/test_hf_bridge_io.py still reads and writes both layouts in CI and
# tests/vllm syncs gpt_oss). Llama from config.json is tests/real_model's SmolLM2 run. glm4_moe_lite
# (DeepSeek-V3's layers under its own model_type), qwen3_5_moe (qwen3_5's layers with Qwen2-MoE's experts) and
# gpt_neox (Pythia: its own names and per-head query_key_value) also passed here; the branches below handle them.
CI_ARCHS = ("mixtral", "gemma3", "deepseek_v3", "qwen3_5", "granitemoehybrid-h")
EXTENDED_ARCHS = ("phi3", "gpt_oss", "mistral3", "olmo3", "qwen2_5_vl", "glm4_moe", "minimax_m2", "ernie4_5_moe", "apertus", "qwen3_next",
                  "flex_olmo", "hunyuan_v1_moe", "granitemoeshared", "glm4_moe_lite", "qwen3_5_moe", "gpt_neox",
                  "nemotron_h", "nemotron_h-moe", "falcon_h1", "lfm2", "lfm2_moe", "exaone", "lfm2_vl", "exaone_moe", "hyperclovax", "hy_v3", "afmoe", "sarvam_moe", "sarvam_mla", "jais2", "mellum", "gemma4", "gemma4_text-moe", "gemma4_text-ple", "internlm3", "youtu", "mimo", "nanochat", "vaultgemma", "dots1", "solar_open")


@pytest.mark.parametrize("arch", with_extended(CI_ARCHS, EXTENDED_ARCHS))
def test_empty_model_yaml_runs(arch, tmp_path):
    """phi3 (q/k/v and gate/up stored fused), mixtral (its own expert names) and gemma3 (its text
    model's own norm names) also export at the end (save_hf): the HF checkpoint has the original's tensor names
    and shapes (vocabulary rows included), and transformers loads it. gemma3 (Gemma 3 4B+'s image-text
    checkpoint), mistral3 (Mistral Small 3.1's) and qwen2_5_vl (Qwen2.5-VL's) train their text model
    and export that (Gemma3ForCausalLM, MistralForCausalLM, Qwen2ForCausalLM), the language model's
    tensors under their text-model names. glm4_moe (GLM-4.5: a dense first layer, sigmoid routing with
    the checkpoint's expert bias, shared_experts) exports its tensors under GLM-4.5's names, the expert
    bias unchanged (moe_router_bias_update_rate 0). deepseek_v3 (DeepSeek-V3: multi-latent attention on
    GLM-4.5's MoE layout) trains, generates with the native engine's MLA cache and exports under DeepSeek's
    names (q_a_layernorm, kv_a_proj_with_mqa, ...); glm4_moe_lite (GLM-4.7-Flash) does the same under its own
    model_type. gpt_oss starts from its release format (MXFP4 experts,
    read dequantized), trains with its sinks and biased experts and exports them stacked as gpt-oss stores
    them unquantized, the quantization_config dropped: transformers loads the export. minimax_m2 (MiniMax-M2:
    q / k norms across heads, sigmoid routing with the expert bias beside the router, Mixtral's expert names)
    exports under its own names, the bias as it was read; ernie4_5_moe (ERNIE 4.5 MoE: softmax routing with the
    expert bias, which megatron lacks) exports its (1, E) bias as it was read; apertus (Apertus: xIELU with per-layer
    scalars, norms named for what they precede) trains its scalars and exports them and its 0-d buffers; qwen3_5
    (Qwen3.5's image-text checkpoint: Gated DeltaNet and output-gated attention) trains its text model, generates
    with the native engine carrying the DeltaNet state, and exports Qwen3_5ForCausalLM; qwen3_5_moe (Qwen3.5-MoE's:
    the same with Qwen2-MoE's experts) exports Qwen3_5MoeForCausalLM with its per-expert tensors; qwen3_next
    (Qwen3-Next: those layers with the DeltaNet projections fused per key head) exports in_proj_qkvz / in_proj_ba;
    flex_olmo (FlexOlmo: OLMoE's experts and q / k norms across heads under OLMo 2's post norms, which OLMoE's own
    layout adds nothing to here) exports under OLMo 2's norm names; hunyuan_v1_moe (HunYuan-MoE: q / k norms after RoPE,
    NTK alpha) trains, generates with the native engine and exports query_layernorm / key_layernorm, its router as
    gate.wg and its shared MLP under the config.json it started from, which transformers loads; granitemoeshared
    (Granite MoE: Granite's multipliers, a shared MLP without a gate) exports its experts stacked as
    block_sparse_moe.input_linear / output_linear and its shared MLP's gate / up fused, as Granite stores them;
    granitemoehybrid-h (Granite 4.0-H: a Mamba-2 layer and attention without RoPE) trains, generates with the native
    engine carrying the Mamba-2 conv history and state, and exports its in_proj / conv1d whole, as Granite stores them."""
    hf = tmp_path / "hf"
    if arch == "gpt_oss":
        from testing_utils import mxfp4_gpt_oss

        make_tiny_hf(arch, str(tmp_path / "bf"))
        mxfp4_gpt_oss(str(tmp_path / "bf"), str(hf))
    else:
        make_tiny_hf(arch.split("-")[0], str(hf), **{**HF_VARIANTS.get(arch, {}), **OVERRIDES.get(arch, {})})
    from mindspeed_rl.data import tiny_task
    tok = tiny_task.TOKENIZER_DIR  # the tiny task's 13-token tokenizer fits the 120-row embedding
    own_names = arch in ("phi3", "mixtral", "gemma3", "mistral3", "olmo3", "qwen2_5_vl", "glm4_moe", "deepseek_v3",
                         "glm4_moe_lite", "gpt_oss", "minimax_m2", "ernie4_5_moe", "apertus", "qwen3_5", "qwen3_5_moe",
                         "qwen3_next", "flex_olmo", "hunyuan_v1_moe", "granitemoeshared", "gpt_neox",
                         "granitemoehybrid-h", "nemotron_h", "nemotron_h-moe", "falcon_h1", "lfm2", "lfm2_moe", "exaone", "lfm2_vl", "exaone_moe", "hyperclovax", "hy_v3", "afmoe", "sarvam_moe", "sarvam_mla", "jais2", "mellum", "gemma4", "gemma4_text-moe", "gemma4_text-ple", "internlm3", "youtu", "mimo", "nanochat", "vaultgemma", "dots1", "solar_open")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ray_gpt.py"), "--config-dir", str(CONFIGS), "--config-name", "grpo_trainer_hf_any",
         f"actor_rollout_ref.actor_rollout.load={hf}", f"actor_rollout_ref.ref.load={hf}",
         f"training.tokenizer_name_or_path={tok}", f"training.output_dir={tmp_path / 'out'}",
         f"training.save_hf={str(own_names).lower()}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 for r in rows)  # the loaded model trained
    if own_names:
        import transformers
        from safetensors import safe_open

        exported = tmp_path / "out" / "checkpoints" / "hf"

        def shapes(d):
            with safe_open(str(d / "model.safetensors"), "pt") as f:
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        # the embedding keeps config.json's 120 rows although the run's tokenizer has 13 ids (the
        # export wrote 13 under a config.json saying 120 before, which transformers refused to load)
        want = shapes(tmp_path / "bf" if arch == "gpt_oss" else hf)  # gpt-oss: written unquantized
        if arch == "gpt_oss":
            assert "quantization_config" not in json.loads((exported / "config.json").read_text())
        if arch in ("gemma3", "mistral3"):  # the text model alone, under its own names
            want = {n[len("language_model."):]: s for n, s in want.items() if n.startswith("language_model.")}
        if arch == "mimo":  # exported as the Qwen2 it is: its multi-token-prediction layer has no Qwen2 form
            want = {n: s for n, s in want.items() if not n.startswith("model.mtp_layers.")}
        if arch == "qwen2_5_vl":  # its hub layout names the text model's tensors as a Qwen2 does
            want = {n: s for n, s in want.items() if not n.startswith("visual.")}
        if arch in ("qwen3_5", "qwen3_5_moe", "lfm2_vl", "gemma4"):  # transformers 5's layout: the text model under model.language_model.
            want = {n.replace("model.language_model.", "model.", 1): s for n, s in want.items()
                    if n.startswith(("model.language_model.", "lm_head."))}
        if arch in ("gemma3", "mistral3", "qwen2_5_vl", "qwen3_5", "qwen3_5_moe", "lfm2_vl", "gemma4"):
            text_cls = {"gemma3": "Gemma3ForCausalLM", "mistral3": "MistralForCausalLM", "gemma4": "Gemma4ForCausalLM",
                        "qwen2_5_vl": "Qwen2ForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM",
                        "qwen3_5_moe": "Qwen3_5MoeForCausalLM", "lfm2_vl": "Lfm2ForCausalLM"}[arch]
            assert json.loads((exported / "config.json").read_text())["architectures"] == [text_cls]
        assert shapes(exported) == want
        transformers.AutoModelForCausalLM.from_pretrained(str(exported))
        if arch in ("glm4_moe", "deepseek_v3", "glm4_moe_lite", "minimax_m2", "ernie4_5_moe"):  # the expert bias chose experts in training and is written back as it was read
            from safetensors.torch import load_file

            before, after = load_file(str(hf / "model.safetensors")), load_file(str(exported / "model.safetensors"))
            bias = [n for n in before if n.endswith("e_score_correction_bias")]
            assert bias and all(torch.equal(before[n], after[n]) for n in bias)
        if arch == "apertus":  # xIELU's scalars trained (alpha_p / alpha_n moved), its buffers written back as read
            from safetensors.torch import load_file

            before, after = load_file(str(hf / "model.safetensors")), load_file(str(exported / "model.safetensors"))
            scalars = [n for n in before if ".mlp.act_fn." in n]
            assert len(scalars) == 4 * 2 and all(after[n].shape == before[n].shape for n in scalars)
            assert any(not torch.equal(before[n], after[n]) for n in scalars if n.endswith(("alpha_p", "alpha_n")))
            assert all(torch.equal(before[n], after[n]) for n in scalars if n.endswith(("beta", "eps")))
