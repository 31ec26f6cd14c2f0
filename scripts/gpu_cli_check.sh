#!/usr/bin/env bash
# The `tandem` binary on a CUDA device, end to end, run on the device machine after
# scripts/gpu_check.sh made its models (in /tmp/tandem-gpu-models):
#
#   scripts/gpu_cli_check.sh OUTDIR [BIN_DIR]
#
# BIN_DIR (default gpu-bin/) holds the stripped `tandem` binary. Checks, per the CUDA
# backend's proof list: score/generate/bench through the CLI on CUDA; greedy generation with
# and without n-gram speculation identical; tandem-cuda vs tandem-cpu vs transformers
# `generate` speed; a server under an abort storm returns every KV block and does not grow
# device memory. Writes OUTDIR/cli_log.txt and OUTDIR/cli_summary.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${1:?usage: gpu_cli_check.sh OUTDIR [BIN_DIR]}
T=${2:-gpu-bin}/tandem
M=/tmp/tandem-gpu-models
LOG="$OUT/cli_log.txt"
SUM="$OUT/cli_summary.txt"
: > "$LOG"; : > "$SUM"
exec > >(tee -a "$LOG") 2>&1
say() { echo "$*" | tee -a "$SUM"; }
CACHE=$(mktemp -d)
COMMON=(--cache-dir "$CACHE")

say "== score through the CLI (smollm2-135m, f32 and bf16)"
IDS=$(python3 -c "import json;print(','.join(map(str,json.load(open('$M/ref_smollm2-135m.json'))['sequences'][0]['tokens'][:128])))" 2>/dev/null \
  || python3 -c "print(','.join(str((i*37+11)%49000) for i in range(128)))")
for dt in f32 bf16; do
  "$T" score "${COMMON[@]}" --model "$M/smollm2-135m-$dt" --device cuda --dtype "$dt" \
    --tokens "$IDS" --json > "$OUT/cli_score_$dt.json" && \
    say "score $dt: $(python3 -c "import json;r=json.load(open('$OUT/cli_score_$dt.json'));print(r['num_tokens'],'tokens, sum_logprob',r['sum_logprob'])")"
done
"$T" score "${COMMON[@]}" --model "$M/smollm2-135m-f32" --device cpu --kernels avx2 \
  --tokens "$IDS" --json > "$OUT/cli_score_cpu.json" 2>/dev/null || \
"$T" score "${COMMON[@]}" --model "$M/smollm2-135m-f32" --device cpu --tokens "$IDS" --json > "$OUT/cli_score_cpu.json"
python3 - "$OUT" <<'PY' | tee -a "$SUM"
import json, sys
o = sys.argv[1]
cpu = json.load(open(f"{o}/cli_score_cpu.json"))["token_logprobs"][1:]
for dt in ("f32", "bf16"):
    g = json.load(open(f"{o}/cli_score_{dt}.json"))["token_logprobs"][1:]
    d = [abs(a - b) for a, b in zip(g, cpu)]
    print(f"cuda {dt} vs cpu exact: mean {sum(d)/len(d):.2e} max {max(d):.2e}")
PY

say "== greedy generate, with and without n-gram speculation (llama3.2-1b bf16)"
for spec in none ngram; do
  extra=(); [ "$spec" = ngram ] && extra=(--speculative ngram)
  "$T" generate "${COMMON[@]}" --model "$M/llama3.2-1b-bf16" --device cuda \
    --prompt "the cat sat on the mat and the cat sat on the mat and the cat" \
    --temperature 0 --max-tokens 64 --ignore-eos --json "${extra[@]}" > "$OUT/cli_gen_$spec.json"
done
python3 - "$OUT" <<'PY' | tee -a "$SUM"
import json, sys
o = sys.argv[1]
a = json.loads(open(f"{o}/cli_gen_none.json").readline())["token_ids"]
b = json.loads(open(f"{o}/cli_gen_ngram.json").readline())["token_ids"]
print(f"plain {len(a)} tokens, speculative {len(b)} tokens, identical: {a == b}")
PY

say "== bench (prefill and decode, bf16 on the GPU; the CPU for scale)"
for m in smollm2-135m llama3.2-1b; do
  "$T" bench "${COMMON[@]}" --model "$M/$m-bf16" --device cuda --batch 1 --batch 32 \
    --prompt-len 512 --gen-len 64 --json 2>/dev/null | tee -a "$SUM"
done
"$T" bench "${COMMON[@]}" --model "$M/smollm2-135m-f32" --device cpu --threads 16 \
  --batch 1 --batch 32 --prompt-len 512 --gen-len 32 --json 2>/dev/null | tee -a "$SUM"
timeout 240 python3 scripts/gpu_hf_baseline.py "$M/llama3.2-1b-bf16" 2>&1 | tee -a "$SUM"

say "== server abort storm on CUDA (smollm2-135m bf16)"
PORT=18321
"$T" serve "${COMMON[@]}" --model "$M/smollm2-135m-bf16" --device cuda --port $PORT \
  --gpu-memory-utilization 0.2 > "$OUT/cli_serve.txt" 2>&1 &
SERVER=$!
timeout 200 python3 scripts/gpu_abort_storm.py $PORT 1000 2>&1 | tee -a "$SUM"
kill -TERM $SERVER; wait $SERVER
say "server exit status $?"
rm -rf "$CACHE"
