"""Stochastic rounding of megatron's fp32 main params into the bf16 model params (opt-in: the
`bf16_stochastic_rounding` key of the actor).

    enable(megatron_optimizer, model_chunks, seed=1234, step_of=lambda: scheduler.num_steps)

With `bf16: true` megatron's mixed-precision optimizer steps fp32 main params and copies them into
the bf16 parameters the model computes with, rounding to nearest. An update smaller than half a bf16
ulp then never reaches the model until the fp32 copy has drifted across a rounding boundary: at real
learning rates (1e-6 .. 1e-5, weights ~0.05, ulp 2.4e-4) most bf16 weights stay where they started
for tens of steps (docs/benchmarks.md, bf16 on CPU). Stochastic rounding rounds up with probability equal to
the distance to the lower neighbour, so the bf16 weight is an unbiased estimate of the fp32 one at
every step: E[round(x)] = x. The copy becomes: add 16 random bits to the fp32 bit pattern, keep the
upper 16 (the bf16 of a truncation). Values a bf16 holds exactly are copied unchanged; non-finite
values are copied as megatron would (round to nearest keeps them).

The random bits are a pure function of (seed, optimizer step, parameter, element position), so
- replicas round alike: data-parallel ranks (with or without the distributed optimizer, which
  rounds only its shard, at the shard's offset inside the parameter), tensor-parallel ranks for
  the parameters they replicate (norms, row-parallel biases), expert-data-parallel ranks, and the
  first and last pipeline stages for the tied word embedding;
- a resumed run rounds as the uninterrupted one did (the step is the scheduler's restored count);
- DP=2 with the distributed optimizer gives the bf16 weights DP=1 gives (tests/dist).
The stream is cut in blocks of 2**20 elements, each from its own seeded generator: numpy's SFC64
on the host (about 1.1 ns an element with the arithmetic, 2 CPU cores: 0.15 s for SmolLM2's 135M
params, against 0.02 s for the round-to-nearest copy), torch's device generator elsewhere, where
the copy queues its kernels without a host sync (NaN is masked per block on the device).
"""
from __future__ import annotations

import types
import zlib
from typing import Callable, Iterable

import numpy as np
import torch

BLOCK = 1 << 20
_BF16_NAN = 0x7FC0  # the quiet NaN torch's fp32 -> bf16 conversion gives


