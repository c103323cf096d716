#!/usr/bin/env bash
# CI stage: the unit and distributed tests on the newest megatron-core 0.16.x (verl's 2026 Ascend
# stack pairs MindSpeed core_r0.16), with the same torch as the main stage. Own venv (.venv-mc016),
# installs what it needs itself; non-zero on failure; pytest's "no tests collected" is a failure.
# `megatron016.sh build` only builds the venv (.ci/run does that while the main stage's tests run),
# `megatron016.sh test` only tests a venv built that way, no argument does both.
set -uo pipefail
phase=${1:-all}
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export RAY_ADDRESS=local  # never join a cluster that happens to run on this machine
start=$(date +%s)
VENV=.venv-mc016
if [ "$phase" != test ]; then
  rm -rf "$VENV"
  # constraints.txt pins megatron-core 0.12.1 for the main stage: keep every other pin, swap that one
  grep -v '^megatron-core' constraints.txt > "$VENV.constraints" && echo 'megatron-core>=0.16,<0.17' >> "$VENV.constraints"
  python3 -m venv "$VENV" \
    && "$VENV/bin/pip" install -qq -c "$VENV.constraints" -e ".[test]" \
    || { echo "megatron016: install failed" >&2; rm -f "$VENV.constraints"; exit 1; }
  rm -f "$VENV.constraints"
  touch "$VENV/.ci-built"
  echo "megatron016: $VENV built in $(( $(date +%s) - start )) s"
  [ "$phase" = build ] && exit 0
fi
[ -f "$VENV/.ci-built" ] || { echo "megatron016: $VENV was not built; run .ci/megatron016.sh build first" >&2; exit 1; }
echo "megatron016: $("$VENV/bin/python" -c 'import megatron.core, torch; print("megatron-core", megatron.core.__version__, "torch", torch.__version__)')"
# not the tests that never import megatron: the pure algorithm / reward code, config validation's dry
# runs and MindSpeed-LLM spellings, the Ray worker plumbing and the start-up import checks; and, for CI's time
# (2026-11-30: ~170 s of this stage), not the scripts' tests (tests/unit/scripts: the benchmarks' and GPU smoke
# script's rows; their megatron is the builder, forward and train step that tests/unit/models and tests/dist/models
# run here) nor the roles' Ray workers (tests/dist/workers: their weight sync over the same parallel groups and
# gathered tensors as tests/dist/models' checks; the main stage runs both folders)
"$VENV/bin/python" -m pytest -m "not e2e" tests/unit tests/dist -q -p no:cacheprovider --core-archs \
  --ignore=tests/unit/algorithms --ignore=tests/unit/rewards \
  --ignore=tests/unit/config/test_broken_configs.py --ignore=tests/unit/config/test_arch_from_checkpoint.py \
  --ignore=tests/unit/config/test_mindspeed_spellings.py \
  --ignore=tests/dist/distributed/test_ray_connect.py --ignore=tests/dist/distributed/test_ray_worker_group.py \
  --ignore=tests/dist/distributed/test_ray_worker_failures.py --ignore=tests/unit/scripts \
  --ignore=tests/dist/workers --ignore=tests/unit/utils/test_startup_imports.py
rc=$?
echo "megatron016: pytest exit $rc after $(( $(date +%s) - start )) s"
if [ "$rc" -eq 5 ]; then
  echo "megatron016: pytest collected no tests; that is a failure here." >&2
  exit 1
fi
exit "$rc"
