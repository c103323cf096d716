"""From a validated Config to a running GRPO job: cluster -> pools -> role groups -> data -> fit.

    placement plan -> connect Ray (join or start) -> check the plan against the nodes
    -> placement groups -> actor / reference workers -> prompt loaders -> GRPOTrainer.fit()

The role groups and their facades (workers/interfaces.py protocols) are built in roles.py, so the
trainer never sees Ray.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import torch

from mindspeed_rl.data import keys as K


def _with_group_ids(batches, start: int = 0):
    """Number the prompts of each batch: the group index the n samples of a prompt share."""
    offset = start
    for batch in batches:
        rows = batch[K.PROMPT_IDS].shape[0]
        batch[K.GROUP_INDEX] = torch.arange(offset, offset + rows)
        offset += rows
        yield batch


def _infinite(loader):
    while True:
        yield from loader


def plan_devices(plan, role: str) -> int:
    return next(p.world_size for p in plan if p.role == role)


def ready_line(t_start: float, t_data: float, t_cluster: float, t_ready: float) -> str:
    """The console line that says where the start-up went (bench/startup.py reads it)."""
    return (f"workers ready {t_ready - t_start:.1f} s after the start: data and tokenizer {t_data - t_start:.1f} s, "
            f"Ray cluster and device bundles {t_cluster - t_data:.1f} s, role workers (start, build and load "
            f"the models) {t_ready - t_cluster:.1f} s")


def run(cfg, plan) -> int:
    """Run GRPO for cfg.run.train_iters steps; returns the process exit status."""
    from mindspeed_rl.data.loader import build_prompt_loader
    from mindspeed_rl.data.tokenizer import load_tokenizer
    from mindspeed_rl.distributed.cluster import connect
    from mindspeed_rl.distributed.node_checks import check_nodes
    from mindspeed_rl.distributed.plan import check_cluster
    from mindspeed_rl.distributed.pools import create_pools, remove_pools
    from mindspeed_rl.platform import get_platform
    from mindspeed_rl.trainer.grpo import GRPOTrainer, settings_from_config
    from mindspeed_rl.trainer.metrics import MetricsLogger, driver_resources
    from mindspeed_rl.trainer.resume import StopOnSignal, describe, find_resume
    from mindspeed_rl.trainer.roles import build_roles, needs_reference
    from mindspeed_rl.utils.report import resolved_yaml
    from mindspeed_rl.workers.reward import Reward, RuleRewardScorer

    t_start = time.perf_counter()  # start-up phases, said once the workers are ready
    out_dir, config_yaml = cfg.run.output_dir, resolved_yaml(cfg)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w", encoding="utf-8") as f:
        f.write(config_yaml)

    # ---- data, reward and the checkpoint to resume first: bad input fails before any worker starts
    tokenizer = load_tokenizer(cfg.run.tokenizer_name_or_path, trust_remote_code=cfg.run.trust_remote_code)
    d, run_cfg = cfg.data, cfg.run
    train = build_prompt_loader(d.data_path, tokenizer, run_cfg.global_batch_size, d.max_prompt_length,
                                d.truncation, run_cfg.seed, shuffle=not d.no_shuffle, prompt_type=d.prompt_type,
                                prompt_key=d.prompt_key, label_key=d.label_key,
                                system_prompt=d.system_prompt, instruction_template=d.instruction_template,
                                enable_thinking=d.enable_thinking)
    val_loader = None
    if d.val_data_path and run_cfg.test_freq:
        val_loader = build_prompt_loader(d.val_data_path, tokenizer, run_cfg.global_batch_size, d.max_prompt_length,
                                         d.truncation, run_cfg.seed, shuffle=False, drop_last=False,
                                         prompt_type=d.prompt_type, prompt_key=d.prompt_key, label_key=d.label_key,
                                         system_prompt=d.system_prompt, instruction_template=d.instruction_template,
                                         enable_thinking=d.enable_thinking, what="val_data_path")
    a = cfg.algorithm
    rules = RuleRewardScorer(tokenizer, a.verifier_function, a.verifier_weight, a.missing_eos_penalty,
                             a.verifier_timeout_s) if cfg.reward.verifier else None
    resume = find_resume(cfg, len(tokenizer))
    if resume is not None:
        train.load_state_dict(resume.state["loader"])

    # ---- cluster, pools, role groups
    t_data = time.perf_counter()
    platform = get_platform(run_cfg.platform)
    info = connect(plan, platform, dashboard=run_cfg.ray_dashboard)
    check_cluster(plan, info.nodes, platform.ray_resource)
    cpus_per_device = 1.0
    if platform.name == "cpu":  # the host is the device: give each bundle its share of the node's CPUs
        from mindspeed_rl.distributed.plan import format_threads, host_cpus_per_device
        cpus_per_device = host_cpus_per_device(plan, info.nodes, info.cpus)
        print(format_threads(cpus_per_device, "the CPU units of each device bundle of this cluster"))
    pools = create_pools(plan, platform.ray_resource, cpus_per_device=cpus_per_device)
    groups, logger = [], None
    try:
        print(check_nodes(cfg, plan, pools))  # each role node sees its paths, MASTER_ADDR is reachable; no worker yet
        with StopOnSignal() as stop:
            settings = settings_from_config(cfg, num_devices=plan_devices(plan, "actor_rollout"))
            t_cluster = time.perf_counter()
            roles = build_roles(cfg, plan, pools, needs_reference(settings), groups)
            actor, reference = roles.actor, roles.reference
            t_ready = time.perf_counter()
            print(ready_line(t_start, t_data, t_cluster, t_ready))
            reward = Reward(rules, roles.reward_model, a.reward_model_weight, a.missing_eos_penalty)
            save_dir = cfg.actor.save

            def save(step: int, trainer_state: dict) -> None:
                state = dict(trainer_state, loader=train.state_dict(), config_yaml=config_yaml)
                actor.save_checkpoint(save_dir, step, state, run_cfg.keep_last_n, _hash(config_yaml))

            val = (lambda: _with_group_ids(val_loader.iter_epoch())) if val_loader is not None else None
            trainer = GRPOTrainer(settings, actor, reference, reward, _with_group_ids(_infinite(train)), None, val,
                                  save=save, stop_requested=stop.reason)
            if resume is not None:
                loaded = actor.load_checkpoint(resume.path)
                trainer.load_state_dict(resume.state)
                for line in describe(resume, config_yaml, loaded["layout"]):
                    print(line)
                if resume.step >= run_cfg.train_iters:
                    print(f"the checkpoint is at step {resume.step}, training.train_iters is {run_cfg.train_iters}: "
                          "nothing left to train (raise train_iters to go on).")
            logger = MetricsLogger(out_dir, run_cfg.train_iters, run_cfg.tensorboard_dir, run_cfg.wandb_project,
                                   cfg.config_name, run_cfg.log_interval, start_step=trainer.step_idx,
                                   extra_metrics=driver_resources)
            trainer.logger = logger
            print(f"output directory: {out_dir} (metrics.jsonl, tensorboard, config.yaml); checkpoints: {save_dir}")
            start = time.perf_counter()
            history = trainer.fit()
            if trainer.stopped_by:
                print(f"ray_gpt.py: stopped by {trainer.stopped_by} after step {trainer.step_idx}; checkpoint in "
                      f"{save_dir}; continue with training.resume=auto.", file=sys.stderr)
                return 128 + stop.signum
            if run_cfg.save_hf:
                hf_dir = actor.save_hf(os.path.join(save_dir, "hf"))
                print(f"Hugging Face export of the actor: {hf_dir}")
            summary = {"steps": len(history), "last_step": trainer.step_idx,
                       "seconds": round(time.perf_counter() - start, 1), "startup_seconds": round(t_ready - t_start, 1),
                       "first_score": history[0]["grpo/score/mean"] if history else None,
                       "last_score": history[-1]["grpo/score/mean"] if history else None}
            print("done: " + json.dumps(summary))
            return 0
    finally:
        if logger is not None:
            logger.close()
        for g in groups:
            g.shutdown()
        remove_pools(pools)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
