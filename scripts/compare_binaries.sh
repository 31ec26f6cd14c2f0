#!/usr/bin/env bash
# Byte-identical outputs of two `tandem` binaries (a refactor must change no result):
#
#   scripts/compare_binaries.sh OLD_BIN NEW_BIN
#
# For the default model and the HF fixture, on both kernel families (the int8 default and
# the exact `--kernels avx2`): `score --json`, greedy and seeded `generate --json` over a
# JSONL batch (with n > 1, stop strings, penalties), and the server's `echo` + `logprobs`
# completion. Prints one line per comparison and exits non-zero on any difference. Needs
# python3 and curl; servers listen on 127.0.0.1 and are stopped by PID.
set -euo pipefail
OLD=${1:?usage: compare_binaries.sh OLD_BIN NEW_BIN}
NEW=${2:?usage: compare_binaries.sh OLD_BIN NEW_BIN}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FIXTURE="$ROOT/crates/model/tests/fixtures/hf/llama_untied"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0

cat > "$WORK/prompts.jsonl" <<'EOF'
{"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0}
{"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.8, "seed": 7, "n": 3}
{"prompt": "List three colors:", "max_tokens": 40, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n\n"]}
{"prompt": "1, 2, 3, 4,", "max_tokens": 20, "temperature": 0, "frequency_penalty": 0.5}
EOF

same() { # NAME FILE_OLD FILE_NEW
    if [ ! -s "$2" ] || [ ! -s "$3" ]; then echo "EMPTY OUTPUT: $1"; fail=1; return; fi
    if cmp -s "$2" "$3"; then echo "identical: $1"; else echo "DIFFERENT: $1"; fail=1; fi
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo_logprobs() { # BIN OUT MODEL_ARGS...
    local bin=$1 out=$2; shift 2
    local port; port=$(free_port)
    "$bin" serve "$@" --port "$port" > "$WORK/serve.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 300); do
        curl -sf "127.0.0.1:$port/health" > /dev/null 2>&1 && break
        sleep 0.2
    done
    curl -sf "127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 8,
             "temperature": 0, "echo": true, "logprobs": 3}' \
        | python3 -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps(r["choices"], sort_keys=True))' > "$out"
    kill -TERM "$pid"; wait "$pid" || true
}

for model in default fixture; do
    margs=(); [ "$model" = fixture ] && margs=(--model "$FIXTURE")
    for kernels in int8 exact; do
        kargs=(); [ "$kernels" = exact ] && kargs=(--kernels avx2)
        tag="$model/$kernels"
        for which in old new; do
            bin=$OLD; [ "$which" = new ] && bin=$NEW
            "$bin" score "${margs[@]}" "${kargs[@]}" --json \
                --text "The capital of France is Paris. It lies on the Seine." \
                > "$WORK/score.$which" 2> /dev/null
            "$bin" generate "${margs[@]}" "${kargs[@]}" --json --input "$WORK/prompts.jsonl" \
                > "$WORK/generate.$which" 2> /dev/null
            echo_logprobs "$bin" "$WORK/echo.$which" "${margs[@]}" "${kargs[@]}"
        done
        same "score $tag" "$WORK/score.old" "$WORK/score.new"
        same "generate $tag" "$WORK/generate.old" "$WORK/generate.new"
        same "server echo logprobs $tag" "$WORK/echo.old" "$WORK/echo.new"
    done
done
exit $fail
