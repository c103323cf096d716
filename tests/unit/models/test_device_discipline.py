"""Device and dtype discipline of the model code, checked on CPU (issue 17).

On a GPU the product failed at the first forward: the torch-norm fallback was created on the CPU
in fp32 next to bf16 weights on the device, and the update's finite check all-reduced a CPU flag
after one host sync per parameter. These tests catch those mistakes without an accelerator: the
"meta" device stands in for "a device that is not the CPU" (a model built under a meta default
device must still end up wholly on the device it was built for), and placement_problems() lists
every parameter/buffer off the requested device or dtype.
"""
import pytest
import torch

from mindspeed_rl.models.builder import build_gpt_model, init_parallel_state
from mindspeed_rl.platform import placement_problems, to_device, to_host

ARGS = dict(num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, group_query_attention=True,
            num_query_groups=2, kv_channels=8, padded_vocab_size=40, max_position_embeddings=32,
            add_qkv_bias=True, normalization="RMSNorm", swiglu=True, disable_bias_linear=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("qk_layernorm", [False, True])
def test_every_param_and_buffer_in_params_dtype_on_the_device(gloo_world1, dtype, qk_layernorm):
    """The RMSNorm fallback used to stay fp32: megatron keeps all weights in params_dtype."""
    init_parallel_state(1, 1, seed=3)
    model = build_gpt_model(dict(ARGS, qk_layernorm=qk_layernorm), params_dtype=dtype)
    assert placement_problems(model, torch.device("cpu"), dtype) == []


def test_a_foreign_default_device_does_not_split_the_model(gloo_world1):
    """Modules created without device= (torch.nn.RMSNorm) follow the default device; megatron's layers
    follow the platform's current device. The builder must put all of them on one device: here the
    default device is "meta" (standing in for a wrong one), and the model belongs on the CPU."""
    init_parallel_state(1, 1, seed=3)
    with torch.device("meta"):
        model = build_gpt_model(ARGS, params_dtype=torch.bfloat16)
    assert placement_problems(model, torch.device("cpu"), torch.bfloat16) == []
    assert model.rotary_pos_emb.inv_freq.device.type == "cpu"


def test_build_on_an_explicit_device(gloo_world1):
    """build_gpt_model(device=...) puts every weight there, rope frequencies included (a plain
    attribute, which module.to() would not move)."""
    init_parallel_state(1, 1, seed=3)
    model = build_gpt_model(dict(ARGS, rope_scaling_type="llama3", rope_scaling_factor=8.0),
                            params_dtype=torch.bfloat16, device=torch.device("meta"))
    assert placement_problems(model, torch.device("meta"), torch.bfloat16) == []
    assert model.rotary_pos_emb.inv_freq.device.type == "meta"
    assert model.rotary_pos_emb.inv_freq.dtype == torch.float32  # rope angles stay fp32


def test_placement_problems_names_the_offenders():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2).to(torch.bfloat16), torch.nn.RMSNorm(2))
    problems = placement_problems(model, torch.device("cpu"), torch.bfloat16)
    assert problems == ["1.weight is torch.float32, not torch.bfloat16"]
    assert placement_problems(model, torch.device("meta")) == [
        "0.weight is on cpu, not meta", "0.bias is on cpu, not meta", "1.weight is on cpu, not meta"]


def test_to_device_and_to_host_walk_nested_batches():
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), "text"], "c": ("x", 3), "d": {"e": torch.ones(1)}}
    moved = to_device(batch, torch.device("meta"))
    assert moved["a"].device.type == moved["b"][0].device.type == moved["d"]["e"].device.type == "meta"
    assert moved["b"][1] == "text" and moved["c"] == ("x", 3)
    grad = torch.ones(2, requires_grad=True) * 2
    back = to_host({"g": grad, "n": [grad]})
    assert not back["g"].requires_grad and back["n"][0].device.type == "cpu"


# ---------------------------------------------------------------------------------------------
# the update's finite check


def _linear_with_grads(device, n=12, bad=None):
    model = torch.nn.Sequential(*[torch.nn.Linear(3, 3, device=device) for _ in range(n)])
    for i, p in enumerate(model.parameters()):
        p.grad = torch.ones_like(p)
        if bad is not None and i == 7:
            p.grad[0] = bad
    return model


