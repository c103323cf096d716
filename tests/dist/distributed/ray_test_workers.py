"""Trivial Ray worker roles for the distributed tests: they join gloo the way real roles do."""
import datetime
import os
import sys
import time

import ray
import torch
import torch.distributed as dist

from mindspeed_rl.config import build_config, compose_yaml
from mindspeed_rl.distributed.plan import make_plan
from mindspeed_rl.distributed.worker_env import init_distributed, rank_info
from mindspeed_rl.platform import get_platform


def plan_of(*overrides) -> dict:
    """role -> RolePlacement of the tiny experiment with overrides (resource_pool.actor_rollout=[2])."""
    return {p.role: p for p in make_plan(build_config(compose_yaml("grpo_trainer_tiny", list(overrides)), "t"))}


class GlooWorker:
    def __init__(self, fail_init: bool = False):
        if fail_init:
            raise ValueError("bad init value")
        torch.set_num_threads(1)
        self.env = init_distributed(get_platform("cpu"), timeout=datetime.timedelta(seconds=60))

    def env_info(self) -> dict:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MINDSPEED_RL_ROLE")
        return {k: os.environ.get(k) for k in keys} | {"device_index": self.env.device_index}

    def all_reduce_rank(self) -> float:
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)  # 0 + 1 over 2 ranks
        return t.item()

    def rank_info(self) -> dict:
        return rank_info()

    def echo_shard(self, shard: dict) -> dict:
        """Return the shard and, per row, every rank's view of the shard's first id (must agree
        within a DP group)."""
        views = [None] * dist.get_world_size()
        dist.all_gather_object(views, shard["ids"][0])
        rows = len(shard["ids"])
        return {"x": shard["x"] * 1, "ids": list(shard["ids"]), "rank": [dist.get_rank()] * rows, "views": [views] * rows}

    def sleep_on(self, rank: int, seconds: float) -> int:
        if dist.get_rank() == rank:
            time.sleep(seconds)
        return dist.get_rank()

    def exit_on(self, rank: int) -> int:
        if dist.get_rank() == rank:
            os._exit(1)
        time.sleep(30)  # the survivor hangs (as in a collective with the dead rank): the group must not
        return dist.get_rank()

    def raise_on(self, rank: int) -> int:
        if dist.get_rank() == rank:
            raise KeyError("no such sample")
        return dist.get_rank()

    def oom_on(self, rank: int) -> int:
        """What the CUDA caching allocator raises when the device is full."""
        if dist.get_rank() == rank:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                         "of 79.11 GiB of which 1.20 GiB is free. Of the allocated memory 70.00 GiB "
                                         "is allocated by PyTorch.")
        return dist.get_rank()


# Ray workers cannot import this test-only module by name (it is not installed): ship it by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ThreadsWorker:
    """Reports the host threads / niceness Ray gave it and what init_distributed made of them."""

    def __init__(self):
        self.given = {"omp": os.environ.get("OMP_NUM_THREADS"), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
        self.env = init_distributed(get_platform("cpu"), timeout=datetime.timedelta(seconds=60))

    def report(self) -> dict:
        return {"given": self.given, "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
                "nice": os.getpriority(os.PRIO_PROCESS, 0), "info": rank_info()}
