#!/usr/bin/env bash
# Makes two K-quant variants of the default model with llama.cpp's llama-quantize (built by
# build_llama_cpp.sh), for benchmarks and fidelity checks of the Q4_K / Q6_K paths. Most of
# SmolLM2-135M's matrices have 576 columns, not a multiple of 256, so K-quants only fit
# ffn_down (1,536 columns):
#   smol-q4k.gguf  Q4_1, with ffn_down in Q4_K
#   smol-q6k.gguf  Q6_K where it fits (ffn_down), llama.cpp's Q8_0 fallback elsewhere
# Usage: bench/make_kquant_models.sh [OUT_DIR]   (prints the two paths)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/.kquant}"
model="${TANDEM_CACHE_DIR:-$HOME/.cache/tandem}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "the default model is missing: run any tandem command once" >&2; exit 1; }
bin="$(bash "$here/build_llama_cpp.sh" | tail -1)"
mkdir -p "$out"
"$bin/llama-quantize" --allow-requantize --pure --tensor-type ffn_down=q4_k \
  "$model" "$out/smol-q4k.gguf" Q4_1 >&2
"$bin/llama-quantize" --allow-requantize --pure "$model" "$out/smol-q6k.gguf" Q6_K >&2
echo "$out/smol-q4k.gguf"
echo "$out/smol-q6k.gguf"
