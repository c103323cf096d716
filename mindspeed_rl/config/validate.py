"""Cross-field checks of a Config, before any Ray worker starts.

Each problem is one plain sentence naming the key(s), the values and the fix. All problems found
are reported together (one per line) so a user fixes a config in one round.
The check against the live Ray cluster is in distributed/plan.py (it needs the cluster).
"""
from __future__ import annotations

import os

from mindspeed_rl.config.schema import Config, RoleConfig
from mindspeed_rl.config.gemma4_rules import gemma4_problems
from mindspeed_rl.config.mixer_checks import mixer_problems
from mindspeed_rl.config.vllm_checks import check_vllm
from mindspeed_rl.utils.errors import UserInputError

A = "actor_rollout_ref.actor_rollout"
CHOICES = {
    "training.stage": ("ray_grpo",),
    "training.tokenizer_type": ("PretrainedFromHF",),
    "truncation": ("error", "left", "right", "filter"),
    "lr_decay_style": ("constant", "linear", "cosine"),
    "rollout_engine": ("megatron", "vllm"),
    "normalization": ("RMSNorm", "LayerNorm"),
    "position_embedding_type": ("rope",),
}


def validate(cfg: Config, check_paths: bool = True) -> None:
    problems: list[str] = []
    _check_ranges(cfg, problems)
    if problems:  # the checks below divide by and compare these values: they must be in range first
        raise UserInputError("\n".join(dict.fromkeys(problems)))
    _check_choices(cfg, problems)
    _check_tokenizer(cfg, problems)
    _check_devices(cfg, problems)
    _check_batches(cfg, problems)
    for role in _active_roles(cfg):
        _check_role(role, cfg, problems)
    _check_algorithm(cfg, problems)
    if check_paths:
        _check_paths(cfg, problems)
    _check_freeze(cfg.actor, problems)
    if problems:
        raise UserInputError("\n".join(dict.fromkeys(problems)))


def _check_freeze(role: RoleConfig, problems: list[str]) -> None:
    """The actor's freeze_parameters against its model's parameter names (models/freeze.py), where the architecture
    is complete enough to name them (a missing size is reported elsewhere)."""
    patterns = role.optim.freeze_parameters
    if not patterns:
        return
    from dataclasses import asdict

    from mindspeed_rl.models.freeze import patterns_problem
    from mindspeed_rl.models.hf_bridge.sharding import stage_expert_names, stage_param_names
    try:
        args = asdict(role.arch)
        names = stage_param_names(args, 1, 0) + stage_expert_names(args, 1, 0, 1, 0)
    except (KeyError, TypeError, ValueError, UserInputError):
        names = None
    err = patterns_problem(patterns, names or [], f"{A}.freeze_parameters") if names or \
        not isinstance(patterns, (list, tuple)) else None
    if err:
        problems.append(err)


def _active_roles(cfg: Config) -> list[RoleConfig]:
    roles = [cfg.actor, cfg.ref]
    if cfg.resource_pool.reward:
        roles.append(cfg.reward)
    return roles


def role_path(role: RoleConfig) -> str:
    return {"actor_rollout": A, "ref": "actor_rollout_ref.ref", "reward": "reward"}[role.role]


def _one_of(value, options, key: str, problems: list[str]) -> None:
    if value not in options:
        problems.append(f"`{key}: {value}` is not supported; use one of: {', '.join(map(str, options))}.")


def _check_choices(cfg: Config, problems: list[str]) -> None:
    _one_of(cfg.run.stage, CHOICES["training.stage"], "training.stage", problems)
    _one_of(cfg.run.tokenizer_type, CHOICES["training.tokenizer_type"], "training.tokenizer_type", problems)
    from mindspeed_rl.models.hf_config import ROPE_SCALINGS
    from mindspeed_rl.platform.base import PLATFORM_NAMES
    _one_of(cfg.run.platform, ("auto", *PLATFORM_NAMES), "training.platform", problems)
    for key in ("save_interval", "keep_last_n", "max_skipped_updates"):
        if getattr(cfg.run, key) < 0:
            problems.append(f"`training.{key}: {getattr(cfg.run, key)}` must be 0 or more.")
    _one_of(cfg.data.truncation, CHOICES["truncation"], f"{A}.truncation", problems)
    from mindspeed_rl.data.templates import shaping_problem
    shaping = shaping_problem(cfg.data.prompt_type, cfg.data.system_prompt, cfg.data.instruction_template,
                              cfg.data.enable_thinking)
    if shaping:
        problems.append(f"`{A}`: {shaping}")
    for role in _active_roles(cfg):
        path = role_path(role)
        _one_of(role.optim.lr_decay_style, CHOICES["lr_decay_style"], f"{path}.lr_decay_style", problems)
        _one_of(role.arch.normalization, CHOICES["normalization"], f"{path}.normalization", problems)
        ln_extra = [k for k in ("qk_layernorm", "post_norm", "add_rmsnorm_offset") if getattr(role.arch, k)]
        if role.arch.normalization == "LayerNorm" and ln_extra:  # (their norms would be LayerNorms with biases)
            problems.append(f"`{path}.normalization: LayerNorm` with {' / '.join(ln_extra)} is not supported: the "
                            f"checkpoint bridge reads and writes LayerNorm biases before attention and MLP and at the "
                            f"end only (StableLM's layout); set normalization: RMSNorm or drop {ln_extra[0]}"
                            + (" (LayerNorms that scale by (1 + weight): apply_layernorm_1p: true)."
                               if "add_rmsnorm_offset" in ln_extra else "."))
        if role.arch.apply_layernorm_1p and role.arch.normalization != "LayerNorm":
            problems.append(f"`{path}.apply_layernorm_1p: true` needs normalization: LayerNorm (Nemotron's LayerNorm1P); "
                            f"for RMSNorms that scale by (1 + weight) set add_rmsnorm_offset: true instead.")
        _one_of(role.arch.position_embedding_type, CHOICES["position_embedding_type"], f"{path}.position_embedding_type", problems)
        if role.arch.rope_scaling_type not in ROPE_SCALINGS:
            problems.append(f"`{path}.rope_scaling_type: {role.arch.rope_scaling_type}` is not supported; use one of: "
                            f"{', '.join(s for s in ROPE_SCALINGS if s)}, or null.")
    _one_of(cfg.actor.rollout.rollout_engine, CHOICES["rollout_engine"], f"{A}.rollout_engine", problems)


