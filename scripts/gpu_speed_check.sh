#!/usr/bin/env bash
# GPU speed checks of the CUDA backend, run on the device machine from the repository root:
#
#   scripts/gpu_speed_check.sh OUTDIR NEW_BIN_DIR [OLD_BIN_DIR]
#
# BIN_DIRs hold stripped `tandem` and `cuda_score` binaries, built here with
#   cargo build --release -p tandem-cli
#   cargo build --release -p tandem-cuda --example cuda_score
# (two commands: with --example, cargo builds only the example) and `strip -o`.
# 1. scripts/gpu_check.sh with the new binaries (fidelity against torch, decode = forward,
#    prefix/copy_blocks/cached_logits, batch invariance, decode with and without graphs).
# 2. `cuda_score profile` of the Llama-3.2-1B shape: device time per operation of a prefill
#    of 8 x 2,048 tokens and of decode steps at batch 1, 16, 64 and 256; the rates of that
#    prefill and of scoring all its positions on the device.
# 3. `tandem bench --device cuda` at batch 1, 32 and 256 (512-token prompts, 128 steps) with
#    the new binary and, when given, OLD_BIN_DIR's.
# 4. `tandem plan --calibrate --device cuda` on the same model (a GPU profile fitted to its
#    steps, saved to OUTDIR/plan_calibration.json), then `tandem plan --validate --quick
#    --device cuda` with that profile: predicted vs measured (OUTDIR/plan_validate.txt).
# 5. transformers `generate` with a static cache at the same batch sizes (SKIP_HF=1 skips).
# Step 3 also benches `--cuda-weights q8_0`, `--cuda-weights q4_1` and `--batch-invariant`,
# and scores one text in each mode (OUTDIR/quant_fidelity.txt), and runs the whole engine
# loop (`--engine`) on both model shapes with and without overlapped steps (`--no-overlap`).
# Writes OUTDIR/speed.txt (JSON lines) and OUTDIR/profile.txt besides gpu_check.sh's files.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${1:?usage: gpu_speed_check.sh OUTDIR NEW_BIN_DIR [OLD_BIN_DIR]}
NEW=${2:?new binaries}
OLD=${3:-}
MODELS=${MODELS:-"smollm2-135m llama3.2-1b"}
mkdir -p "$OUT"
MODELS="$MODELS" scripts/gpu_check.sh "$OUT" "$NEW" > /dev/null 2>&1 || echo "!! gpu_check failed"
cat "$OUT/summary.txt"

source "$(dirname "$0")/gpu_env.sh"
export TANDEM_KERNEL_CACHE=/tmp/tandem-kernels
M=/tmp/tandem-gpu-models
P="$M/llama3.2-1b"
timeout 90 "$NEW/cuda_score" profile "$P-bf16" bf16 "$M/ref_llama3.2-1b.json" \
  "$OUT/profile_llama3.2-1b.json" 2>/dev/null
python3 - "$OUT" <<'PY' | tee "$OUT/profile.txt"
import json, sys
d = json.load(open(f"{sys.argv[1]}/profile_llama3.2-1b.json"))
for k, v in d.items():
    if k == "describe":
        continue
    ops = " ".join(f"{n}={ms:.3f}" for n, ms in v["ops_ms"].items())
    rates = "".join(f" {r}={v[r]:.0f}" for r in ("prefill_tok_s", "scoring_tok_s") if r in v)
    print(f"{k}: wall {v['wall_ms']:.3f} device {v['device_ms']:.3f} "
          f"graph_wall {v.get('graph_wall_ms', 0):.3f}{rates} | {ops}")
PY

SPEED="$OUT/speed.txt"
: > "$SPEED"
CACHE=$(mktemp -d)
bench() { # label bin_dir seconds [flags...]
  local label=$1 bin=$2 secs=$3; shift 3
  timeout "$secs" "$bin/tandem" bench --cache-dir "$CACHE" --model "${BENCH_MODEL:-$P-bf16}" --device cuda \
    --prompt-len 512 --gen-len 128 "$@" 2>/dev/null \
    | sed "s/^{/{\"label\":\"$label\",/" | tee -a "$SPEED"
}
ALL_BATCHES="--batch 1 --batch 32 --batch 256"
bench new "$NEW" 150 $ALL_BATCHES
[ -n "$OLD" ] && bench old "$OLD" 150 $ALL_BATCHES
# Q8_0 and Q4_1 layer weights, and the batch-invariant products, at batch 1 and 32: speed
# against the dense bf16 run above, and the perplexity of one text in each mode (fidelity).
bench new-q8_0 "$NEW" 90 --batch 1 --batch 32 --cuda-weights q8_0
bench new-q4_1 "$NEW" 90 --batch 1 --batch 32 --cuda-weights q4_1
bench new-batch-invariant "$NEW" 90 --batch 1 --batch 32 --batch-invariant
# Overlapped steps: the engine loop (scheduler, sampler, events) planning step n+1 while step
# n runs, against the synchronous loop; the 135M shape is where host time shows most.
for shape in "$P-bf16" "$M/smollm2-135m-bf16"; do
  name=$(basename "$shape")
  BENCH_MODEL=$shape bench "engine-$name" "$NEW" 120 --batch 1 --batch 64 --engine
  BENCH_MODEL=$shape bench "engine-no-overlap-$name" "$NEW" 120 --batch 1 --batch 64 \
    --engine --no-overlap
done
TEXT="The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step."
for flags in "" "--cuda-weights q8_0" "--cuda-weights q4_1" "--batch-invariant"; do
  timeout 60 "$NEW/tandem" score --cache-dir "$CACHE" --model "$P-bf16" --device cuda $flags \
    --text "$TEXT" --json 2>/dev/null \
    | python3 -c "import json,sys; r=json.load(sys.stdin); print('score [$flags]: perplexity', r['perplexity'])" \
    | tee -a "$OUT/quant_fidelity.txt"
done
plan() { # label args...
  local label=$1; shift
  timeout 120 "$NEW/tandem" plan --cache-dir "$CACHE" --model "$P-bf16" --device cuda "$@" \
    > "$OUT/plan_$label.txt" 2> "$OUT/plan_$label.log" || echo "!! plan $label failed ($?)"
}
plan calibrate --calibrate --save "$OUT/plan_calibration.json"
plan validate --hardware "$OUT/plan_calibration.json" --validate --quick
cat "$OUT/plan_calibrate.log" "$OUT/plan_validate.txt"
if [ -z "${SKIP_HF:-}" ]; then
  timeout 300 python3 scripts/gpu_hf_baseline.py "$P-bf16" 1,32,256 static 2>/dev/null \
    | tee -a "$SPEED"
fi
rm -rf "$CACHE"
