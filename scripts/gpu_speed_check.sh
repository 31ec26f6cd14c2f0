#!/usr/bin/env bash
# GPU speed checks of the CUDA backend, run on the device machine from the repository root:
#
#   STAGE=goals scripts/gpu_speed_check.sh OUTDIR NEW_BIN_DIR [OLD_BIN_DIR]   # first call
#   STAGE=rest  scripts/gpu_speed_check.sh OUTDIR NEW_BIN_DIR [OLD_BIN_DIR]   # second call
#
# BIN_DIRs hold stripped `tandem` and `cuda_score` binaries, built here with
#   cargo build --release -p tandem-cli
#   cargo build --release -p tandem-cuda --example cuda_score
# (two commands: with --example, cargo builds only the example) and `strip -o`.
#
# A device session has little time, so the steps run in the order of what the CUDA speed
# issue's goals table needs, and BUDGET_S (default 540) bounds a call: each step gets at most
# the time left, and a step that needs more than is left is skipped and named in
# OUTDIR/skipped.txt. STAGE=all (the default) runs both stages in one call.
#
# Stage goals (OUTDIR/goals.md: the goals table, by scripts/gpu_goals.py, before step 6):
#  0. the device's bf16 product rate and copy rate, with torch (scripts/gpu_peak.py);
#  1. random-weight models at the Llama-3.2-1B and SmolLM2-135M shapes
#     (scripts/make_gpu_models.py; kept when already there);
#  2. `tandem bench --device cuda`, 1B shape, batch 1, 32, 64 and 256, 512-token prompts and
#     128 steps (single-stream and batched decode; the B=64 step time the server's ITL is
#     held to), and the 135M shape at batch 1 (the launch-bound goal);
#  3. `cuda_score profile` of the 1B shape: device time per operation of a prefill of
#     8 x 2,048 tokens and of decode steps at batch 1, 16, 64 and 256, and the rates of that
#     prefill and of scoring all its positions on the device; each with the attention on
#     CUDA cores, then on tensor cores (`--tensor-core-attention`);
#  4. `tandem serve --device cuda` on the 1B shape under bench/serve_load.py: 64 concurrent
#     streams, ~512-token prompts, 256 tokens out (TTFT, ITL, output tok/s);
#  5. transformers `generate` with a static cache, 128 tokens after 512, batch 256 and 1
#     (scripts/gpu_hf_baseline.py; SKIP_HF=1 skips);
#  6. scripts/gpu_check.sh on both shapes (fidelity against torch, decode = forward,
#     prefix/copy_blocks/cached_logits, batch invariance, sampling on the device against the
#     host, overlapped steps, decode rates with and without graphs, greedy and top-p).
# Stage rest: what step 6 did not finish, and gpu_check.sh on a Gemma 3 shape (sliding
#  windows, GeGLU, Gemma's norms) and a Qwen3-MoE shape (experts), and their bench at batch
#  1 and 64; OLD_BIN_DIR's bench beside the new one, and both with `--tensor-core-attention`;
#  `--cuda-weights q8_0`, `--cuda-weights q4_1` and `--batch-invariant` (speed at batch 1
#  and 32, and the perplexity of one text in each mode: OUTDIR/quant_fidelity.txt); the whole
#  engine loop (`--engine`) on both shapes with and without overlapped steps
#  (`--no-overlap`), and with a grammar per request (rows sampled on the host);
#  `tandem plan --calibrate --device cuda`, then `plan --validate --quick`
#  with that profile (OUTDIR/plan_*.txt); Nsight Compute on the decode attention kernels
#  (OUTDIR/ncu_attention.txt) when `ncu` is there.
# Writes OUTDIR/speed.txt (JSON lines), OUTDIR/peak.json, OUTDIR/profile.txt,
# OUTDIR/serve.txt and OUTDIR/goals.md besides gpu_check.sh's files.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${1:?usage: gpu_speed_check.sh OUTDIR NEW_BIN_DIR [OLD_BIN_DIR]}
NEW=${2:?new binaries}
OLD=${3:-}
STAGE=${STAGE:-all}
mkdir -p "$OUT"
START=$(date +%s)
export TANDEM_DEADLINE=$(( START + ${BUDGET_S:-540} )) # gpu_check.sh keeps to it too

# allot NAME MIN MAX: the seconds step NAME may take (MAX, or what is left), or status 1 and
# a line in skipped.txt when fewer than MIN are left.
allot() {
  local left=$(( TANDEM_DEADLINE - $(date +%s) - 5 ))
  if [ "$left" -lt "$2" ]; then
    echo "$STAGE: $1 skipped, ${left}s left (needs $2)" | tee -a "$OUT/skipped.txt" >&2
    return 1
  fi
  echo $(( left < $3 ? left : $3 ))
}

