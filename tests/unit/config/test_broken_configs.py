"""Each broken config stops with one plain sentence naming the key, before anything starts."""
from pathlib import Path

import pytest

import ray_gpt

A = "actor_rollout_ref.actor_rollout"
TINY = "grpo_trainer_tiny"

CASES = [
    # (id, overrides, expected fragments of the message)
    ("typo-role-key", [f"{A}.tensor_model_paralel_size=2"], ["tensor_model_paralel_size", "did you mean `tensor_model_parallel_size`"]),
    ("typo-training-key", ["training.global_batch_sise=4"], ["training.global_batch_sise", "global_batch_size"]),
    ("ppo-critic-section", ["critic.lr=1e-6"], ["critic", "GRPO"]),
    ("unknown-algorithm-key", ["algorithm.adv_estimater=grpo"], ["algorithm.adv_estimater", "adv_estimator"]),
    ("tp-not-dividing-heads", [f"{A}.tensor_model_parallel_size=3", "resource_pool.actor_rollout=[3]", "training.global_batch_size=3", f"{A}.ppo_mini_batch_size=3", f"{A}.micro_batch_size=8"],
     ["tensor_model_parallel_size: 3", "num_attention_heads 4"]),
    ("pp-not-dividing-layers", [f"{A}.pipeline_model_parallel_size=4", "resource_pool.actor_rollout=[4]", f"{A}.micro_batch_size=32"],
     ["pipeline_model_parallel_size: 4", "num_layers 2"]),
    ("vpp-without-pp", [f"{A}.virtual_pipeline_model_parallel_size=2"],
     ["virtual_pipeline_model_parallel_size: 2` needs pipeline_model_parallel_size > 1"]),
    ("recompute-granularity", [f"{A}.recompute_granularity=partial"], ["recompute_granularity: partial` is not supported"]),
    ("tp-pp-vs-devices", [f"{A}.tensor_model_parallel_size=2", "resource_pool.actor_rollout=[3]"], ["= 2 does not divide its 3 training devices"]),
    ("train-infer-split", [f"{A}.num_gpus_for_train=1", f"{A}.num_gpus_for_infer=2", "resource_pool.actor_rollout=[2]"], ["num_gpus_for_train: 1", "must add up to the 2 devices"]),
    ("gbs-vs-mini", ["training.global_batch_size=10", f"{A}.ppo_mini_batch_size=4"], ["global_batch_size: 10", "ppo_mini_batch_size: 4"]),
    ("mini-vs-micro", [f"{A}.micro_batch_size=48"], ["micro_batch_size 48"]),
    ("temperature-zero", [f"{A}.temperature=0"], ["temperature: 0.0", "do_sample: false"]),
    ("bad-estimator", ["algorithm.adv_estimator=ppo_gae"], ["algorithm.adv_estimator: ppo_gae", "group_norm"]),
    ("unknown-verifier", ["algorithm.verifier_function=[nope]"], ["`nope` is not a verifier"]),
    ("verifier-weights", ["algorithm.verifier_weight=[0.5,0.5]"], ["verifier_weight` has 2"]),
    ("missing-load", [f"{A}.load=/nonexistent/ckpt"], ["load: /nonexistent/ckpt` does not exist"]),
    ("missing-tokenizer", ["training.tokenizer_name_or_path=/nonexistent/tok"], ["tokenizer_name_or_path: /nonexistent/tok` does not exist"]),
    ("missing-data", [f"{A}.data_path=/nonexistent/gsm8k"], ["data_path: /nonexistent/gsm8k", "preprocess_data.py"]),
    ("wrong-type", ["training.train_iters=abc"], ["`training.train_iters` must be an integer"]),
    ("bf16-and-fp16", ["training.bf16=true", "training.fp16=true"], ["bf16 and fp16 are both true"]),
    ("stochastic-rounding-without-bf16", [f"{A}.bf16_stochastic_rounding=true"],
     ["bf16_stochastic_rounding: true", "bf16` is false", "set bf16: true"]),
    ("empty-actor-pool", ["resource_pool.actor_rollout=[]"], ["resource_pool.actor_rollout` is empty"]),
    ("bad-pool-entry", ["resource_pool.ref=[0]"], ["resource_pool.ref", "positive device counts"]),
    ("ppo-stage", ["training.stage=ray_ppo"], ["training.stage: ray_ppo", "ray_grpo"]),
    ("reward-model-without-load", ["resource_pool.reward=[1]"], ["reward.load` is not set"]),
    ("no-room-for-response", ["training.seq_length=16"], ["leaves no room for a response"]),
    ("undefined-model", [f"{A}.model=llama9"], ["model: llama9` names no model file entry", "tiny"]),
    ("sequence-parallel-tp1", [f"{A}.sequence_parallel=true"], ["sequence_parallel: true` needs tensor_model_parallel_size > 1"]),
    ("no-reward-at-all", ["reward.verifier=false"], ["no reward"]),
    ("dual-clip", [f"{A}.clip_ratio_c=0.5"], ["clip_ratio_c: 0.5", "> 1"]),
    ("bad-truncation", [f"{A}.truncation=middle"], ["truncation: middle", "filter"]),
    ("blended-data-path", [f"{A}.data_path='1,a,b'"], ["weight,prefix"]),
    # range checks (config/ranges.py)
    ("negative-clip-ratio", [f"{A}.clip_ratio=-0.1"], ["clip_ratio: -0.1` must be in [0, 1)"]),
    ("clip-low-at-one", [f"{A}.clip_ratio_low=1.0"], ["clip_ratio_low: 1.0` must be in [0, 1)"]),
    ("negative-kl-loss-coef", [f"{A}.kl_loss_coef=-0.01"], ["kl_loss_coef: -0.01` must be >= 0"]),
    ("negative-kl-ctrl-coef", ["algorithm.kl_ctrl.kl_coef=-1"], ["algorithm.kl_ctrl.kl_coef: -1.0` must be >= 0"]),
    ("zero-target-kl", ["algorithm.kl_ctrl.target_kl=0"], ["target_kl: 0.0` must be > 0"]),
    ("negative-lr", [f"{A}.lr=-1e-6"], ["lr: -1e-06` must be in [0, 1]"]),
    ("min-lr-above-lr", [f"{A}.lr=1e-6", f"{A}.min_lr=1e-5", f"{A}.lr_decay_style=cosine"], ["min_lr: 1e-05` is above lr"]),
    ("warmup-fraction", [f"{A}.lr_warmup_fraction=1.5"], ["lr_warmup_fraction: 1.5` must be in [0, 1]"]),
    ("adam-beta2-one", ["training.adam_beta2=1.0"], ["adam_beta2: 1.0` must be in [0, 1)"]),
    ("adam-eps-zero", [f"{A}.adam_eps=0"], ["adam_eps: 0.0` must be in (0, 1)"]),
    ("negative-weight-decay", [f"{A}.weight_decay=-0.1"], ["weight_decay: -0.1` must be >= 0"]),
    ("top-p-zero", [f"{A}.top_p=0"], ["top_p: 0.0` must be in (0, 1]"]),
    ("negative-top-k", [f"{A}.top_k=-2"], ["top_k: -2` must be >= 0"]),
    ("zero-micro-batch", [f"{A}.micro_batch_size=0"], ["micro_batch_size: 0` must be at least 1"]),
    ("zero-global-batch", ["training.global_batch_size=0"], ["global_batch_size: 0` must be at least 1"]),
    ("negative-save-interval", ["training.save_interval=-5"], ["save_interval: -5` must be 0 or more"]),
    ("zero-log-interval", ["training.log_interval=0"], ["log_interval: 0` must be >= 1"]),
    ("negative-test-freq", ["training.test_freq=-1"], ["test_freq: -1` must be >= 0"]),
    ("gamma-above-one", ["algorithm.gamma=1.5"], ["algorithm.gamma: 1.5` must be in [0, 1]"]),
    ("dropout-one", [f"{A}.hidden_dropout=1.0"], ["hidden_dropout: 1.0` must be in [0, 1)"]),
    ("rotary-percent", [f"{A}.rotary_percent=0"], ["rotary_percent: 0.0` must be in (0, 1]"]),
    ("rope-scaling-type", [f"{A}.rope_scaling_type=dynamic"],
     ["rope_scaling_type: dynamic` is not supported; use one of: linear, llama3, longrope, yarn, proportional, or null."]),
    ("yarn-beta", [f"{A}.rope_scaling_beta_fast=0"], ["rope_scaling_beta_fast: 0.0` must be > 0"]),
    ("partial-yarn-npu", [f"{A}.rotary_percent=0.5", f"{A}.rope_scaling_type=yarn", "training.platform=npu"],
     ["yarn with rotary_percent 0.5 (partial rotary, e.g. Phi-4-mini) scales cos and sin of the rotated part only, "
      "which MindSpeed's fused rotary kernel on NPU does not do; run it on CPU or CUDA."]),
    ("yarn-local-rope-npu", [f"{A}.rope_local_base_freq=10000", f"{A}.rope_scaling_type=yarn", "training.platform=npu"],
     ["yarn with rope_local_base_freq (sliding layers with the default rope, e.g. OLMo 3) scales cos and sin of the "
      "full layers only, which MindSpeed's fused rotary kernel on NPU does not do; run it on CPU or CUDA."]),
    ("softcap-npu", [f"{A}.attn_logit_softcapping=50", "training.platform=npu"],
     ["attn_logit_softcapping 50.0 (Gemma 2) is not supported on npu: its fused attention kernel does not soft-cap "
      "the scores; run it on CPU or CUDA."]),
    ("zero-softcap", [f"{A}.output_logit_softcapping=0"], ["output_logit_softcapping: 0.0` must be"]),
    ("window-pattern", [f"{A}.window_attn_skip_freq=[1,0,1]"], ["window_attn_skip_freq [1, 0, 1] must hold one 0 or 1 "
                                                                 "per layer"]),
    ("geglu-and-swiglu", [f"{A}.geglu=true"], ["geglu and swiglu are both true; set swiglu: false"]),
    ("squared-relu-and-swiglu", [f"{A}.squared_relu=true"], ["squared_relu is true together with swiglu; set swiglu: false"]),
    ("openai-gelu-and-swiglu", [f"{A}.openai_gelu=true"], ["openai_gelu is true together with swiglu; set swiglu: false"]),
    ("xielu-and-swiglu", [f"{A}.xielu=true"], ["xielu is true together with swiglu; set swiglu: false for an xIELU MLP"]),
    ("no-norm", [f"{A}.pre_norm=false"], ["pre_norm: false leaves its layers without any norm; set post_norm: true"]),
    ("across-heads-alone", [f"{A}.qk_layernorm_across_heads=true"], ["qk_layernorm_across_heads needs qk_layernorm: true"]),
    ("layernorm-qk-norms", [f"{A}.normalization=LayerNorm", f"{A}.qk_layernorm=true"],
     ["normalization: LayerNorm` with qk_layernorm is not supported", "set normalization: RMSNorm or drop qk_layernorm"]),
    ("layernorm-1p-on-rmsnorm", [f"{A}.apply_layernorm_1p=true"],
     ["apply_layernorm_1p: true` needs normalization: LayerNorm", "set add_rmsnorm_offset: true instead"]),
    ("parallel-residual-post-norm", [f"{A}.parallel_residual=true", f"{A}.post_norm=true"],
     ["parallel_residual (Cohere's attention and MLP on the same normed input) is supported on dense layers with one "
      "norm before both only; post_norm: true is not"]),
    ("mlp-norm-without-parallel-residual", [f"{A}.parallel_residual_mlp_norm=true"],
     ["parallel_residual_mlp_norm (GPT-NeoX's own norm for the MLP in a parallel-residual layer) needs "
      "parallel_residual: true; set it, or drop parallel_residual_mlp_norm."]),
    ("non-parametric-post-norm", [f"{A}.layernorm_affine=false", f"{A}.post_norm=true"],
     ["layernorm_affine: false (norms without weight or bias: OLMo 1's LayerNorm, nanochat's RMSNorm) needs "
      "normalization LayerNorm or RMSNorm without apply_layernorm_1p, add_rmsnorm_offset, layernorm_bias: false, "
      "post_norm or qk_layernorm_across_heads; this model has post_norm."]),
    ("embedding-norm-with-weights", [f"{A}.embedding_norm=true"],
     ["embedding_norm (nanochat's weightless RMSNorm on the embeddings) needs normalization: RMSNorm with "
      "layernorm_affine: false."]),
    ("negated-rope-with-local-rope", [f"{A}.rotary_negated=true", f"{A}.rope_local_base_freq=10000",
                                      f"{A}.sliding_window=8", f"{A}.window_attn_skip_freq=2"],
     ["rotary_negated (nanochat's RoPE) turns the model's one rotary table; rope_local_base_freq has another: remove "
      "one of them."]),
    ("negative-clip-qkv", [f"{A}.clip_qkv=-1"],
     ["`actor_rollout_ref.actor_rollout.clip_qkv: -1.0` must be > 0; it is the queries, keys and values clamped"]),
    ("clip-qkv-on-mla", [f"{A}.clip_qkv=8", f"{A}.multi_latent_attention=true"],
     ["clip_qkv (OLMo's q / k / v clamp) needs attention with one q / k / v projection, not multi_latent_attention."]),
    ("weight-only-rmsnorm", [f"{A}.layernorm_bias=false"],
     ["layernorm_bias: false (Cohere's weight-only LayerNorm) needs normalization: LayerNorm, not RMSNorm."]),
    ("zero-verifier-timeout", ["algorithm.verifier_timeout_s=0"], ["verifier_timeout_s: 0.0` must be > 0"]),
    ("nan-lr", [f"{A}.lr=.nan"], [f"`{A}.lr` must be a number"]),
    ("zero-tp", [f"{A}.tensor_model_parallel_size=0"], ["tensor_model_parallel_size: 0` must be >= 1"]),
    ("negative-eos-penalty", ["algorithm.missing_eos_penalty=-1"], ["missing_eos_penalty: -1.0` must be >= 0"]),
    ("zero-max-prompt", [f"{A}.max_prompt_length=0"], ["max_prompt_length: 0` must be >= 1"]),
    # Mamba-2 layers (Granite 4.0-H) and Gated DeltaNet ones (Qwen3.5): marks, sizes, TP
    ("mamba-marks", ["training.mamba_layers=[1,0,1]"], ["mamba_layers must list one 0 or 1 per layer (2 layers)"]),
    ("mamba-sizes", ["training.mamba_layers=[1,0]", "training.mamba_num_heads=4"],
     ["mamba_layers marks Mamba-2 layers but mamba_head_dim, mamba_state_dim are not set"]),
    ("mamba-tp", ["training.mamba_layers=[1,0]", "training.mamba_num_heads=6", "training.mamba_head_dim=8",
                  "training.mamba_state_dim=8", "training.num_attention_heads=4", f"{A}.tensor_model_parallel_size=4",
                  "resource_pool.actor_rollout=[4]", f"{A}.micro_batch_size=8"],
     ["tensor_model_parallel_size 4 does not divide mamba_num_heads 6"]),
    ("mamba-and-delta-net", ["training.mamba_layers=[1,0]", "training.linear_attention_layers=[0,1]"],
     ["mamba_layers and linear_attention_layers are both set"]),
    # attention and Mamba-2 side by side (Falcon-H1: parallel_hybrid)
    ("parallel-hybrid-and-mamba-layers", ["training.parallel_hybrid=true", "training.mamba_layers=[1,0]"],
     ["parallel_hybrid (attention and Mamba-2 side by side in every layer, Falcon-H1) cannot go with mamba_layers; "
      "drop it."]),
    ("parallel-hybrid-sizes", ["training.parallel_hybrid=true", "training.mamba_num_heads=4"],
     ["parallel_hybrid needs the Mamba-2 sizes, but mamba_head_dim, mamba_state_dim are not set"]),
    ("parallel-hybrid-multipliers", ["training.parallel_hybrid=true", "training.mamba_num_heads=4",
                                     "training.mamba_head_dim=8", "training.mamba_state_dim=8",
                                     "training.mamba_in_multipliers=[1,2]"],
     ["mamba_in_multipliers must list 5 numbers (z, x, B, C, dt: Falcon-H1's ssm_multipliers); it is [1, 2]."]),
    # LFM2's short-convolution layers
    ("short-conv-marks", ["training.short_conv_layers=[1,0,1]"],
     ["short_conv_layers must list one 0 or 1 per layer (2 layers); it is [1, 0, 1]."]),
    ("short-conv-and-mamba", ["training.short_conv_layers=[1,0]", "training.mamba_layers=[0,1]",
                              "training.mamba_num_heads=4", "training.mamba_head_dim=8", "training.mamba_state_dim=8"],
     ["short_conv_layers (LFM2's conv layers) cannot go with mamba_layers; a model mixes tokens with one kind of layer "
      "beside attention."]),
    ("short-conv-kernel", ["training.short_conv_layers=[1,0]", "training.short_conv_kernel=0"],
     ["short_conv_kernel"]),
    # one block per layer (Nemotron-H: hybrid_override_pattern)
    ("pattern-symbol", ["training.hybrid_override_pattern=MX"],
     ["hybrid_override_pattern has 'X'; each character must be one of M (Mamba-2), * (attention), - (MLP), E (MoE)."]),
    ("pattern-length", ["training.hybrid_override_pattern=M-*"],
     ["hybrid_override_pattern has 3 characters but num_layers is 2; give one per layer."]),
    ("pattern-moe", ["training.hybrid_override_pattern=E-"], ["hybrid_override_pattern 'E-' has MoE layers (E) but "
                                                              "num_experts is not set"]),
    ("pattern-vs-mamba-layers", ["training.hybrid_override_pattern=M*", "training.mamba_layers=[0,1]"],
     ["hybrid_override_pattern 'M*' puts Mamba-2 in other layers than mamba_layers [0, 1]; drop mamba_layers"]),
    ("pattern-post-norm", ["training.hybrid_override_pattern=*-", f"{A}.post_norm=true"],
     ["its layers have one norm before their one block"]),
    ("delta-net-sizes", ["training.linear_attention_layers=[1,0]"],
     ["linear_attention_layers marks Gated DeltaNet layers but linear_num_key_heads"]),
    # Gemma 4's keys (models/gemma4.py)
    ("sliding-sizes-without-pattern", ["training.sliding_num_query_groups=2"],
     ["sliding_kv_channels / sliding_num_query_groups size the sliding-window layers, which window_attn_skip_freq names"]),
    ("sliding-head-dim-without-table", ["training.sliding_kv_channels=16", "training.window_attn_skip_freq=[1,0]"],
     ["sliding_kv_channels 16 needs rope_local_base_freq"]),
    ("proportional-without-proportion", ["training.rope_scaling_type=proportional"],
     ["rope_scaling_type proportional and rope_proportion go together"]),
    ("proportion-out-of-range", ["training.rope_scaling_type=proportional", "training.rope_proportion=1.5"],
     ["rope_proportion: 1.5", "in (0, 1]"]),
    ("dense-beside-without-experts", ["training.moe_dense_beside=true"],
     ["moe_dense_beside puts experts beside each layer's dense MLP, but num_experts is None"]),
    # Gemma 4 E2B / E4B's keys (models/gemma4.py)
    ("per-layer-inputs-without-table", ["training.per_layer_input_size=8"],
     ["per_layer_input_size 8 needs per_layer_input_vocab_size"]),
    ("per-layer-table-over-tp", ["training.per_layer_input_size=8", "training.per_layer_input_vocab_size=121",
                                 "training.tensor_model_parallel_size=2"],
     ["does not divide per_layer_input_vocab_size 121"]),
    ("per-layer-inputs-with-pp", ["training.per_layer_input_size=8", "training.per_layer_input_vocab_size=128",
                                  "training.pipeline_model_parallel_size=2"],
     ["with per_layer_input_size of model", "use pipeline_model_parallel_size 1"]),
    ("kv-sharing-full-recompute", ["training.num_kv_shared_layers=1", "training.recompute_granularity=full"],
     ["recompute_granularity: full` with num_kv_shared_layers", "use recompute_granularity: selective or none"]),
    ("kv-sharing-all-layers", ["training.num_kv_shared_layers=2"],
     ["num_kv_shared_layers 2 leaves no layer of 2 with keys and values of its own"]),
    ("kv-sharing-no-source-of-its-kind", ["training.num_kv_shared_layers=1", "training.sliding_window=8",
                                          "training.window_attn_skip_freq=[0,1]"],
     ["layer 1 (sliding attention) has no earlier layer of its kind"]),
    ("double-mlp-without-sharing", ["training.kv_shared_double_mlp=true"],
     ["kv_shared_double_mlp widens the MLPs of the num_kv_shared_layers layers, but num_kv_shared_layers is 0"]),
    ("kv-sharing-negative", ["training.num_kv_shared_layers=-1"], ["num_kv_shared_layers: -1"]),
    # freeze_parameters (models/freeze.py): each pattern names a parameter of the model, some are left to train
    ("freeze-matches-nothing", [f"{A}.freeze_parameters=[embedding.per_layer.embeddings.weight]"],
     ["freeze_parameters`: 'embedding.per_layer.embeddings.weight' matches no parameter of the model, whose names look "
      "like embedding.word_embeddings.weight"]),
    ("freeze-everything", [f"{A}.freeze_parameters=[embedding.*,decoder.*]"], ["freezes every parameter of the model"]),
    # the user's own data with the tiny default and no tokenizer
    ("own-data-no-tokenizer", [f"{A}.data_path={Path(__file__).resolve().parents[2] / 'data/gsm8k_slice/train.jsonl'}"],
     ["is your own data, but no tokenizer is set", "training.tokenizer_name_or_path"]),
]


@pytest.mark.parametrize("overrides,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_broken_config_message(overrides, fragments, capsys):
    code = ray_gpt.main(["--config-name", TINY, *overrides, "dry_run=true"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    for frag in fragments:
        assert frag in err, f"{frag!r} not in {err!r}"


def test_pp2_actor_generating_with_native_engine_validates(capsys):
    """Pipeline-parallel generation is supported (rollout/native.py): PP=2 on the train+generate ranks plans."""
    code = ray_gpt.main(["--config-name", TINY, f"{A}.pipeline_model_parallel_size=2", "resource_pool.actor_rollout=[2]",
                         "dry_run=true"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ranks 0-1: train+generate" in captured.out


def test_unknown_config_name_lists_available(capsys):
    assert ray_gpt.main(["--config-name", "grpo_trainer_nope", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "grpo_trainer_nope" in err and "grpo_trainer_tiny" in err


def test_bad_cli_argument():
    with pytest.raises(SystemExit) as exc:
        ray_gpt.main(["--config-name", TINY, "--frobnicate"])
    assert exc.value.code == 2
