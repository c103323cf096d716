"""distributed.worker_env helpers that need no Ray worker."""


def test_local_world_is_made_once(gloo_world1):
    """Scripts call init_local_world for megatron's process group; a process that has one keeps it."""
    import torch

    from mindspeed_rl.distributed.worker_env import init_local_world

    assert torch.distributed.is_initialized()
    assert init_local_world("gloo") is False and torch.distributed.get_world_size() == 1
