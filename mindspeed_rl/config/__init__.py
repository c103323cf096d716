"""Experiment configuration: hydra-composed ray_gpt yaml -> typed, validated `Config`."""
from mindspeed_rl.config.loader import build_config, compose_yaml, load_config
from mindspeed_rl.config.schema import Config, RoleConfig

__all__ = ["Config", "RoleConfig", "build_config", "compose_yaml", "load_config"]
