"""Platform selection, visible-device env handling, MindSpeed switch forwarding (NPU logic with
fake torch_npu / mindspeed packages written to a temp dir)."""

import logging
import sys
import textwrap
import types

import pytest
import torch

import mindspeed_rl.platform as platform_pkg
from mindspeed_rl.platform import MINDSPEED_SWITCHES, base, get_platform, npu


def _fake_torch_npu(available=True, count=2):
    mod = types.ModuleType("torch_npu")
    mod.npu = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: count)
    return mod


# ---- selection


def test_auto_picks_npu_when_torch_npu_sees_devices(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", _fake_torch_npu())
    assert base.resolve_name("auto") == "npu"


@pytest.mark.parametrize("fake", [None, _fake_torch_npu(available=False), _fake_torch_npu(count=0)])
def test_auto_falls_back_to_cuda_then_cpu(monkeypatch, fake):
    monkeypatch.setitem(sys.modules, "torch_npu", fake)  # None makes `import torch_npu` fail
    monkeypatch.setattr(base, "cuda_available", lambda: True)
    assert base.resolve_name("auto") == "cuda"
    monkeypatch.setattr(base, "cuda_available", lambda: False)
    assert base.resolve_name("AUTO") == "cpu"


def test_unknown_platform_name_lists_choices():
    with pytest.raises(ValueError, match="auto, npu, cuda, cpu"):
        base.resolve_name("tpu")


@pytest.mark.parametrize("name,resource,backend,var", [
    ("npu", "NPU", "hccl", "ASCEND_RT_VISIBLE_DEVICES"),
    ("cuda", "GPU", "nccl", "CUDA_VISIBLE_DEVICES"),
    ("cpu", "NPU", "gloo", None),
])
def test_platform_facts(name, resource, backend, var):
    plat = base.make_platform(name)
    assert (plat.name, plat.ray_resource, plat.dist_backend) == (name, resource, backend)
    assert plat.visible_devices_env_var == var
    if name != "npu":  # torch.device("npu") exists only once torch_npu is imported
        assert plat.device(3) == (torch.device("cpu") if name == "cpu" else torch.device(name, 3))


def test_get_platform_is_cached_and_refuses_to_switch(monkeypatch):
    monkeypatch.setattr(platform_pkg, "_ACTIVE", None)
    plat = get_platform("cpu")
    assert get_platform() is plat and get_platform("cpu") is plat
    with pytest.raises(RuntimeError, match="already runs on platform 'cpu'"):
        get_platform("cuda")


# ---- visible devices


def test_visible_devices_round_trip():
    plat, env = base.make_platform("npu"), {}
    assert plat.get_visible_devices(env) is None
    plat.set_visible_devices([4, 5], env)
    assert env == {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    assert plat.get_visible_devices(env) == [4, 5]
    env["ASCEND_RT_VISIBLE_DEVICES"] = "0,x"
    with pytest.raises(ValueError, match="ASCEND_RT_VISIBLE_DEVICES='0,x'"):
        plat.get_visible_devices(env)


def test_cpu_has_no_visible_devices_and_ray_noset_env():
    cpu, cuda, env = base.make_platform("cpu"), base.make_platform("cuda"), {}
    cpu.set_visible_devices([0, 1], env)
    assert env == {} and cpu.get_visible_devices(env) is None
    assert cpu.ray_worker_env(manage_visible_devices=True) == {}
    assert cuda.ray_worker_env(True) == {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
    assert cuda.ray_worker_env(False) == {}


# ---- MindSpeed switches


def test_unknown_switch_raises_listing_known_ones():
    with pytest.raises(ValueError, match="use_flash_attn"):
        base.check_switches({"use_flash_attention": True})


def test_switches_are_ignored_off_npu(caplog):
    plat = base.make_platform("cpu")  # cpu patch is already applied by conftest: idempotent
    with caplog.at_level(logging.WARNING, logger="mindspeed_rl"):
        ignored = plat.patch({"use_flash_attn": True, "use_fused_rmsnorm": False})
    assert ignored == ["use_flash_attn"]
    assert "ignored on cpu: use_flash_attn" in caplog.text


def test_switches_to_argv():
    argv = npu.switches_to_argv({"use_flash_attn": True, "use_mc2": False, "shape_order": "BSND",
                                 "sparse_mode": 0, "pre_tockens": None})
    assert argv == ["--use-flash-attn", "--shape-order", "BSND", "--sparse-mode", "0"]
    assert set(MINDSPEED_SWITCHES) >= {"use_flash_attn", "use_fused_rmsnorm", "use_fused_swiglu",
                                       "use_fused_rotary_pos_emb", "use_mc2"}


_FAKE_FILES = {
    "torch_npu/__init__.py": "npu = None\n",
    "torch_npu/contrib/__init__.py": "",
    "torch_npu/contrib/transfer_to_npu.py": "",
    "mindspeed/__init__.py": "",
    # the real args_utils parses sys.argv once (parse_known_args) and caches it
    "mindspeed/args_utils.py": textwrap.dedent("""
        import argparse
        _ARGS = None
        def get_mindspeed_args():
            global _ARGS
            if _ARGS is None:
                p = argparse.ArgumentParser(allow_abbrev=False)
                p.add_argument('--use-flash-attn', action='store_true')
                p.add_argument('--use-fused-rmsnorm', action='store_true')
                p.add_argument('--shape-order', default='SBH')
                _ARGS, _ = p.parse_known_args()
            return _ARGS
    """),
    "mindspeed/megatron_adaptor.py": "from mindspeed.args_utils import get_mindspeed_args\nget_mindspeed_args()\n",
}


@pytest.fixture
def fake_ascend(tmp_path, monkeypatch):
    for rel, text in _FAKE_FILES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(npu, "_PATCHED", None)
    monkeypatch.delitem(sys.modules, "megatron.core")  # pretend megatron is not imported yet
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ("torch_npu", "mindspeed")]:
        del sys.modules[name]


def test_npu_patch_hands_switches_to_mindspeed(fake_ascend, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["ray_gpt.py", "--config-name", "x"])
    npu.patch({"use_flash_attn": True, "shape_order": "BSND", "use_fused_rmsnorm": False})
    args = sys.modules["mindspeed.args_utils"].get_mindspeed_args()
    assert args.use_flash_attn and args.shape_order == "BSND" and not args.use_fused_rmsnorm
    assert sys.argv == ["ray_gpt.py", "--config-name", "x"]  # restored
    npu.patch({"use_flash_attn": True, "shape_order": "BSND", "use_fused_rmsnorm": False})  # idempotent
    with pytest.raises(RuntimeError, match="already patched"):
        npu.patch({"use_flash_attn": False})


def test_npu_patch_fails_loudly_when_mindspeed_parsed_args_earlier(fake_ascend, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["x"])
    import mindspeed.args_utils

    mindspeed.args_utils.get_mindspeed_args()  # someone imported MindSpeed first, without switches
    with pytest.raises(RuntimeError, match="did not pick up these switches: use_flash_attn=True"):
        npu.patch({"use_flash_attn": True})


def test_npu_patch_refuses_after_megatron_import(fake_ascend, monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron.core", types.ModuleType("megatron.core"))
    with pytest.raises(RuntimeError, match="megatron.core was imported before the NPU platform patch"):
        npu.patch({})


def test_expected_platform_is_judged_without_a_device(monkeypatch):
    """Validation's view of the platform: explicit names as given; "auto" is npu where torch_npu is
    installed (nothing is imported or touched), else stays "auto" (cpu or cuda); attention honours
    masks (a sliding window as a masked band) except in MindSpeed's fused kernel on NPU."""
    import importlib.util

    from mindspeed_rl.platform.base import attention_takes_masks, expected_platform

    assert [expected_platform(n) for n in ("cpu", "cuda", "npu")] == ["cpu", "cuda", "npu"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch_npu" else real(name, *a))
    assert expected_platform("auto") == "auto" and attention_takes_masks("auto")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "torch_npu" else real(name, *a))
    assert expected_platform("auto") == "npu" and not attention_takes_masks("npu")