def _check_ranges(cfg: Config, problems: list[str]) -> None:
    """Every numeric key against its range (config/ranges.py); a role's generation and update
    settings only matter for the actor."""
    from mindspeed_rl.config.ranges import range_problems

    for role in _active_roles(cfg):
        path = role_path(role)
        groups = [role, role.arch, role.parallel]
        if role.role == "actor_rollout":
            groups += [role.optim, role.rollout, role.ppo]
        for obj in groups:
            problems += range_problems(obj, path)
    problems += range_problems(cfg.run, "training") + range_problems(cfg.data, A)
    problems += range_problems(cfg.algorithm, "algorithm") + range_problems(cfg.algorithm.kl_ctrl, "algorithm.kl_ctrl")
    o = cfg.actor.optim
    if o.lr_decay_style != "constant" and o.min_lr > o.lr:
        problems.append(f"`{A}.min_lr: {o.min_lr}` is above lr {o.lr}; a decaying schedule ends at min_lr, so set it <= lr.")


def _check_tokenizer(cfg: Config, problems: list[str]) -> None:
    # the loader fills in the tiny task's tokenizer only for the tiny task's own data
    if cfg.run.tokenizer_name_or_path is None:
        problems.append(f"`{A}.data_path: {cfg.data.data_path}` is your own data, but no tokenizer is set; set "
                        f"`training.tokenizer_name_or_path` to the Hugging Face tokenizer directory the data was made "
                        f"with, or `{A}.load` to a Hugging Face checkpoint (its tokenizer is used).")


# ---------------------------------------------------------------------------- devices
def actor_split(cfg: Config) -> tuple[int, int]:
    """(training devices, generation-only devices) of the actor pool."""
    total = sum(cfg.resource_pool.actor_rollout)
    infer = cfg.actor.num_gpus_for_infer or 0
    train = cfg.actor.num_gpus_for_train if cfg.actor.num_gpus_for_train is not None else total - infer
    return train, infer


def role_devices(cfg: Config, role: RoleConfig) -> int:
    """Devices a role's model is sharded over (TP*PP*DP)."""
    if role.role == "actor_rollout":
        return actor_split(cfg)[0]
    pool = cfg.resource_pool.ref if role.role == "ref" else cfg.resource_pool.reward
    return sum(pool) if pool else actor_split(cfg)[0]  # an empty ref pool shares the actor's devices


def _check_devices(cfg: Config, problems: list[str]) -> None:
    pool = cfg.resource_pool
    if not pool.actor_rollout:
        problems.append("`resource_pool.actor_rollout` is empty; give the actor at least one device, e.g. [1].")
        return
    total = sum(pool.actor_rollout)
    train, infer = actor_split(cfg)
    if train + infer != total or train < 1:
        problems.append(f"`{A}.num_gpus_for_train: {cfg.actor.num_gpus_for_train}` + `num_gpus_for_infer: "
                        f"{cfg.actor.num_gpus_for_infer}` must add up to the {total} devices of "
                        f"`resource_pool.actor_rollout: {pool.actor_rollout}`; change one of them.")
        return
    tp, pp = cfg.actor.parallel.tensor_model_parallel_size, cfg.actor.parallel.pipeline_model_parallel_size
    if infer and infer % tp and cfg.actor.rollout.rollout_engine != "vllm":  # vllm: vllm_checks.check_vllm
        problems.append(f"`{A}.num_gpus_for_infer: {infer}` is not a multiple of tensor_model_parallel_size {tp}; "
                        f"generation ranks hold whole TP groups, so use a multiple of {tp}.")
    for role in _active_roles(cfg):
        n = role_devices(cfg, role)
        tp, pp = role.parallel.tensor_model_parallel_size, role.parallel.pipeline_model_parallel_size
        if tp < 1 or pp < 1 or n % (tp * pp):
            where = "resource_pool." + ("actor_rollout" if role.role == "actor_rollout" else role.role)
            what = f"its {n} training devices" if role.role == "actor_rollout" else f"its {n} devices ({where})"
            problems.append(f"`{role_path(role)}`: tensor_model_parallel_size {tp} x pipeline_model_parallel_size "
                            f"{pp} = {tp * pp} does not divide {what}; choose TP x PP that divides {n}.")
    if not pool.reward and not cfg.reward.verifier:
        problems.append("no reward: `reward.verifier` is false and `resource_pool.reward` is empty; "
                        "turn the verifiers on or give the reward model devices.")


