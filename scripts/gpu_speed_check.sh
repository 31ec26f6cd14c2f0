#!/usr/bin/env bash
# GPU speed checks of the CUDA backend (CUDA graphs, split-context attention), run on the
# device machine from the repository root, after the correctness checks:
#
#   scripts/gpu_speed_check.sh OUTDIR NEW_BIN_DIR [OLD_BIN_DIR]
#
# 1. scripts/gpu_check.sh with the new binaries (fidelity against torch, decode = forward,
#    prefix/copy_blocks/cached_logits, batch invariance, decode with and without graphs).
# 2. `tandem bench --device cuda` at batch 1, 32 and 256 (512-token prompts, 128 steps)
#    with the new binary, with graphs off, and with OLD_BIN_DIR's binary when given.
# 3. transformers `generate` with a static cache at the same batch sizes.
# SKIP_HF=1 skips step 3. Writes OUTDIR/speed.txt (JSON lines) besides gpu_check.sh's files.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${1:?usage: gpu_speed_check.sh OUTDIR NEW_BIN_DIR [OLD_BIN_DIR]}
NEW=${2:?new binaries}
OLD=${3:-}
MODELS=${MODELS:-"smollm2-135m llama3.2-1b qwen2-small qwen3-0.6b"}
mkdir -p "$OUT"
MODELS="$MODELS" scripts/gpu_check.sh "$OUT" "$NEW" || echo "!! gpu_check failed"

NV_LIBS=$(python3 - <<'PY'
import glob, os, site
dirs = set()
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for lib in glob.glob(os.path.join(sp, "nvidia", "**", "lib*.so*"), recursive=True):
        dirs.add(os.path.dirname(lib))
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH="${NV_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
M=/tmp/tandem-gpu-models
SPEED="$OUT/speed.txt"
: > "$SPEED"
CACHE=$(mktemp -d)
bench() { # label binary model extra-args...
  local label=$1 bin=$2 model=$3; shift 3
  echo "== bench $label $model" | tee -a "$OUT/log.txt"
  timeout 150 "$bin" bench --cache-dir "$CACHE" --model "$M/$model-bf16" --device cuda \
    --batch 1 --batch 32 --batch 256 --prompt-len 512 --gen-len 128 "$@" 2>>"$OUT/log.txt" \
    | sed "s/^{/{\"label\":\"$label\",\"model\":\"$model\",/" | tee -a "$SPEED"
}
for m in llama3.2-1b smollm2-135m; do
  bench new "$NEW/tandem" "$m"
  bench new-no-graphs "$NEW/tandem" "$m" --no-cuda-graphs
  [ -n "$OLD" ] && bench old "$OLD/tandem" "$m"
done
if [ -z "${SKIP_HF:-}" ]; then
  echo "== transformers static cache" | tee -a "$OUT/log.txt"
  timeout 200 python3 scripts/gpu_hf_baseline.py "$M/llama3.2-1b-bf16" 1,32,256 static \
    2>>"$OUT/log.txt" | tee -a "$SPEED"
fi
rm -rf "$CACHE"
echo "== done $(date -u)" | tee -a "$OUT/log.txt"
