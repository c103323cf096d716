"""Every worker entry point takes the driver's CPU batch, computes on the worker's device and hands
CPU tensors back (issue 17: on a GPU the batches stayed on the CPU next to a cuda:0 model).

No accelerator is needed: the worker's device is "meta", a device that is not the CPU. The model
calls behind each entry point (compute_log_probs, policy_update_step, the engine, compute_scores)
are replaced by spies that record the devices of what they receive and answer with tensors on the
device they were given; copying a meta tensor to the host is simulated by Tensor.cpu returning
zeros of the same shape and dtype.
"""
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.data import keys as K
from mindspeed_rl.platform import tensor_devices
from mindspeed_rl.workers.actor import ActorRolloutWorker, ReferenceWorker
from mindspeed_rl.workers.reward_model import RewardModelWorker
from mindspeed_rl.workers.rollout import RolloutWorker

META, CPU = torch.device("meta"), torch.device("cpu")
B, P, T = 4, 3, 5
ENTRY_POINTS = {ActorRolloutWorker: ("generate_sequences", "generate_probe", "compute_log_prob", "update_actor"),
                ReferenceWorker: ("compute_ref_log_prob",), RolloutWorker: ("generate_sequences", "generate_probe", "hf_weights"),
                RewardModelWorker: ("compute_rm_score",)}


@pytest.fixture(autouse=True)
def meta_to_host(monkeypatch):
    original = torch.Tensor.cpu
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **k: torch.zeros(self.shape, dtype=self.dtype)
                        if self.device.type == "meta" else original(self, *a, **k))


def cpu_batch():
    g = torch.Generator().manual_seed(0)
    return {K.PROMPT_IDS: torch.randint(0, 9, (B, P), generator=g), K.INPUT_IDS: torch.randint(0, 9, (B, P + T), generator=g),
            K.ATTENTION_MASK: torch.ones(B, P + T, dtype=torch.long), K.RESPONSES: torch.randint(0, 9, (B, T), generator=g),
            K.RESPONSE_MASK: torch.ones(B, T, dtype=torch.long), K.ADVANTAGES: torch.randn(B, T, generator=g),
            K.OLD_LOG_PROBS: torch.randn(B, T, generator=g), K.REF_LOG_PROBS: torch.randn(B, T, generator=g)}


def prompts():
    return {K.PROMPT_IDS: torch.ones(2, P, dtype=torch.long), K.PROMPT_MASK: torch.ones(2, P, dtype=torch.long),
            K.GROUP_INDEX: torch.arange(2)}


def worker(cls, seen):
    w = cls.__new__(cls)  # no Ray, no process group: the data path only
    ppo = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None, loss_agg_mode="token-mean",
                          use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.1, entropy_coeff=0.0,
                          ppo_mini_batch_size=2, ppo_epochs=1, shuffle_minibatch=True,
                          tis_mode="off", tis_cap=2.0)
    w.cfg = SimpleNamespace(run=SimpleNamespace(seed=1, global_batch_size=4), actor=SimpleNamespace(ppo=ppo))
    w.role_cfg = SimpleNamespace(micro_batch_size=2)
    w.device, w.model, w.ddp, w.optimizer, w.scheduler = META, torch.nn.Linear(1, 1), None, None, None
    w.calls, w.weight_updates, w.offload, w.temperature, w.vocab_size = 0, 1, False, 1.0, 9
    w.engine, w._sampling, w.args = None, lambda n, greedy, seed: None, {}
    w.rank_info = lambda: {"dp_rank": 0}
    seen.clear()
    return w