def data_parallel_size(cfg: Config, role: RoleConfig) -> int:
    n = role_devices(cfg, role)
    return max(1, n // (role.parallel.tensor_model_parallel_size * role.parallel.pipeline_model_parallel_size))


def _check_batches(cfg: Config, problems: list[str]) -> None:
    run, actor = cfg.run, cfg.actor
    n = actor.rollout.n_samples_per_prompt
    gbs, mini, mbs = run.global_batch_size, actor.ppo.ppo_mini_batch_size, actor.micro_batch_size
    if n < 1:
        problems.append(f"`{A}.n_samples_per_prompt: {n}` must be at least 1 (GRPO needs 2 or more to compare).")
        return
    for key, value in (("training.global_batch_size", gbs), (f"{A}.ppo_mini_batch_size", mini),
                       (f"{A}.micro_batch_size", mbs), ("training.train_iters", run.train_iters)):
        if value < 1:
            problems.append(f"`{key}: {value}` must be at least 1.")
            return
    if gbs % mini:
        problems.append(f"`training.global_batch_size: {gbs}` is not a multiple of `{A}.ppo_mini_batch_size: {mini}`; "
                        f"each step's prompts must split into whole mini-batches.")
    try:
        dp = data_parallel_size(cfg, actor)
    except ZeroDivisionError:
        return
    if (mini * n) % (mbs * dp):
        problems.append(f"`{A}.ppo_mini_batch_size: {mini}` x n_samples_per_prompt {n} = {mini * n} sequences is not "
                        f"a multiple of micro_batch_size {mbs} x data-parallel size {dp} = {mbs * dp}; change one of them.")
    _, infer = actor_split(cfg)
    gen_tp = (actor.rollout.infer_tensor_parallel_size if actor.rollout.rollout_engine == "vllm"
              else actor.parallel.tensor_model_parallel_size)
    gen_dp = infer // gen_tp if infer else dp
    if gen_dp and gbs % gen_dp:
        problems.append(f"`training.global_batch_size: {gbs}` prompts do not split evenly over {gen_dp} "
                        f"generation ranks (data-parallel groups); use a multiple of {gen_dp}.")
    if cfg.resource_pool.reward:  # the reward model scores gbs x n sequences (gbs in validation) per call
        rm_dp = data_parallel_size(cfg, cfg.reward)
        if gbs % rm_dp:
            problems.append(f"`resource_pool.reward: {cfg.resource_pool.reward}` gives the reward model {rm_dp} "
                            f"data-parallel groups, which do not split `training.global_batch_size: {gbs}` prompts "
                            f"evenly; use a global batch size that is a multiple of {rm_dp}, or fewer reward devices.")


# ---------------------------------------------------------------------------- model and rollout
def _check_role(role: RoleConfig, cfg: Config, problems: list[str]) -> None:
    from mindspeed_rl.platform.base import attention_takes_masks, expected_platform, own_rotary, sdpa_core_attention

    _check_moe(role, cfg, problems)
    platform = expected_platform(cfg.run.platform)
    path, a = role_path(role), role.arch
    if role.param_offload is not None and role.role != "ref":
        problems.append(f"`{path}.param_offload` applies to the reference only "
                        f"(actor_rollout_ref.ref.param_offload); remove it from {path}.")
    if role.role == "ref" and role.param_offload and cfg.resource_pool.ref:
        problems.append(f"`{path}.param_offload: true` moves a reference that shares the actor's devices to host "
                        f"memory, but `resource_pool.ref: {list(cfg.resource_pool.ref)}` gives it devices of its "
                        f"own; set resource_pool.ref: [] or drop param_offload.")
    if a.no_rope_freq is not None and a.num_layers:
        from mindspeed_rl.models.hf_config import no_rope_pattern
        try:
            no_rope_pattern(a.no_rope_freq, a.num_layers)
        except ValueError as err:
            problems.append(f"model {role.model_name}: {err}")
    if a.window_attn_skip_freq is not None and a.num_layers:
        from mindspeed_rl.models.hf_config import window_pattern
        try:
            window_pattern(a.window_attn_skip_freq, a.num_layers)
        except ValueError as err:
            problems.append(f"model {role.model_name}: {err}")
    if platform != "auto" and not sdpa_core_attention(platform) and a.attn_logit_softcapping:
        problems.append(f"model {role.model_name}: attn_logit_softcapping {a.attn_logit_softcapping} (Gemma 2) is not "
                        f"supported on {platform}: its fused attention kernel does not soft-cap the scores; run it "
                        f"on CPU or CUDA.")
    _check_gpt_oss(role, platform, problems)
    if not a.pre_norm and not a.post_norm:
        problems.append(f"model {role.model_name}: pre_norm: false leaves its layers without any norm; set post_norm: "
                        f"true (OLMo 2's layout) or pre_norm: true.")
    if a.parallel_residual and (not a.pre_norm or a.post_norm or (a.num_experts or 0) > 1):
        what = "pre_norm: false" if not a.pre_norm else "post_norm: true" if a.post_norm else f"num_experts {a.num_experts}"
        problems.append(f"model {role.model_name}: parallel_residual (Cohere's attention and MLP on the same normed "
                        f"input) is supported on dense layers with one norm before both only; {what} is not.")
    bad = [what for what, on in ((f"normalization {a.normalization}", a.normalization not in ("LayerNorm", "RMSNorm")),
                                 ("apply_layernorm_1p", a.apply_layernorm_1p), ("add_rmsnorm_offset", a.add_rmsnorm_offset),
                                 ("layernorm_bias: false", not a.layernorm_bias), ("post_norm", a.post_norm),
                                 ("qk_layernorm_across_heads", a.qk_layernorm_across_heads)) if on]
    if not a.layernorm_affine and bad:  # (models/olmo.NonParametricLayerNorm)
        problems.append(f"model {role.model_name}: layernorm_affine: false (norms without weight or bias: OLMo 1's "
                        f"LayerNorm, nanochat's RMSNorm) needs normalization LayerNorm or RMSNorm without "
                        f"apply_layernorm_1p, add_rmsnorm_offset, layernorm_bias: false, post_norm or "
                        f"qk_layernorm_across_heads; this model has {', '.join(bad)}.")
    if a.embedding_norm and (a.layernorm_affine or a.normalization != "RMSNorm"):  # (models/nanochat.py)
        problems.append(f"model {role.model_name}: embedding_norm (nanochat's weightless RMSNorm on the embeddings) "
                        f"needs normalization: RMSNorm with layernorm_affine: false.")
    if a.rotary_negated and (a.multi_latent_attention or a.rope_local_base_freq):
        problems.append(f"model {role.model_name}: rotary_negated (nanochat's RoPE) turns the model's one rotary table; "
                        f"{'multi_latent_attention' if a.multi_latent_attention else 'rope_local_base_freq'} has "
                        f"another: remove one of them.")
    if a.clip_qkv is not None and (a.multi_latent_attention or a.linear_attention_layers):  # its range: ranges.py
        problems.append(f"model {role.model_name}: clip_qkv (OLMo's q / k / v clamp) needs attention with one "
                        f"q / k / v projection, not "
                        f"{'multi_latent_attention' if a.multi_latent_attention else 'linear_attention_layers'}.")
    if a.parallel_residual_mlp_norm and not a.parallel_residual:
        problems.append(f"model {role.model_name}: parallel_residual_mlp_norm (GPT-NeoX's own norm for the MLP in a "
                        f"parallel-residual layer) needs parallel_residual: true; set it, or drop "
                        f"parallel_residual_mlp_norm.")
    if not a.layernorm_bias and (a.normalization != "LayerNorm" or a.apply_layernorm_1p):
        problems.append(f"model {role.model_name}: layernorm_bias: false (Cohere's weight-only LayerNorm) needs "
                        f"normalization: LayerNorm" + (" without apply_layernorm_1p." if a.apply_layernorm_1p else
                                                       f", not {a.normalization}."))
    if a.qk_layernorm_across_heads and not a.qk_layernorm:
        problems.append(f"model {role.model_name}: qk_layernorm_across_heads needs qk_layernorm: true.")
    if a.qk_layernorm_after_rope and (not a.qk_layernorm or a.qk_layernorm_across_heads or a.multi_latent_attention):
        problems.append(f"model {role.model_name}: qk_layernorm_after_rope (HunYuan's q / k norms on the rotated heads) "
                        f"needs qk_layernorm: true, per-head norms (qk_layernorm_across_heads: false) and no "
                        f"multi_latent_attention.")
    if a.qk_layernorm_after_rope and (a.rope_scaling_type or a.rotary_percent != 1.0 or a.rotary_interleaved):
        problems.append(f"model {role.model_name}: qk_layernorm_after_rope takes plain RoPE only (each left-padded row is "
                        f"turned to its position ids with the model's frequencies); rope_scaling_type "
                        f"{a.rope_scaling_type} / rotary_percent {a.rotary_percent} / rotary_interleaved "
                        f"{a.rotary_interleaved} is not supported with it.")
    if a.geglu and a.swiglu:
        problems.append(f"model {role.model_name}: geglu and swiglu are both true; set swiglu: false for a GeGLU "
                        f"MLP (Gemma).")
    if a.xielu and (a.swiglu or a.geglu or a.squared_relu):
        other = "swiglu" if a.swiglu else "geglu" if a.geglu else "squared_relu"
        problems.append(f"model {role.model_name}: xielu is true together with {other}; set {other}: false for an "
                        f"xIELU MLP without a gate (Apertus).")
    plain = [k for k in ("squared_relu", "xielu") if getattr(a, k)]
    if a.openai_gelu and (a.swiglu or a.geglu or plain):
        other = "swiglu" if a.swiglu else "geglu" if a.geglu else plain[0]
        problems.append(f"model {role.model_name}: openai_gelu is true together with {other}; set {other}: false for a "
                        f"GELU MLP without a gate (StarCoder2).")
    if a.squared_relu and (a.swiglu or a.geglu):
        problems.append(f"model {role.model_name}: squared_relu is true together with {'swiglu' if a.swiglu else 'geglu'}; "
                        f"set {'swiglu' if a.swiglu else 'geglu'}: false for a plain squared-ReLU MLP (Arcee).")
    if platform != "auto" and not own_rotary(platform) and (a.rotary_percent < 1 or a.no_rope_freq
                                                             or a.rope_local_base_freq) \
            and a.rope_scaling_type in ("longrope", "yarn"):
        what = (f"rotary_percent {a.rotary_percent} (partial rotary, e.g. Phi-4-mini)" if a.rotary_percent < 1
                else "no_rope_freq (layers without RoPE, e.g. SmolLM3)" if a.no_rope_freq
                else "rope_local_base_freq (sliding layers with the default rope, e.g. OLMo 3)")
        part = "the full layers" if a.rotary_percent >= 1 and not a.no_rope_freq else "the rotated part"
        problems.append(f"model {role.model_name}: {a.rope_scaling_type} with {what} scales cos and sin of {part} "
                        f"only, which MindSpeed's fused rotary kernel on NPU does not do; run it on CPU or CUDA.")
    tp, pp = role.parallel.tensor_model_parallel_size, role.parallel.pipeline_model_parallel_size
    hf_load = role.load and os.path.isfile(os.path.join(role.load, "config.json"))
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if getattr(a, k) is None]
    if missing and not hf_load:
        problems.append(f"`{path}`: the model ({role.model_name or 'no model file'}) does not set {', '.join(missing)}; "
                        f"define them in configs/rlxf/model/ or load a Hugging Face checkpoint whose config.json has them.")
    if a.num_attention_heads and a.num_attention_heads % tp:
        problems.append(f"`{path}.tensor_model_parallel_size: {tp}` does not divide num_attention_heads "
                        f"{a.num_attention_heads} of model {role.model_name}; pick a TP that divides it.")
    if a.sliding_num_query_groups and a.sliding_num_query_groups % tp:
        problems.append(f"`{path}.tensor_model_parallel_size: {tp}` does not divide sliding_num_query_groups "
                        f"{a.sliding_num_query_groups} of model {role.model_name}; pick a TP that divides it.")
    if a.num_query_groups and a.num_query_groups % tp:
        problems.append(f"`{path}.tensor_model_parallel_size: {tp}` does not divide num_query_groups "
                        f"{a.num_query_groups} of model {role.model_name}; pick a TP that divides it.")
    if a.num_layers and a.num_layers % pp:
        problems.append(f"`{path}.pipeline_model_parallel_size: {pp}` does not divide num_layers {a.num_layers} "
                        f"of model {role.model_name}; pick a PP that divides it.")
    if a.hidden_size and a.num_attention_heads and a.hidden_size % a.num_attention_heads and not a.kv_channels:
        problems.append(f"`model.{role.model_name}.hidden_size: {a.hidden_size}` is not a multiple of num_attention_heads "
                        f"{a.num_attention_heads}; set kv_channels explicitly.")
    if a.multi_latent_attention:
        _check_mla(role, path, tp, hf_load, problems)
    problems += gemma4_problems(role, path, tp, pp)  # Gemma 4's layer shapes, per-layer inputs and KV sharing
    problems += mixer_problems(role, path, tp)  # Gated DeltaNet, Mamba-2, one-block layers
    if a.group_query_attention and not a.num_query_groups:
        problems.append(f"`model.{role.model_name}.group_query_attention` is true but num_query_groups is not set.")
    from mindspeed_rl.config.parallel_rules import parallel_problems
    try:
        dp = data_parallel_size(cfg, role)
    except ZeroDivisionError:
        dp = 1
    problems += parallel_problems(role, path, dp, role.rollout.n_samples_per_prompt, role.ppo.ppo_mini_batch_size or 1)
    if role.bf16 and role.fp16:
        problems.append(f"`{path}`: bf16 and fp16 are both true; choose one.")
    if role.role == "actor_rollout" and role.optim.bf16_stochastic_rounding and not role.bf16:
        problems.append(f"`{path}.bf16_stochastic_rounding: true` rounds into bf16 parameters but `{path}.bf16` is false; "
                        f"set bf16: true or drop bf16_stochastic_rounding.")
    if role.role == "reward" and role.parallel.sequence_parallel:
        problems.append("`reward.sequence_parallel: true`: the reward model's scalar head reads whole sequences on "
                        "every TP rank; set reward.sequence_parallel: false.")
    if role.role == "reward" and not role.load:
        problems.append("`reward.load` is not set but `resource_pool.reward` gives a reward model devices; "
                        "point reward.load at a reward-model checkpoint, or set resource_pool.reward: [] to use only the verifiers.")
    if role.role != "actor_rollout":
        return
    r, p = role.rollout, role.ppo
    if r.do_sample and r.temperature <= 0:
        problems.append(f"`{A}.temperature: {r.temperature}` must be > 0 when do_sample is true; use do_sample: false for greedy.")
    if not 0 < r.top_p <= 1:
        problems.append(f"`{A}.top_p: {r.top_p}` must be in (0, 1].")
    if r.top_k < 0:
        problems.append(f"`{A}.top_k: {r.top_k}` must be >= 0 (0 turns it off).")
    if r.max_new_tokens < 1:
        problems.append(f"`training.seq_length: {cfg.run.seq_length}` leaves no room for a response after "
                        f"`{A}.max_prompt_length: {cfg.data.max_prompt_length}`; raise seq_length or set max_new_tokens.")
    elif a.max_position_embeddings and cfg.data.max_prompt_length + r.max_new_tokens > a.max_position_embeddings:
        problems.append(f"`{A}.max_prompt_length: {cfg.data.max_prompt_length}` + max_new_tokens {r.max_new_tokens} "
                        f"exceeds max_position_embeddings {a.max_position_embeddings} of model {role.model_name}"
                        f"{_length_limit_note(role)}; shorten one.")
    elif (a.sliding_window and not attention_takes_masks(platform)
          and cfg.data.max_prompt_length + r.max_new_tokens > a.sliding_window):
        problems.append(f"`{A}.max_prompt_length: {cfg.data.max_prompt_length}` + max_new_tokens {r.max_new_tokens} "
                        f"exceeds the sliding_window {a.sliding_window} of model {role.model_name}: on NPU attention "
                        f"runs in MindSpeed's fused kernel, full causal, which equals the model's sliding-window "
                        f"attention only within the window; shorten one.")
    if r.rollout_engine == "vllm":
        check_vllm(role, problems, platform)
    if p.tis_mode not in ("off", "token", "sequence"):
        problems.append(f"`{A}.tis_mode: {p.tis_mode}` is not supported; use one of: off, token, sequence.")
    if not p.tis_cap > 0:
        problems.append(f"`{A}.tis_cap: {p.tis_cap}` must be > 0 (verl uses 2.0).")
    if p.clip_ratio_c is not None and p.clip_ratio_c <= 1:
        problems.append(f"`{A}.clip_ratio_c: {p.clip_ratio_c}` must be > 1 (dual clip), or null to turn it off.")
    if p.ppo_epochs < 1:
        problems.append(f"`{A}.ppo_epochs: {p.ppo_epochs}` must be at least 1.")