def test_finite_flag_lives_on_the_models_device():
    """nccl/hccl all-reduce device tensors only: a CPU flag crashed the first update on a GPU."""
    from mindspeed_rl.models.train_step import nonfinite_flag

    model = _linear_with_grads(torch.device("meta"))
    flag = nonfinite_flag(model, [{"actor/pg_loss": torch.zeros((), device="meta")}])
    assert flag.device.type == "meta" and flag.shape == (1,) and flag.dtype == torch.float32


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_finite_flag_finds_one_bad_gradient_or_loss_term(bad):
    from mindspeed_rl.models.train_step import nonfinite_flag

    cpu = torch.device("cpu")
    ok = [{"actor/pg_loss": torch.tensor(0.5), "actor/pg_clipfrac": torch.tensor(0.1)}]
    assert float(nonfinite_flag(_linear_with_grads(cpu), ok)) == 0.0
    assert float(nonfinite_flag(_linear_with_grads(cpu, bad=bad), ok)) == 1.0
    assert float(nonfinite_flag(_linear_with_grads(cpu), ok + [{"actor/kl_loss": torch.tensor(bad)}])) == 1.0
    assert float(nonfinite_flag(_linear_with_grads(cpu, bad=bad), ok, exact=True)) == 1.0
    huge = _linear_with_grads(cpu)  # finite values whose L2 norm would overflow fp32 are still finite
    for p in huge.parameters():
        p.grad.fill_(3e38)
    assert float(nonfinite_flag(huge, ok)) == 1.0  # the fast check's false alarm ...
    assert float(nonfinite_flag(huge, ok, exact=True)) == 0.0  # ... which the exact check settles
    from mindspeed_rl.models.train_step import _all_finite
    assert _all_finite(huge, ok) is True
    assert _all_finite(_linear_with_grads(cpu, bad=bad), ok) is False
    main = _linear_with_grads(cpu)  # megatron's main_grad is what the optimizer steps with
    next(main.parameters()).main_grad = torch.full((3, 3), bad)
    assert float(nonfinite_flag(main, ok)) == 1.0
    assert float(nonfinite_flag(main, ok, exact=True)) == 1.0


def test_finite_check_syncs_with_the_host_once_not_per_parameter(monkeypatch):
    """One .item() for the answer; the old loop did bool(isfinite(grad).all()) per parameter."""
    from mindspeed_rl.models import train_step

    syncs = []
    for name in ("__bool__", "item", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _o=original, _n=name, **k: (syncs.append(_n), _o(self, *a, **k))[1])
    model = _linear_with_grads(torch.device("cpu"), n=30)
    assert train_step._all_finite(model, [{"actor/pg_loss": torch.tensor(1.0)}]) is True
    assert len(syncs) == 1, syncs


# ---------------------------------------------------------------------------------------------
# loaders copy into the existing parameters


def _identity(model):
    return {n: (id(t), t.dtype, t.device, t.data_ptr()) for n, t in model.state_dict(keep_vars=True).items()
            if not n.endswith("_extra_state")}


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_loaders_copy_into_the_built_parameters(gloo_world1, tmp_path, arch):
    """After load_hf_checkpoint, a round trip through a checkpoint of this project and a rollout
    weight update, every tensor is the same object, in the same storage, dtype and device as built
    (a loader that replaced parameters put HF's fp32 CPU tensors in a bf16 device model)."""
    from testing_utils import make_tiny_hf

    from mindspeed_rl.models.builder import model_config_from_hf
    from mindspeed_rl.models.checkpoint import load_weights, save_checkpoint
    from mindspeed_rl.models.hf_bridge import load_hf_checkpoint, read_hf_config
    from mindspeed_rl.rollout.weights import load_hf_tensors
    from mindspeed_rl.rollout.weight_buckets import gathered_hf_tensors

    hf = make_tiny_hf(arch, str(tmp_path / "hf"))
    init_parallel_state(1, 1, seed=3)
    args = model_config_from_hf(read_hf_config(str(tmp_path / "hf")))
    model = build_gpt_model(args, params_dtype=torch.bfloat16)
    before = _identity(model)
    load_hf_checkpoint(model, str(tmp_path / "hf"), args)
    assert _identity(model) == before
    norm = model.decoder.layers[0].input_layernorm.weight
    expected = hf.model.layers[0].input_layernorm.weight.to(torch.bfloat16)
    assert torch.equal(norm.detach(), expected)  # the values did arrive
    save_checkpoint(str(tmp_path / "mg"), 1, model, args, vocab_size=120)
    load_weights(model, str(tmp_path / "mg"), args)
    assert _identity(model) == before
    load_hf_tensors(model, list(gathered_hf_tensors(model, args)), args)
    assert _identity(model) == before
    assert placement_problems(model, torch.device("cpu"), torch.bfloat16) == []


def test_the_platform_names_its_current_device():
    from mindspeed_rl.platform import get_platform

    plat = get_platform()
    assert plat.current_device() == torch.device("cpu") and plat.device_name().startswith("cpu (")