@pytest.fixture
def spies(monkeypatch):
    """Record the devices every model call receives; answer on the device of its inputs."""
    import mindspeed_rl.models.forward as forward
    import mindspeed_rl.models.reward_model as reward_model
    import mindspeed_rl.models.train_step as train_step
    import mindspeed_rl.rollout.interface as interface
    import mindspeed_rl.rollout.weight_buckets as weight_buckets

    seen: list[set] = []

    def compute_log_probs(model, input_ids, attention_mask, mbs, temperature, vocab_size, from_position=0):
        seen.append(tensor_devices([input_ids, attention_mask]))
        return torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, device=input_ids.device), None

    def policy_update_step(model, optimizer, scheduler, mb, prompt_width, mbs, s):
        seen.append(tensor_devices(mb))
        return {"actor/pg_loss": 0.5}

    def generate_batch(engine, prompts, n, params):  # the engine answers on the model's device
        rows = prompts[K.PROMPT_IDS].shape[0] * n
        return {K.RESPONSES: torch.zeros(rows, T, dtype=torch.long, device=META),
                K.ROLLOUT_LOG_PROBS: torch.zeros(rows, T, device=META), K.FINISH_REASON: ["eos"] * rows,
                K.GROUP_INDEX: prompts[K.GROUP_INDEX].repeat_interleave(n)}

    def compute_scores(model, input_ids, attention_mask, mbs):
        seen.append(tensor_devices([input_ids, attention_mask]))
        return torch.zeros(input_ids.shape[0], device=input_ids.device)

    monkeypatch.setattr(forward, "compute_log_probs", compute_log_probs)
    monkeypatch.setattr(train_step, "policy_update_step", policy_update_step)
    monkeypatch.setattr(interface, "generate_batch", generate_batch)
    monkeypatch.setattr(reward_model, "compute_scores", compute_scores)
    monkeypatch.setattr(weight_buckets, "gathered_hf_tensors",
                        lambda model, args, skip=None: iter([("w", torch.ones(2, device=META))]))
    return seen


def test_every_entry_point_carries_the_device_rule():
    missing = [f"{cls.__name__}.{name}" for cls, names in ENTRY_POINTS.items() for name in names
               if not getattr(getattr(cls, name), "on_device", False)]
    assert missing == []


@pytest.mark.parametrize("cls,call", [
    (ActorRolloutWorker, lambda w: w.compute_log_prob(cpu_batch())),
    (ReferenceWorker, lambda w: w.compute_ref_log_prob(cpu_batch())),
    (ActorRolloutWorker, lambda w: w.update_actor(cpu_batch())),
    (RewardModelWorker, lambda w: w.compute_rm_score(cpu_batch())),
])
def test_batches_go_to_the_device_and_results_come_back(spies, cls, call):
    out = call(worker(cls, spies))
    assert spies and all(devices == {META} for devices in spies), spies
    assert tensor_devices(out) <= {CPU}


@pytest.mark.parametrize("cls", [ActorRolloutWorker, RolloutWorker])
def test_generated_batches_come_back_to_the_host(spies, cls):
    out = worker(cls, spies).generate_sequences(prompts(), 2)
    assert tensor_devices(out) == {CPU} and out[K.RESPONSES].shape == (4, T) and out[K.FINISH_REASON] == ["eos"] * 4


def test_weights_for_checks_come_back_to_the_host(spies):
    assert tensor_devices(worker(RolloutWorker, spies).hf_weights()) == {CPU}


def test_the_worker_builds_its_model_on_its_device(gloo_world1, monkeypatch):
    """The worker's model lands wholly on the worker's device, in the role's params_dtype (the device
    is "meta" here: a platform whose device is not where the defaults would put things)."""
    import mindspeed_rl.data.tokenizer as tokenizer
    import mindspeed_rl.distributed.worker_env as worker_env
    import mindspeed_rl.workers.actor as actor
    from mindspeed_rl.platform import Platform, placement_problems

    args = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, padded_vocab_size=40,
                max_position_embeddings=32, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)
    monkeypatch.setattr(Platform, "device", lambda self, local_rank=0: META)
    monkeypatch.setattr(worker_env, "init_distributed", lambda platform: SimpleNamespace(device_index=0))
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda path, trust_remote_code=False: [0] * 40)
    monkeypatch.setattr(actor, "model_args", lambda role_cfg, vocab: dict(args))
    from mindspeed_rl.config.schema import ParallelConfig

    role = SimpleNamespace(mindspeed_switches={}, parallel=ParallelConfig(), params_dtype="bf16", load=None,
                           micro_batch_size=2, use_torch_compile=False)
    cfg = SimpleNamespace(run=SimpleNamespace(platform="auto", seed=1, tokenizer_name_or_path=None, trust_remote_code=False),
                          ref=role,
                          actor=SimpleNamespace(rollout=SimpleNamespace(temperature=1.0, do_sample=False)),
                          resource_pool=SimpleNamespace(ref=[1]))
    w = ReferenceWorker(cfg)
    assert w.device == META and placement_problems(w.model, META, torch.bfloat16) == []
