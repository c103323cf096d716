"""distributed.worker_env helpers that need no Ray worker."""


def test_local_world_is_made_once(gloo_world1):
    """Scripts call init_local_world for megatron's process group; a process that has one keeps it."""
    import torch

    from mindspeed_rl.distributed.worker_env import init_local_world

    assert torch.distributed.is_initialized()
    assert init_local_world("gloo") is False and torch.distributed.get_world_size() == 1


DESTROY_WORLD = r"""
import torch
from mindspeed_rl.platform import get_platform
get_platform("cpu").patch()
from mindspeed_rl.distributed.worker_env import destroy_world, init_local_world
from mindspeed_rl.models.builder import init_parallel_state
from megatron.core import parallel_state
destroy_world()  # no world yet: nothing to do
assert init_local_world("gloo")
init_parallel_state(1, 1)
torch.distributed.all_reduce(torch.ones(3), group=parallel_state.get_tensor_model_parallel_group())
groups = len(torch.distributed.distributed_c10d._world.pg_map)
destroy_world()
assert not torch.distributed.is_initialized() and not parallel_state.model_parallel_is_initialized()
assert not torch.distributed.distributed_c10d._world.pg_map
print("groups", groups)
assert init_local_world("gloo")  # a new world after it
destroy_world()
"""


def test_destroy_world_shuts_down_every_group():
    """A script's end: megatron's state and every process group gone (left alive, their gloo
    threads can abort the process at exit), and a world can be made again."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", DESTROY_WORLD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split("groups")[1]) > 5  # megatron's groups were there to shut down