def _check_gpt_oss(role: RoleConfig, platform: str, problems: list[str]) -> None:
    """gpt-oss's switches (models/gpt_oss.py): softmax_type vanilla or learnable (its attention sinks, which
    the fused attention of NPU does not compute), quick_geglu's clamp and offset only with it, in MoE
    experts on every layer, and expert-TP 1 where the experts have biases."""
    from mindspeed_rl.platform.base import sdpa_core_attention

    a, m, path = role.arch, f"model {role.model_name}", role_path(role)
    if a.softmax_type not in ("vanilla", "learnable"):
        problems.append(f"{m}: softmax_type {a.softmax_type!r} is not supported; use vanilla or learnable (gpt-oss's "
                        f"attention sinks).")
    if a.softmax_type == "learnable" and platform != "auto" and not sdpa_core_attention(platform):
        problems.append(f"{m}: softmax_type learnable (gpt-oss's attention sinks) is not supported on {platform}: its "
                        f"fused attention kernel has no sink logits; run it on CPU or CUDA.")
    if not a.quick_geglu and (a.activation_func_clamp_value is not None or a.glu_linear_offset):
        problems.append(f"{m}: activation_func_clamp_value / glu_linear_offset apply to quick_geglu (gpt-oss's "
                        f"experts) only; set quick_geglu: true or drop them.")
    if a.quick_geglu and (a.num_experts or 0) <= 1:
        problems.append(f"{m}: quick_geglu (gpt-oss's clamped SwiGLU) is supported in MoE experts only; set "
                        f"num_experts or drop quick_geglu.")
    if (a.num_experts or 0) > 1 and not a.disable_bias_linear and not a.quick_geglu:
        problems.append(f"{m}: disable_bias_linear: false in an MoE model is supported with gpt-oss's experts only "
                        f"(quick_geglu: true); megatron's experts and dispatchers take no bias.")
    etp = role.parallel.expert_tensor_parallel_size or role.parallel.tensor_model_parallel_size
    if a.quick_geglu and not a.disable_bias_linear and etp > 1:
        problems.append(f"`{path}.expert_tensor_parallel_size: {etp}` with gpt-oss's expert biases is not supported "
                        f"(an expert's output bias would be summed once per expert-TP rank); set "
                        f"expert_tensor_parallel_size: 1 and split the experts by expert_model_parallel_size.")


