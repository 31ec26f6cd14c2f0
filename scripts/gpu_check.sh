#!/usr/bin/env bash
# GPU checks of the CUDA backend, run on the device machine from the repository root.
#
#   scripts/gpu_check.sh OUTDIR [BIN_DIR]
#
# BIN_DIR (default gpu-bin/) holds the stripped `cuda_score` example binary, built with
#   cargo build --release -p tandem-cuda --example cuda_score
#   mkdir -p gpu-bin && strip -o gpu-bin/cuda_score target/release/examples/cuda_score
# Generates random-weight models into /tmp/tandem-gpu-models (scripts/make_gpu_models.py),
# scores their reference sequences with tandem in f32 and bf16, runs the decode/prefix/
# copy_blocks/cached_logits checks and timing, and compares with torch
# (scripts/gpu_compare.py). Writes OUTDIR/log.txt, OUTDIR/*.json and OUTDIR/summary.txt.
# A failing model does not stop the others. Set MODELS="a b" to run a subset. A result
# already in OUTDIR is kept, not computed again (a second call resumes a cut one), and with
# TANDEM_DEADLINE (seconds since the epoch, set by gpu_speed_check.sh) each run gets at most
# the time left and none starts with under 30 s left.
set -euo pipefail
export PYTHONUNBUFFERED=1

OUT=${1:?usage: gpu_check.sh OUTDIR [BIN_DIR]}
BIN=${2:-gpu-bin}/cuda_score
MODELS_DIR=/tmp/tandem-gpu-models
MODELS=${MODELS:-"qwen2-small smollm2-135m qwen3-0.6b llama3.2-1b gemma3-small qwen3moe-small"}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1

echo "== $(date -u) gpu_check on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true

# cuBLAS and NVRTC come from the pip wheels torch installed (nvidia/*/lib folders).
source "$(dirname "$0")/gpu_env.sh"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
export TANDEM_KERNEL_CACHE=/tmp/tandem-kernels
export RUST_BACKTRACE=1

if [ ! -x "$BIN" ]; then
    echo "missing binary $BIN"; exit 1
fi

# Generate models (skipped when already present from an earlier run).
for m in $MODELS; do
    if [ -f "$MODELS_DIR/ref_$m.json" ]; then continue; fi
    echo "== generating $m"
    python3 scripts/make_gpu_models.py "$MODELS_DIR" "$m" || echo "!! generating $m failed"
done

# run WHAT OUT_JSON ARGS...: `cuda_score WHAT ARGS... OUT_JSON` unless OUT_JSON exists.
run() {
    local what=$1 out=$2 secs=600; shift 2
    [ -s "$out" ] && { echo "== kept $out"; return 0; }
    if [ -n "${TANDEM_DEADLINE:-}" ]; then
        secs=$(( TANDEM_DEADLINE - $(date +%s) ))
        [ "$secs" -gt 600 ] && secs=600
        if [ "$secs" -lt 30 ]; then echo "!! $what $out skipped: ${secs}s left"; return 0; fi
    fi
    timeout "$secs" "$BIN" "$what" "$@" "$out" || echo "!! $what $out failed ($?)"
}

for m in $MODELS; do
    ref="$MODELS_DIR/ref_$m.json"
    [ -f "$ref" ] || { echo "!! no reference for $m"; continue; }
    for dtype in bf16 f32; do
        dir="$MODELS_DIR/$m-$dtype"
        echo "== $m $dtype: score"
        run score "$OUT/cuda_${m}_${dtype}.json" "$dir" "$dtype" "$ref"
        echo "== $m $dtype: checks"
        run check "$OUT/check_${m}_${dtype}.json" "$dir" "$dtype" "$ref"
    done
done

echo "== comparison"
# shellcheck disable=SC2086
python3 scripts/gpu_compare.py "$OUT" "$MODELS_DIR" $MODELS || echo "!! compare failed"
echo "== done $(date -u)"
