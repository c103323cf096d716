"""Megatron's DDP wrapper, distributed optimizer (Adam) and lr/wd scheduler, from flat arguments.

    model = wrap_ddp(gpt_model, use_distributed_optimizer=True)
    optimizer, scheduler = build_optimizer([model], lr=1e-6, train_iters=100, ...)

The flat arguments are the optim keys of the config (mindspeed_rl.config.schema.OptimConfig), so
configs reach megatron through one builder and no config object crosses into models/.
Gradients are reduced in fp32 and never overlapped with backward (overlap needs CUDA streams);
grad clipping, loss scaling (fp16) and master weights are megatron's own. On CPU the linear layers'
weight gradients are accumulated into DDP's main_grad buffer inside their GEMM, and the word
embedding's rows straight into it (platform/wgrad_fusion.py).
"""
from __future__ import annotations

import torch

from mindspeed_rl.platform import get_platform

get_platform().patch()  # megatron must be imported after the platform patch (no-op when done)

from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler  # noqa: E402

from mindspeed_rl.platform import megatron_fixes, wgrad_fusion  # noqa: E402
from mindspeed_rl.platform.base import fused_adamw  # noqa: E402

megatron_fixes.apply()  # the distributed optimizer needs it without Transformer Engine

LR_DECAY_STYLES = ("constant", "linear", "cosine")


def wrap_ddp(model: torch.nn.Module, use_distributed_optimizer: bool = True,
             bucketing: bool = True) -> DistributedDataParallel:
    """Wrap a GPTModel chunk in megatron's DDP (contiguous fp32 grad buffers, DP all-reduce).
    bucketing=False for virtual-pipeline chunks after the first (as megatron's training does)."""
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False,
        use_distributed_optimizer=use_distributed_optimizer)
    ddp = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model,
                                  disable_bucketing=not bucketing)
    wgrad_fusion.enable(ddp.module)  # CPU: weight gradients accumulate into main_grad (GEMM, embedding rows)
    return ddp


def build_optimizer(
    model_chunks: list[DistributedDataParallel],
    *,
    lr: float,
    train_iters: int,
    min_lr: float = 0.0,
    lr_decay_style: str = "constant",
    lr_warmup_fraction: float = 0.0,
    weight_decay: float = 0.0,
    clip_grad: float = 1.0,
    adam_beta1: float = 0.9,
    adam_beta2: float = 0.999,
    adam_eps: float = 1e-8,
    use_distributed_optimizer: bool = True,
    params_dtype: torch.dtype = torch.float32,
    initial_loss_scale: float = 4096.0,
    optimizer: str = "adam",
    stochastic_rounding: bool = False,
    seed: int = 0,
) -> tuple[object, OptimizerParamScheduler]:
    """Adam (decoupled weight decay, as megatron's 'adam') with grad clipping and an lr schedule.

    Args:
        optimizer: "adam", or "sgd" (tests use it: its step is -lr x grad, so gradient scale shows).
        model_chunks: DDP-wrapped model chunks of this rank.
        stochastic_rounding: bf16 only; the main-to-model copy rounds stochastically, its random bits
            a function of (seed, step, parameter, position) (models/stochastic_rounding.py).
        train_iters: optimizer steps the schedule spans (warmup is lr_warmup_fraction of it).
    Returns:
        (megatron optimizer, scheduler); call scheduler.step(1) after every optimizer.step().
    """
    if stochastic_rounding and params_dtype != torch.bfloat16:
        raise ValueError(f"stochastic rounding copies into bf16 parameters; these are {params_dtype}")
    if lr_decay_style not in LR_DECAY_STYLES:
        raise ValueError(f"lr_decay_style {lr_decay_style!r} is not one of {LR_DECAY_STYLES}")
    config = OptimizerConfig(
        optimizer=optimizer, lr=lr, min_lr=min_lr, weight_decay=weight_decay,
        adam_beta1=adam_beta1, adam_beta2=adam_beta2, adam_eps=adam_eps, clip_grad=clip_grad,
        bf16=params_dtype == torch.bfloat16, fp16=params_dtype == torch.float16,
        params_dtype=params_dtype, use_distributed_optimizer=use_distributed_optimizer,
        initial_loss_scale=initial_loss_scale if params_dtype == torch.float16 else None)
    megatron_optimizer = get_megatron_optimizer(config, model_chunks)
    use_fused_adam(megatron_optimizer)
    steps = max(1, int(train_iters))
    scheduler = OptimizerParamScheduler(
        megatron_optimizer, init_lr=0.0 if lr_warmup_fraction > 0 else lr, max_lr=lr, min_lr=min_lr,
        lr_warmup_steps=int(lr_warmup_fraction * steps), lr_decay_steps=steps, lr_decay_style=lr_decay_style,
        start_wd=weight_decay, end_wd=weight_decay, wd_incr_steps=steps, wd_incr_style="constant",
        override_opt_param_scheduler=True, use_checkpoint_opt_param_scheduler=False)  # on resume the config's schedule wins (e.g. more train_iters); the step count is restored
    if stochastic_rounding:
        from mindspeed_rl.models import stochastic_rounding as sr

        sr.enable(megatron_optimizer, model_chunks, seed=seed, step_of=lambda: scheduler.num_steps)
    return megatron_optimizer, scheduler


def use_fused_adam(megatron_optimizer) -> None:
    """Switch torch's Adam/AdamW inside megatron's optimizer to its fused kernel where the platform
    has one (platform.base.fused_adamw). Megatron builds torch's AdamW without Apex/TE, and on CPU torch
    then steps parameter by parameter (~10 ops each): the fused kernel takes 0.10 s instead of 0.53 s
    per step for 135M parameters on 2 cores. Called after building and after loading optimizer state,
    because load_state_dict takes the saved flags; the fused kernel wants `step` as an fp32 tensor on
    the parameter's device."""
    fused = fused_adamw(get_platform().name)
    for o in getattr(megatron_optimizer, "chained_optimizers", [megatron_optimizer]):
        inner = getattr(o, "optimizer", None)
        if type(inner) not in (torch.optim.AdamW, torch.optim.Adam):
            continue  # Apex / TE / MindSpeed fused Adam, or SGD: theirs
        for group in inner.param_groups:
            group["fused"] = fused
            if fused:
                group["foreach"] = False  # torch refuses fused and foreach together
                for p in group["params"]:
                    step = inner.state.get(p, {}).get("step")
                    if torch.is_tensor(step):
                        inner.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)