def _check_mla(role: RoleConfig, path: str, tp: int, hf_load: bool, problems: list[str]) -> None:
    """multi_latent_attention (DeepSeek-V3): its dimensions set (or from config.json), the value head
    dimension as kv_channels, TP dividing the down projections' outputs (split over TP), RoPE plain
    or yarn on the whole RoPE part."""
    a, m = role.arch, f"model {role.model_name}"
    dims = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    missing = [k for k in dims if not getattr(a, k)]
    if missing and not hf_load:
        problems.append(f"{m}: multi_latent_attention needs {', '.join(missing)} (DeepSeek-V3: kv_lora_rank 512, "
                        f"qk_head_dim 128, qk_pos_emb_head_dim 64, v_head_dim 128); set them or load a DeepSeek-V3 "
                        f"checkpoint whose config.json has them.")
        return
    if a.kv_channels and a.v_head_dim and a.kv_channels != a.v_head_dim:
        problems.append(f"{m}: kv_channels {a.kv_channels} differs from v_head_dim {a.v_head_dim}; with "
                        f"multi_latent_attention the head dimension is v_head_dim: drop kv_channels.")
    for what, n in (("q_lora_rank", a.q_lora_rank or 0),
                    ("kv_lora_rank + qk_pos_emb_head_dim", (a.kv_lora_rank or 0) + (a.qk_pos_emb_head_dim or 0))):
        if n and n % tp:
            problems.append(f"`{path}.tensor_model_parallel_size: {tp}` does not divide {what} {n} of {m} (multi-latent "
                            f"attention splits its down projections over TP); pick a TP that divides it.")
    if a.rope_scaling_type not in (None, "yarn") or a.rotary_percent != 1.0:
        problems.append(f"{m}: multi_latent_attention rotates its whole RoPE part, plain or with yarn; "
                        f"rope_scaling_type {a.rope_scaling_type} / rotary_percent {a.rotary_percent} is not supported.")
    elif a.rope_scaling_type == "yarn" and (a.rope_attention_factor is not None or not a.rope_scaling_truncate):
        problems.append(f"{m}: multi_latent_attention's yarn takes its attention factor from rope_scaling_mscale / "
                        f"rope_scaling_mscale_all_dim and rounds the ramp's ends (DeepSeek's YaRN); drop "
                        f"rope_attention_factor / rope_scaling_truncate: false.")