def block_seed(key: tuple[int, ...], block: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([k & 0xFFFFFFFF for k in key] + [block])


def _block_noise_host(key: tuple[int, ...], block: int, lo: int, hi: int) -> np.ndarray:
    """Elements [lo, hi) of block `block`'s 16-bit noise, as uint16."""
    gen = np.random.SFC64(block_seed(key, block))
    return gen.random_raw((hi + 3) // 4).view(np.uint16)[lo:hi]


def _block_noise_device(key: tuple[int, ...], block: int, lo: int, hi: int, device: torch.device) -> torch.Tensor:
    seed = int(block_seed(key, block).generate_state(1, np.uint64)[0]) & ((1 << 63) - 1)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.randint(0, 1 << 16, (hi,), dtype=torch.int32, device=device, generator=gen)[lo:hi]


_SCRATCH: dict[torch.device, torch.Tensor] = {}


def _scratch(device: torch.device) -> torch.Tensor:
    """One block of int32 work space per device, kept: a fresh 4 MB tensor per parameter costs more
    in page faults than the rounding itself (0.33 s against 0.15 s for SmolLM2's 181 tensors)."""
    if device not in _SCRATCH:
        _SCRATCH[device] = torch.empty(BLOCK, dtype=torch.int32, device=device)
    return _SCRATCH[device]


def noise_on_host(device: torch.device) -> bool:
    """numpy's generator for tensors in host memory; torch's device generator otherwise."""
    return device.type == "cpu"


def stochastic_round_(dst: torch.Tensor, src: torch.Tensor, key: tuple[int, ...], start: int = 0) -> torch.Tensor:
    """dst (bf16) <- src (fp32) rounded stochastically; element i uses the noise of position
    start + i of the stream `key`, so a shard [start, start + n) of a tensor rounds exactly as that
    slice of the whole tensor does. Returns dst."""
    if dst.dtype != torch.bfloat16 or src.dtype != torch.float32:
        raise TypeError(f"stochastic rounding copies fp32 into bf16, got {src.dtype} -> {dst.dtype}")
    if dst.numel() != src.numel():
        raise ValueError(f"stochastic rounding: {src.numel()} values into {dst.numel()}")
    n = src.numel()
    if n == 0:
        return dst
    bits = src.detach().reshape(-1).contiguous().view(torch.int32)
    out = dst.view(-1) if dst.is_contiguous() else torch.empty(n, dtype=torch.bfloat16, device=dst.device)
    out16 = out.view(torch.int16)
    host = noise_on_host(src.device)
    buf = _scratch(src.device)
    done = 0
    while done < n:
        pos = start + done
        block, lo = divmod(pos, BLOCK)
        m = min(n - done, BLOCK - lo)
        x = buf[:m]
        if host:
            np.copyto(x.numpy(), _block_noise_host(key, block, lo, lo + m), casting="unsafe")
        else:
            x.copy_(_block_noise_device(key, block, lo, lo + m, src.device))
        # fp32 bits + U[0, 2^16), truncated to the upper half: the bf16 of the result. For negative
        # values the bit pattern is sign-magnitude, so this rounds the magnitude, as it should.
        x.add_(bits[done:done + m]).bitwise_right_shift_(16)
        if not host:  # NaN in place, with no host sync (see below)
            x.masked_fill_(bits[done:done + m].bitwise_and(0x7FFFFFFF) > 0x7F800000, _BF16_NAN)
        out16[done:done + m].copy_(x)
        done += m
    # +-inf come out as themselves (the noise stays below the bf16 bits); a NaN could carry into the
    # exponent or the sign, or truncate to inf. On the host: a sum is NaN whenever an element is (and
    # seldom otherwise: inf - inf) and costs a fraction of an isfinite mask; on an accelerator that
    # test would be one host sync per parameter per step, so the blocks above mask NaN bit patterns
    # (exponent all ones, mantissa not zero) on the device instead.
    if host and not bool(torch.isfinite(src.sum())):
        bad = torch.isnan(src).reshape(-1)
        out[bad] = src.reshape(-1)[bad].to(torch.bfloat16)
    if out.data_ptr() != dst.data_ptr():
        dst.copy_(out.view(dst.shape))
    return dst


def param_keys(model_chunks: Iterable[torch.nn.Module]) -> dict[int, tuple[int, ...]]:
    """id(param) -> the key of its noise stream: equal exactly for parameters that are replicas of
    one another (see the module docstring), distinct otherwise (up to 32-bit name hashes)."""
    from megatron.core import parallel_state as ps

    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    try:
        etp = ps.get_expert_tensor_parallel_rank()
    except (AssertionError, AttributeError, RuntimeError):  # no expert groups initialized
        etp = tp
    keys: dict[int, tuple[int, ...]] = {}
    for chunk_index, chunk in enumerate(model_chunks):
        for name, p in chunk.named_parameters():
            if getattr(p, "shared_embedding", False):  # tied word embedding: first and last stage alike
                keys[id(p)] = (zlib.crc32(b"shared_embedding"), -1, -1, -1)
                continue
            expert = not getattr(p, "allreduce", True)
            split = getattr(p, "tensor_model_parallel", False)
            shard = (etp if expert else tp) if split else -1
            keys[id(p)] = (zlib.crc32(name.encode()), shard, pp, chunk_index)
    return keys


def enable(megatron_optimizer, model_chunks: list[torch.nn.Module], *, seed: int,
           step_of: Callable[[], int]) -> int:
    """Make every bf16 main-to-model copy of megatron_optimizer (Float16OptimizerWithFloat16Params
    or DistributedOptimizer, alone or chained) round stochastically. step_of() returns the number of
    optimizer steps taken before the current one. Returns how many optimizers were switched."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params

    keys = param_keys(model_chunks)
    switched = 0
    for opt in getattr(megatron_optimizer, "chained_optimizers", [megatron_optimizer]):
        if not opt.config.bf16:
            continue  # fp32 params: no rounding; fp16: its own range issues, not handled here
        if isinstance(opt, DistributedOptimizer):
            opt._copy_main_params_to_model_params = types.MethodType(_make_distributed_copy(keys, seed, step_of), opt)
        elif isinstance(opt, Float16OptimizerWithFloat16Params):
            opt._copy_main_params_to_model_params = types.MethodType(_make_float16_copy(keys, seed, step_of), opt)
        else:
            raise TypeError(f"bf16_stochastic_rounding: megatron optimizer {type(opt).__name__} is not supported")
        switched += 1
    return switched


def _key(keys: dict[int, tuple[int, ...]], param: torch.nn.Parameter, seed: int, step: int) -> tuple[int, ...]:
    try:
        return (seed, step) + keys[id(param)]
    except KeyError:
        raise RuntimeError("bf16_stochastic_rounding: an optimizer parameter is not in the model chunks "
                           "it was enabled with") from None


def _make_float16_copy(keys, seed: int, step_of: Callable[[], int]):
    def copy(self) -> None:
        step = int(step_of())
        for model_group, main_group in zip(self.float16_groups, self.fp32_from_float16_groups):
            for model_param, main_param in zip(model_group, main_group):
                if model_param.dtype == torch.bfloat16:
                    stochastic_round_(model_param.data, main_param.data, _key(keys, model_param, seed, step))
                else:
                    model_param.data.copy_(main_param.data)
    return copy


def _make_distributed_copy(keys, seed: int, step_of: Callable[[], int]):
    """megatron-core's DistributedOptimizer._copy_main_params_to_model_params (0.12-0.16) with the
    bf16 shards rounded stochastically at their offset inside the parameter. fp8 parameters, FSDP and
    the precision-aware optimizer are refused with a sentence."""
    def copy(self) -> None:
        if getattr(self, "is_stub_optimizer", False):
            return
        if any(getattr(self.ddp_config, k, False) for k in ("use_custom_fsdp", "use_megatron_fsdp")) or \
                getattr(self.config, "use_precision_aware_optimizer", False):
            raise RuntimeError("bf16_stochastic_rounding does not support megatron's FSDP or its precision-aware "
                               "optimizer: turn one of them off")
        from megatron.core.fp8_utils import is_float8tensor
        step = int(step_of())

        def copy_group_params(shard_main_groups, model_groups):
            for shard_main_group, model_group in zip(shard_main_groups, model_groups):
                for shard_main_param, model_param in zip(shard_main_group, model_group):
                    if is_float8tensor(model_param):
                        raise RuntimeError("bf16_stochastic_rounding does not support fp8 parameters")
                    range_map = self._get_model_param_range_map(model_param)
                    world_range = range_map["gbuf_world_in_bucket"]
                    assert world_range.size == shard_main_param.nelement()
                    gbuf_index, _, bucket_id = self.model_param_gbuf_map[model_param]
                    buffer = self.buffers[gbuf_index].buckets[bucket_id].param_data
                    shard_model_param = buffer.view(-1)[world_range.start:world_range.end]
                    if shard_model_param.dtype == torch.bfloat16 and shard_main_param.dtype == torch.float32:
                        stochastic_round_(shard_model_param, shard_main_param.data,
                                          _key(keys, model_param, seed, step), start=range_map["param"].start)
                    else:
                        shard_model_param.data.copy_(shard_main_param)

        copy_group_params(self.shard_fp32_from_float16_groups, self.model_float16_groups)
        copy_group_params(self.shard_fp32_groups, self.model_fp32_groups)
    return copy