source "$(dirname "$0")/gpu_env.sh"
export TANDEM_KERNEL_CACHE=/tmp/tandem-kernels
M=/tmp/tandem-gpu-models
P="$M/llama3.2-1b"
SMALL="$M/smollm2-135m"
SPEED="$OUT/speed.txt"
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT

bench() { # label bin_dir min_seconds max_seconds [flags...]
  local label=$1 bin=$2 secs; secs=$(allot "bench $label" "$3" "$4") || return 0; shift 4
  timeout "$secs" "$bin/tandem" bench --cache-dir "$CACHE" --model "${BENCH_MODEL:-$P-bf16}" \
    --device cuda --prompt-len 512 --gen-len 128 "$@" 2>>"$OUT/bench.log" \
    | sed "s/^{/{\"label\":\"$label\",/" | tee -a "$SPEED"
}

models() {
  local secs
  for m in llama3.2-1b smollm2-135m; do
    [ -f "$M/ref_$m.json" ] && continue
    secs=$(allot "models $m" 30 240) || return 0
    timeout "$secs" python3 scripts/make_gpu_models.py "$M" "$m" >> "$OUT/models.log" 2>&1 \
      || echo "!! generating $m failed" | tee -a "$OUT/skipped.txt"
  done
}

profile() {
  local secs; secs=$(allot profile 30 120) || return 0
  timeout "$secs" "$NEW/cuda_score" profile "$P-bf16" bf16 "$M/ref_llama3.2-1b.json" \
    "$OUT/profile_llama3.2-1b.json" 2>>"$OUT/profile.log" || return 0
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
}

# The server goal: 64 concurrent streams of ~512-token prompts (the models' tokenizer has one
# token per byte: 93 words are ~512 bytes) and 256 tokens out, greedy, EOS ignored.
serve() {
  local secs; secs=$(allot serve 60 150) || return 0
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$NEW/tandem" serve --cache-dir "$CACHE" --model "$P-bf16" --device cuda --port "$port" \
    > "$OUT/serve.log" 2>&1 &
  local pid=$!
  timeout "$((secs - 10))" python3 bench/serve_load.py --url "http://127.0.0.1:$port" \
    --model auto --wait-ready 60 --concurrency 64 --prompt-words 93 --max-tokens 256 \
    --requests-per-slot 2 --time-limit 60 2>>"$OUT/serve.log" | tee "$OUT/serve.txt"
  kill -TERM "$pid" 2>/dev/null
  ( sleep 20; kill -KILL "$pid" 2>/dev/null ) &
  local guard=$!
  wait "$pid"
  echo "server exit status $? (0: it drained and stopped on SIGTERM)" >> "$OUT/serve.log"
  kill "$guard" 2>/dev/null
}

peak() {
  local secs; secs=$(allot "device peak rates" 20 60) || return 0
  timeout "$secs" python3 scripts/gpu_peak.py 2>>"$OUT/peak.log" | tee "$OUT/peak.json"
}

hf() {
  [ -n "${SKIP_HF:-}" ] && return 0
  local secs; secs=$(allot "transformers baseline" 60 200) || return 0
  timeout "$secs" python3 scripts/gpu_hf_baseline.py "$P-bf16" 256,1 static 128 \
    2>>"$OUT/hf.log" | tee -a "$SPEED"
}

check() { # models...
  allot gpu_check 40 600 > /dev/null || return 0
  MODELS="$*" scripts/gpu_check.sh "$OUT" "$NEW" > /dev/null 2>&1 \
    || echo "!! gpu_check failed" | tee -a "$OUT/skipped.txt"
  cat "$OUT/summary.txt"
}

# Nsight Compute on the decode attention (the kernel the first device runs found bound by
# latency): speed of light, occupancy and launch statistics of a few launches of a batch-64
# decode step after 512 tokens, eager so that each kernel is its own launch.
ncu_attention() {
  command -v ncu > /dev/null || { echo "$STAGE: ncu skipped, not installed" >> "$OUT/skipped.txt"; return 0; }
  local secs; secs=$(allot ncu 60 120) || return 0
  timeout "$secs" ncu -k regex:'paged_attention|attention_merge' --launch-skip 200 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    "$NEW/tandem" bench --cache-dir "$CACHE" --model "$P-bf16" --device cuda --no-cuda-graphs \
    --batch 64 --prompt-len 512 --gen-len 16 > "$OUT/ncu_attention.txt" 2>&1 \
    || echo "!! ncu failed ($?), see ncu_attention.txt" | tee -a "$OUT/skipped.txt"
}