def _hf_config(role: RoleConfig) -> dict:
    """config.json of the HF directory the role loads ({} for random init, our checkpoints, a bad file)."""
    import json

    try:
        with open(os.path.join(role.load or "", "config.json")) as f:
            hf = json.load(f)
    except (OSError, ValueError):
        return {}
    from mindspeed_rl.models.hf_config import text_model_config

    return text_model_config(hf) if isinstance(hf, dict) else {}


def _length_limit_note(role: RoleConfig) -> str:
    """Why a HF model's length limit is below its config.json's max_position_embeddings
    (models/hf_config.longrope_args, llama4_scaling_limit): LongRoPE's or Ministral 3's original
    length; or why it is the limit (dynamic NTK: hf_rope_config.dynamic_ntk_as_default); else nothing."""
    if role.arch.rope_scaling_type == "longrope":
        return (" (config.json's original_max_position_embeddings: LongRoPE is computed with its short factors, "
                "which hold up to that length)")
    rope = _hf_config(role).get("rope_parameters") or {}
    if float(rope.get("llama_4_scaling_beta") or 0.0):
        return (" (config.json's rope_parameters.original_max_position_embeddings: Ministral 3's query scaling "
                "(llama_4_scaling_beta) is 1 up to that length and is not computed past it)")
    rope = rope or _hf_config(role).get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) == "dynamic" and not rope.get("alpha"):
        return " (its dynamic NTK RoPE is no scaling up to that length and is not computed past it)"
    return ""


def _check_algorithm(cfg: Config, problems: list[str]) -> None:
    from mindspeed_rl.config import choices

    alg = cfg.algorithm
    _one_of(alg.adv_estimator, choices.advantage_estimators(), "algorithm.adv_estimator", problems)
    _one_of(alg.kl_penalty, choices.kl_kinds(), "algorithm.kl_penalty", problems)
    _one_of(alg.kl_ctrl.type, choices.kl_controllers(), "algorithm.kl_ctrl.type", problems)
    _one_of(cfg.actor.ppo.kl_loss_type, choices.kl_kinds(), f"{A}.kl_loss_type", problems)
    _one_of(cfg.actor.ppo.loss_agg_mode, choices.loss_agg_modes(), f"{A}.loss_agg_mode", problems)
    if cfg.reward.verifier:
        if len(alg.verifier_function) != len(alg.verifier_weight):
            problems.append(f"`algorithm.verifier_function` has {len(alg.verifier_function)} entries but "
                            f"`algorithm.verifier_weight` has {len(alg.verifier_weight)}; give one weight per verifier.")
        for name in alg.verifier_function:
            err = choices.verifier_problem(str(name))
            if err:
                problems.append(f"`algorithm.verifier_function`: {err}")
    if alg.dynamic_sampling and cfg.actor.rollout.n_samples_per_prompt < 2:
        problems.append("`algorithm.dynamic_sampling` needs n_samples_per_prompt >= 2 (it drops groups whose scores are all equal).")


