#!/usr/bin/env bash
# The GPU checks of one device lease (15 minutes, one GPU, 30 s warm between calls), in two calls:
# what the 2026-11-27 session learned, written down so the next one spends its minutes on checks.
#
# Here, once (network; this repository's venv):
#     python scripts/gpu_bundle.py                  # .gpu_bundle/part1 (half of Ray), part2 (the rest)
#     bash scripts/gpu_session.sh prepare [DIR]     # .gpu_extra/: TRL's wheel, DIR's config + tokenizer
#                                                   # (DIR: default the SmolLM2 fixture of scripts/make_smollm2.py)
# On the GPU machine, from the repository root:
#     call 1, carrying .gpu_bundle/part2 and .gpu_extra:    bash scripts/gpu_session.sh stage1
#     call 2, at once (carrying .gpu_bundle/part1):         bash scripts/gpu_session.sh stage2
# Each stage writes at most 5 files under $OUT (the device tool brings back 8): its log, the JSON of
# scripts/gpu_smoke.py and bench/grpo_step.py, the ray_gpt logs as one tar.
#
# Time limits (seconds, env): SMOKE_S (dense smoke, 300: a cold inductor cache makes the compiled
# checks slow), MOE_S (150), RAY_S (260: ~100 s a ray_gpt run there), BENCH_S (200).
# RAY_VARIANTS (default bf16,compiled: fp32 and moe ran on 2026-11-27).
set -u -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
stage=${1:-}
out=${OUT:-$here/outputs/gpu_session}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

usage() {
    echo "usage: bash scripts/gpu_session.sh prepare [HF_DIR] | stage1 | stage2 (see the top of this file)" >&2
    exit 2
}

install_part() {  # $1: part number
    local part=.gpu_bundle/part$1
    [ -f "$part/install.sh" ] || { echo "gpu_session: $part/install.sh is missing: carry $part with this call." >&2; exit 3; }
    bash "$part/install.sh" >> "$out/install.log" 2>&1 || { tail -5 "$out/install.log"; exit 3; }
    export PYTHONPATH=$here/.gpu_bundle/pylib:$here
}

case "$stage" in
prepare)
    src=${2:-$HOME/.cache/mindspeed_rl/smollm2-135m-instruct}
    [ -f "$src/config.json" ] || { echo "gpu_session: no config.json in $src; make it with scripts/make_smollm2.py or pass an HF directory." >&2; exit 2; }
    mkdir -p .gpu_extra/model_cfg
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu_extra trl==1.16.0 || exit 3
    for f in "$src"/config.json "$src"/generation_config.json "$src"/tokenizer* "$src"/*.jinja; do
        [ -f "$f" ] && cp "$f" .gpu_extra/model_cfg/
    done
    du -sh .gpu_extra
    ;;
stage1)
    install_part 2
    python3 -m pip install -q --no-index --no-deps --target .gpu_bundle/pylib .gpu_extra/trl-*.whl >> "$out/install.log" 2>&1
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    } | tee "$out/stage1.log"
    # the bench's model for stage 2: random weights of the carried config, its tokenizer (CPU, beside the smoke)
    python3 scripts/random_hf.py .gpu_extra/model_cfg .gpu_bundle/model > "$out/random_hf.log" 2>&1 &
    run_smoke() {  # $1 seconds, $2 json name, rest: gpu_smoke arguments
        local s=$1 name=$2 t0
        shift 2
        t0=$(date +%s)
        timeout "$s" python3 scripts/gpu_smoke.py --skip-ray --json "$out/$name" "$@" 2>&1 \
            | grep -E "^[a-z_]+ +(PASS|FAIL)|gpu_smoke|Error" | tee -a "$out/stage1.log"
        echo "($name: $(( $(date +%s) - t0 )) s)" | tee -a "$out/stage1.log"
    }
    run_smoke "${SMOKE_S:-300}" smoke_dense.json
    run_smoke "${MOE_S:-150}" smoke_moe.json --shape qwen3-moe-small --only build,parity,greedy,update,decode,speed
    run_smoke "${MLA_S:-60}" smoke_mla.json --shape deepseek-v3-small --only build,parity,greedy,update
    run_smoke "${OSS_S:-60}" smoke_gpt_oss.json --shape gpt-oss-small --only build,parity,greedy,update
    wait
    ;;
stage2)
    install_part 1
    export RAY_ADDRESS=local
    t0=$(date +%s)
    timeout "${RAY_S:-260}" python3 scripts/gpu_smoke.py --only ray_gpt --ray-variants "${RAY_VARIANTS:-bf16,compiled}" \
        --log-dir /tmp/gpu_session_ray --json "$out/smoke_ray.json" 2>&1 | grep -E "^[a-z_]+ +(PASS|FAIL)|gpu_smoke" \
        | tee "$out/stage2.log"
    echo "(ray_gpt: $(( $(date +%s) - t0 )) s)" | tee -a "$out/stage2.log"
    [ -d /tmp/gpu_session_ray ] && tar czf "$out/ray_logs.tgz" -C /tmp gpu_session_ray
    [ -f .gpu_bundle/model/config.json ] || { echo "gpu_session: .gpu_bundle/model is missing (stage1 makes it)." | tee -a "$out/stage2.log"; exit 3; }
    t0=$(date +%s)
    timeout "${BENCH_S:-200}" python3 bench/grpo_step.py --device cuda --trl-python python3 --model .gpu_bundle/model \
        --steps 5 --dtype bf16 --prompts-per-step 8 --max-new-tokens 64 --compile --json "$out/grpo_step.json" \
        > "$out/grpo_step.log" 2>&1
    echo "(grpo_step --compile: exit $?, $(( $(date +%s) - t0 )) s)" | tee -a "$out/stage2.log"
    tail -12 "$out/grpo_step.log"
    ;;
*)
    usage
    ;;
esac
