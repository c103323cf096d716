"""The keys a device out-of-memory sentence names (trainer/oom_advice.py), per phase, with values."""
import pytest

from mindspeed_rl.config import load_config
from mindspeed_rl.trainer.oom_advice import device_oom_advice

A = "actor_rollout_ref.actor_rollout"


@pytest.fixture(scope="module")
def cfg():
    return load_config("grpo_trainer_tiny", [f"{A}.micro_batch_size=4", f"{A}.num_samples_per_step=16"])


def test_each_phase_names_the_keys_that_bound_its_memory(cfg):
    assert device_oom_advice(cfg, "actor_rollout", "update_actor") == (
        f"lower {A}.micro_batch_size (now 4), set {A}.recompute_granularity: full (activations recomputed in the "
        f"backward), or raise {A}.tensor_model_parallel_size (now 1) or pipeline_model_parallel_size (now 1)")
    gen = device_oom_advice(cfg, "actor_rollout", "generate_sequences")
    assert gen.startswith(f"lower {A}.num_samples_per_step (now 16, sequences per generation batch), "
                          f"max_tokens_to_oom (now 1000000) or max_new_tokens (now ")
    assert "gpu_memory_utilization" not in gen  # the native engine
    assert device_oom_advice(cfg, "rollout", "generate_sequences") == gen  # the split's generation ranks
    assert device_oom_advice(cfg, "ref", "compute_ref_log_prob") == (
        "lower actor_rollout_ref.ref.micro_batch_size (now " + str(cfg.ref.micro_batch_size) + "), or set "
        "actor_rollout_ref.ref.param_offload: true (the reference waits in host memory between uses)")
    assert device_oom_advice(cfg, "actor_rollout", "__init__") == (
        f"the model does not fit: raise {A}.tensor_model_parallel_size (now 1) or pipeline_model_parallel_size "
        f"(now 1), or set {A}.bf16: true")


def test_vllm_and_recompute_and_bf16_change_the_advice():
    cfg = load_config("grpo_trainer_tiny", [f"{A}.rollout_engine=vllm", f"{A}.recompute_granularity=full",
                                            f"{A}.bf16=true", f"{A}.gpu_memory_utilization=0.5"])
    assert "gpu_memory_utilization (now 0.5) of the device" in device_oom_advice(cfg, "actor_rollout",
                                                                                  "generate_sequences")
    assert "recompute_granularity" not in device_oom_advice(cfg, "actor_rollout", "update_actor")
    assert "bf16" not in device_oom_advice(cfg, "actor_rollout", "__init__")
    assert device_oom_advice(cfg, "actor_rollout", "update_weights") == (
        f"the weight sync needs room for one bucket of weights beside the rollout engine: lower "
        f"{A}.gpu_memory_utilization (now 0.5)")