# ---------------------------------------------------------------------------- paths
def _check_paths(cfg: Config, problems: list[str]) -> None:
    from mindspeed_rl.config.choices import data_path_problem

    tok = cfg.run.tokenizer_name_or_path
    if tok is not None and not os.path.isdir(tok):
        problems.append(f"`training.tokenizer_name_or_path: {tok}` does not exist; point it at a Hugging Face "
                        f"tokenizer directory (tokenizer.json / tokenizer_config.json).")
    elif tok is not None and not cfg.run.trust_remote_code:
        from mindspeed_rl.data.tokenizer import own_code_problem

        problems += [p for p in [own_code_problem(tok, f"`training.tokenizer_name_or_path: {tok}`")] if p]
    for role in _active_roles(cfg):
        if role.load and not os.path.exists(role.load):
            problems.append(f"`{role_path(role)}.load: {role.load}` does not exist; point it at a Hugging Face or "
                            f"Megatron checkpoint directory, or set it to null for a random init.")
        elif role.load and os.path.isfile(os.path.join(role.load, "config.json")):
            from dataclasses import asdict

            from mindspeed_rl.models.arch_check import check_arch_against_hf, check_shapes_against_safetensors
            try:  # what the user set must agree with config.json, and the result with the weights' headers
                arch = asdict(role.arch)
                check_arch_against_hf(arch, role.load, role.model_name or None, user_set=role.arch_set)
                check_shapes_against_safetensors(arch, role.load)
            except UserInputError as err:
                problems.append(str(err))
    resume = cfg.run.resume
    if resume not in (None, "auto") and not os.path.exists(resume):
        problems.append(f"`training.resume: {resume}` does not exist; point it at a checkpoint (the actor's save "
                        f"directory or one of its iter_* directories), or use auto.")
    for key, value in (("data_path", cfg.data.data_path), ("val_data_path", cfg.data.val_data_path)):
        if value is not None:
            err = data_path_problem(value)
            if err:
                problems.append(f"`{A}.{key}: {value}`: {err}")


# ---------------------------------------------------------------------------- mixture of experts
MOE_BALANCING = ("aux_loss", "seq_aux_loss", "sinkhorn", "none")


def _moe_routing_problems(role, experts: int, problems: list[str]) -> None:
    """GLM-4.5 / DeepSeek-V3 routing keys: the layer pattern, sigmoid with the expert bias, groups."""
    from mindspeed_rl.models.hf_moe_config import moe_layer_pattern

    a, name = role.arch, role.model_name
    if a.num_layers:
        try:
            moe_layer_pattern(a.moe_layer_freq, a.num_layers)
        except ValueError as err:
            problems.append(f"model {name}: {err}")
    if a.moe_router_score_function not in ("softmax", "sigmoid"):
        problems.append(f"`model.{name}.moe_router_score_function: {a.moe_router_score_function}` is not supported; use "
                        f"softmax or sigmoid.")
    renormalised = a.norm_topk_prob if a.norm_topk_prob is not None else not a.moe_router_pre_softmax
    if a.moe_router_enable_expert_bias and a.moe_router_score_function == "softmax" and not renormalised:
        problems.append(f"model {name}: moe_router_enable_expert_bias with softmax routing (ERNIE 4.5 MoE's) needs the "
                        f"top-k renormalised (norm_topk_prob: true, moe_router_pre_softmax: false), as ERNIE routes.")
    if bool(a.moe_router_num_groups) != bool(a.moe_router_group_topk):
        problems.append(f"model {name}: moe_router_num_groups and moe_router_group_topk go together (HF n_group / "
                        f"topk_group); set both or neither.")
    elif a.moe_router_num_groups and (experts % a.moe_router_num_groups or a.moe_router_group_topk > a.moe_router_num_groups
                                      or a.moe_router_topk % a.moe_router_group_topk):
        problems.append(f"model {name}: moe_router_num_groups {a.moe_router_num_groups} must divide num_experts {experts}, "
                        f"moe_router_group_topk {a.moe_router_group_topk} be at most that and divide moe_router_topk "
                        f"{a.moe_router_topk}.")