plan() { # label args...
  local label=$1 secs; secs=$(allot "plan $label" 40 120) || return 0; shift
  timeout "$secs" "$NEW/tandem" plan --cache-dir "$CACHE" --model "$P-bf16" --device cuda "$@" \
    > "$OUT/plan_$label.txt" 2> "$OUT/plan_$label.log" || echo "!! plan $label failed ($?)"
}

fidelity() { # the perplexity of one text in each weight mode
  local text="The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step."
  for flags in "" "--cuda-weights q8_0" "--cuda-weights q4_1" "--batch-invariant"; do
    local secs; secs=$(allot "score [$flags]" 15 60) || return 0
    # shellcheck disable=SC2086
    timeout "$secs" "$NEW/tandem" score --cache-dir "$CACHE" --model "$P-bf16" --device cuda \
      $flags --text "$text" --json 2>/dev/null \
      | python3 -c "import json,sys; r=json.load(sys.stdin); print('score [$flags]: perplexity', r['perplexity'])" \
      | tee -a "$OUT/quant_fidelity.txt"
  done
}

echo "== $(date -u) gpu_speed_check stage $STAGE, budget ${BUDGET_S:-540}s" | tee -a "$OUT/skipped.txt"
if [ "$STAGE" = goals ] || [ "$STAGE" = all ]; then
  models
  peak
  bench new "$NEW" 40 180 --batch 1 --batch 32 --batch 64 --batch 256
  BENCH_MODEL="$SMALL-bf16" bench new-135m "$NEW" 20 60 --batch 1
  profile
  serve
  hf
  python3 scripts/gpu_goals.py "$OUT" | tee "$OUT/goals.md"
  check llama3.2-1b smollm2-135m
fi
if [ "$STAGE" = rest ] || [ "$STAGE" = all ]; then
  models
  check llama3.2-1b smollm2-135m gemma3-small qwen3moe-small
  # First speed figures of the newly served architectures (their models come from the check).
  for shape in gemma3-small qwen3moe-small; do
    [ -d "$M/$shape-bf16" ] && BENCH_MODEL="$M/$shape-bf16" bench "$shape" "$NEW" 30 90 \
      --batch 1 --batch 64
  done
  # Gemma 3's heads of 256 on tensor cores (attention_tc_256, two warps a row group).
  [ -d "$M/gemma3-small-bf16" ] && BENCH_MODEL="$M/gemma3-small-bf16" \
    bench gemma3-small-tensor-core-attention "$NEW" 30 90 --batch 1 --batch 64 \
    --tensor-core-attention
  [ -n "$OLD" ] && bench old "$OLD" 40 150 --batch 1 --batch 32 --batch 256
  # The prompts' attention on tensor cores, new kernel beside the old binary's.
  bench new-tensor-core-attention "$NEW" 30 90 --batch 1 --batch 32 --tensor-core-attention
  [ -n "$OLD" ] && bench old-tensor-core-attention "$OLD" 30 90 --batch 1 --batch 32 \
    --tensor-core-attention
  # The engine loop planning step n+1 while step n runs, against the synchronous loop; the
  # 135M shape is where host time shows most.
  for shape in "$SMALL-bf16" "$P-bf16"; do
    name=$(basename "$shape")
    BENCH_MODEL=$shape bench "engine-$name" "$NEW" 30 90 --batch 1 --batch 64 --engine
    BENCH_MODEL=$shape bench "engine-no-overlap-$name" "$NEW" 30 90 --batch 1 --batch 64 \
      --engine --no-overlap
  done
  # Rows the runner leaves to the host (a grammar each), sampled side by side on the CUDA
  # runner's host pool, beside the old binary's engine thread alone.
  BENCH_MODEL="$SMALL-bf16" bench engine-regex "$NEW" 20 60 --batch 64 --engine \
    --regex '[a-z ]{1,300}'
  [ -n "$OLD" ] && BENCH_MODEL="$SMALL-bf16" bench old-engine-regex "$OLD" 20 60 --batch 64 \
    --engine --regex '[a-z ]{1,300}'
  bench new-q8_0 "$NEW" 30 90 --batch 1 --batch 32 --cuda-weights q8_0
  bench new-q4_1 "$NEW" 30 90 --batch 1 --batch 32 --cuda-weights q4_1
  bench new-batch-invariant "$NEW" 30 90 --batch 1 --batch 32 --batch-invariant
  fidelity
  plan calibrate --calibrate --save "$OUT/plan_calibration.json"
  [ -s "$OUT/plan_calibration.json" ] \
    && plan validate --hardware "$OUT/plan_calibration.json" --validate --quick
  cat "$OUT"/plan_*.txt 2>/dev/null
  ncu_attention
fi
echo "== $(date -u) done, $(( $(date +%s) - START ))s" | tee -a "$OUT/skipped.txt"
