"""The start-up check of the accelerator stack, on fake version sets: one sentence per mismatch."""
import pytest

import ray_gpt
from mindspeed_rl.platform import versions
from mindspeed_rl.platform.versions import cann_version, check_versions

NPU_OK = {"torch": "2.7.1", "torch_npu": "2.7.1.post2", "cann": "8.5.0", "mindspeed": "0.12.1",
          "megatron-core": "0.12.1", "vllm": "0.9.1", "vllm-ascend": "0.9.1rc1", "torch_cuda": None,
          "vllm_requires_torch": "2.7.1"}
CPU_OK = {"torch": "2.13.0+cpu", "megatron-core": "0.12.1", "torch_cuda": None}


def test_good_stacks_pass():
    assert check_versions(NPU_OK, "npu") == []
    assert check_versions(CPU_OK, "cpu") == []
    assert check_versions({**CPU_OK, "megatron-core": "0.16.1"}, "cpu") == []
    assert check_versions({"torch": "2.8.0+cu128", "torch_cuda": "12.8", "megatron-core": "0.12.1"}, "cuda") == []


CASES = [
    ("torch-npu-vs-torch", {"torch": "2.6.0", "vllm_requires_torch": None}, "npu", "torch_npu 2.7.1.post2 is built for torch 2.7.1, but torch 2.6.0 is installed"),
    ("cann", {"cann": "8.3.RC1"}, "npu", "torch_npu 2.7.1.post2 was released for CANN 8.5.0, but CANN 8.3.RC1 is installed"),
    ("no-cann", {"cann": None}, "npu", "no CANN toolkit found"),
    ("no-torch-npu", {"torch_npu": None}, "npu", "the npu platform needs torch_npu"),
    ("mindspeed-vs-core", {"mindspeed": "0.16.0"}, "npu", "MindSpeed 0.16.0 adapts megatron-core 0.16.x, but megatron-core 0.12.1"),
    ("vllm-ascend-vs-vllm", {"vllm": "0.10.0", "vllm_requires_torch": "2.7.1"}, "npu", "vllm-ascend 0.9.1rc1 pairs with vllm 0.9.x, but vllm 0.10.0"),
    ("vllm-ascend-alone", {"vllm": None, "vllm_requires_torch": None}, "npu", "vllm-ascend 0.9.1rc1 is installed without vllm"),
    ("vllm-torch-pin", {"vllm_requires_torch": "2.8.0"}, "npu", "vllm 0.9.1 is built for torch 2.8.0, but torch 2.7.1"),
    ("core-too-new", {"megatron-core": "0.17.0", "mindspeed": None}, "npu", "megatron-core 0.17.0 is outside the supported 0.12.1 to <0.17"),
    ("core-too-old", {"megatron-core": "0.11.0", "mindspeed": None}, "npu", "megatron-core 0.11.0 is outside"),
    ("no-core", {"megatron-core": None}, "npu", "megatron-core is not installed"),
    ("cpu-torch-on-cuda", {"torch": "2.8.0+cpu", "torch_npu": None, "cann": None, "mindspeed": None, "vllm": None,
                           "vllm-ascend": None, "vllm_requires_torch": None}, "cuda", "torch 2.8.0+cpu is a CPU build, but the platform is cuda"),
]


@pytest.mark.parametrize("change,platform,sentence", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_mismatch_is_one_sentence(change, platform, sentence):
    problems = check_versions({**NPU_OK, **change}, platform)
    assert len(problems) == 1, problems
    assert sentence in problems[0] and problems[0].endswith(".") and "\n" not in problems[0]


def test_several_mismatches_each_reported():
    problems = check_versions({**NPU_OK, "torch": "2.6.0", "cann": "8.0.0", "megatron-core": "0.20.0"}, "npu")  # + MindSpeed and the vllm pin
    assert len(problems) == 5, problems


def test_unknown_torch_npu_release_is_not_guessed():
    assert check_versions({**NPU_OK, "torch_npu": "2.7.1.post9", "cann": "7.0.0"}, "npu") == []


def test_cann_version_from_the_toolkit_file(tmp_path):
    (tmp_path / "version.cfg").write_text("# CANN\nversion=8.5.0\n")
    assert cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path)}) == "8.5.0"
    assert cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path / "none")}) in (None, cann_version({}))


def test_ray_gpt_stops_before_anything_and_can_skip(monkeypatch, capsys):
    monkeypatch.setattr(versions, "installed_versions", lambda: {**CPU_OK, "megatron-core": "0.9.0"})
    assert ray_gpt.main(["dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert "megatron-core 0.9.0 is outside" in err and "--skip-version-check" in err and "Traceback" not in err
    assert ray_gpt.main(["dry_run=true", "--skip-version-check"]) == 0
    assert ray_gpt.main(["dry_run=true", "training.skip_version_check=true"]) == 0