def _check_moe(role: RoleConfig, cfg: Config, problems: list[str]) -> None:
    """Expert parallelism against the model and the devices, megatron-core's rules in one sentence
    each: EP divides num_experts, ETP divides moe_ffn_hidden_size, the role's devices hold whole
    (ETP x EP x PP) expert groups as they hold whole (TP x PP) model replicas, SP with TP > 1 (megatron
    requires it for EP > 1; without it the allgather dispatcher sees every TP rank's copy of the
    tokens and expert gradients come out TP times too large), and a dispatcher the platform runs."""
    from mindspeed_rl.platform.base import moe_token_dispatchers

    path, a, par = role_path(role), role.arch, role.parallel
    tp, pp, ep = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.expert_model_parallel_size
    etp = par.expert_tensor_parallel_size or tp
    experts = a.num_experts or 0
    replay = role.role == "actor_rollout" and role.ppo.moe_enable_routing_replay
    if replay and experts <= 1:
        problems.append(f"`{path}.moe_enable_routing_replay: true` replays MoE expert choices, but model "
                        f"{role.model_name} has no experts (num_experts); set it to false.")
    if experts <= 1:
        for key in ("moe_shared_expert_intermediate_size", "shared_expert_gate"):
            if getattr(a, key):
                problems.append(f"`{role.arch_set.get(key, f'model.{role.model_name}.{key}')}: {getattr(a, key)}` "
                                f"describes an MoE layer's shared expert, but model {role.model_name} has no experts "
                                f"(num_experts); drop it.")
        if ep > 1 or (par.expert_tensor_parallel_size or tp) != tp:
            problems.append(f"`{path}.expert_model_parallel_size: {ep}` / expert_tensor_parallel_size need an MoE model, "
                            f"but model {role.model_name} has no experts (num_experts); drop them.")
        return
    if experts % ep:
        problems.append(f"`{path}.expert_model_parallel_size: {ep}` does not divide num_experts {experts} of model "
                        f"{role.model_name}; pick an EP that divides it.")
    ffn = a.moe_ffn_hidden_size or a.ffn_hidden_size
    if ffn and ffn % etp:
        problems.append(f"`{path}.expert_tensor_parallel_size: {etp}` does not divide moe_ffn_hidden_size {ffn} of "
                        f"model {role.model_name}; pick an ETP that divides it.")
    if a.moe_router_topk > experts:
        problems.append(f"`model.{role.model_name}.moe_router_topk: {a.moe_router_topk}` exceeds num_experts {experts}.")
    _moe_routing_problems(role, experts, problems)
    devices = role_devices(cfg, role)
    if devices and devices % (etp * ep * pp):
        problems.append(f"`{path}`: its {devices} device(s) are not a multiple of expert_tensor_parallel_size {etp} x "
                        f"expert_model_parallel_size {ep} x pipeline_model_parallel_size {pp} = {etp * ep * pp} "
                        f"(megatron places whole expert groups on the data-parallel ranks); change EP/ETP or the devices.")
    if tp > 1 and not par.sequence_parallel and (ep > 1 or role.role == "actor_rollout"):
        problems.append(f"`{path}`: an MoE model at tensor_model_parallel_size {tp} needs sequence_parallel: true "
                        f"(megatron's rule; without it expert gradients are counted once per TP rank).")
    split = role.role == "actor_rollout" and role.num_gpus_for_infer
    if split and role.rollout.rollout_engine != "vllm" and tp > 1:
        problems.append(f"`{path}`: the train/infer split's megatron engine decodes an MoE model at the actor's "
                        f"tensor_model_parallel_size {tp} without sequence parallelism, which megatron's MoE "
                        f"layers need at TP > 1; use rollout_engine: vllm for the split, TP 1, or generate colocated.")
    if split and replay:
        problems.append(f"`{path}.moe_enable_routing_replay: true` replays the expert choices of the colocated native "
                        f"engine; the train/infer split does not hand them back. Generate colocated, or set it to false.")
    shared = a.moe_shared_expert_intermediate_size or 0
    if shared and shared % tp:
        problems.append(f"`{path}.tensor_model_parallel_size: {tp}` does not divide moe_shared_expert_intermediate_size "
                        f"{shared} of model {role.model_name} (the shared expert is split over TP); pick a TP that divides it.")
    # sigmoid routing or dense layers among the MoE ones: vLLM's GLM-4.5 (hf_export_config.glm4_moe_config), any attention
    # (and multi-latent attention: vLLM's DeepSeek-V2 / V3); softmax routing with an expert bias: vLLM's ERNIE 4.5
    # MoE (hf_export_config.ernie4_5_moe_config)
    glm4_moe = (a.moe_router_score_function == "sigmoid" or _hf_config(role).get("model_type") == "glm4_moe"
                or a.multi_latent_attention or bool(a.moe_router_enable_expert_bias))
    # Gated DeltaNet / gated attention: vLLM's Qwen3-Next or Qwen3.5-MoE (q / k norms and a gated shared expert)
    hybrid = any(a.linear_attention_layers or ()) or bool(a.attention_output_gate)
    # q / k norms after RoPE: HunYuan-MoE, which vLLM serves as itself (its Transformers backend), shared MLP included
    hunyuan = bool(a.qk_layernorm_after_rope)
    # Granite's multipliers: vLLM's Granite MoE (hf_granite_config.granite_moe_config), a shared MLP without a gate or none
    granite = _hf_config(role).get("model_type") in ("granitemoe", "granitemoeshared", "granitemoehybrid") or any(
        float(getattr(a, k) or 1.0) != 1.0 for k in ("embedding_multiplier_scale", "residual_multiplier",
                                                     "output_multiplier_scale"))
    if role.role == "actor_rollout" and role.rollout.rollout_engine == "vllm" and not (glm4_moe or hybrid or hunyuan
                                                                                        or granite):
        if not shared and not a.qk_layernorm and _hf_config(role).get("model_type") != "mixtral":
            problems.append(f"`{path}.rollout_engine: vllm` runs an MoE model as vLLM's Qwen3-MoE, which has q/k norms, "
                            f"but model {role.model_name} has none (qk_layernorm); set qk_layernorm: true, load a "
                            f"Mixtral checkpoint (vLLM's Mixtral) or use rollout_engine: megatron.")
        if shared and (a.qk_layernorm or not a.shared_expert_gate):
            problems.append(f"`{path}.rollout_engine: vllm` runs an MoE model with a shared expert as vLLM's Qwen2-MoE, "
                            f"which gates it (shared_expert_gate: true) and has no q/k norms (qk_layernorm: false); "
                            f"model {role.model_name} differs: use rollout_engine: megatron for it.")
    if replay and role.rollout.rollout_engine == "vllm":
        problems.append(f"`{path}.moe_enable_routing_replay: true` replays the expert choices the native engine "
                        f"records; vLLM does not hand them back here. Use rollout_engine: megatron with it, or "
                        f"set it to false.")
    if role.role == "actor_rollout" and ep > 1 and pp > 1:
        problems.append(f"`{path}`: expert_model_parallel_size {ep} with pipeline_model_parallel_size {pp}: the native "
                        f"engine decodes EP ranks in lock-step only without a pipeline; use PP 1 for an EP actor.")
    _one_of(a.moe_router_load_balancing_type, MOE_BALANCING, f"model.{role.model_name}.moe_router_load_balancing_type", problems)
    _one_of(a.moe_token_dispatcher_type, ("allgather", "alltoall", "alltoall_seq", "flex"),
            f"{path}.moe_token_dispatcher_type", problems)
    if cfg.run.platform == "cpu" and a.moe_token_dispatcher_type not in moe_token_dispatchers("cpu"):
        problems.append(f"`{path}.moe_token_dispatcher_type: {a.moe_token_dispatcher_type}` does not run on CPU "
                        f"(megatron's version needs a device stream); use allgather there.")
    if a.norm_topk_prob is not None and "moe_router_pre_softmax" in role.arch_set and \
            a.moe_router_pre_softmax == a.norm_topk_prob:
        problems.append(f"`{role.arch_set['moe_router_pre_softmax']}: {a.moe_router_pre_softmax}` contradicts "
                        f"norm_topk_prob {a.norm_topk_prob} (renormalised top-k means no pre-softmax); set only one.")
    if replay and a.moe_router_load_balancing_type == "sinkhorn":
        problems.append(f"`{path}.moe_enable_routing_replay: true` cannot replay sinkhorn routing (megatron's sinkhorn "
                        f"router has no top-k step to replace); use moe_router_load_balancing_type aux_loss or none.")
    if replay and par.recompute_granularity == "full":
        problems.append(f"`{path}.moe_enable_routing_replay: true` with recompute_granularity: full: the recomputed "
                        f"layers would route by themselves in backward; use recompute_granularity: selective or none.")
    if a.moe_router_topk == 1 and not (a.moe_router_pre_softmax if a.norm_topk_prob is None else not a.norm_topk_prob):
        problems.append(f"`model.{role.model_name}.moe_router_topk: 1` with renormalised probabilities gives every "
                        f"token weight 1 and the router no gradient; set norm_topk_prob: false.")
