#!/usr/bin/env bash
# Makes quantized variants of the default model with llama.cpp's llama-quantize (built by
# build_llama_cpp.sh), for benchmarks and fidelity checks of the quantized formats. Most of
# SmolLM2-135M's matrices have 576 columns, not a multiple of 256, so K-quants and IQ4_XS fit
# only ffn_down (1,536 columns) and llama-quantize falls back for the others, as it does for
# any model whose rows are not multiples of 256 (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
# Q2_K / Q3_K / IQ4_XS -> IQ4_NL):
#   smol-q4k.gguf     Q4_1, with ffn_down in Q4_K (--pure)
#   smol-q6k.gguf     Q6_K where it fits (ffn_down), llama.cpp's Q8_0 fallback elsewhere (--pure)
#   smol-q4_k_m.gguf  smol-q5_k_m.gguf  smol-q3_k_m.gguf  smol-q2_k.gguf  smol-iq4_xs.gguf
#                     llama-quantize's mixtures of those names (what people download)
#   smol-q2_k-pure.gguf  Q2_K where it fits (--pure): llama-quantize's Q2_K mixture keeps no
#                     Q2_K tensor on this model (ffn_down goes to Q3_K), so this file is the
#                     source of real Q2_K rows for scripts/make_quant_real_fixtures.py
# The source is the Q4_1 default model (requantized: each file's reference is the fp32
# function of its own weights, see bench/quant_fidelity.py).
# Usage: bench/make_kquant_models.sh [OUT_DIR]   (prints the paths)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/.kquant}"
model="${TANDEM_CACHE_DIR:-$HOME/.cache/tandem}/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || { echo "the default model is missing: run any tandem command once" >&2; exit 1; }
bin="$(bash "$here/build_llama_cpp.sh" | tail -1)"
mkdir -p "$out"
quantize() { # OUT TYPE [llama-quantize options]
  local dst="$out/$1" type="$2"
  shift 2
  [ -f "$dst" ] || "$bin/llama-quantize" --allow-requantize "$@" "$model" "$dst" "$type" >&2
  echo "$dst"
}
quantize smol-q4k.gguf Q4_1 --pure --tensor-type ffn_down=q4_k
quantize smol-q6k.gguf Q6_K --pure
quantize smol-q2_k-pure.gguf Q2_K --pure
for type in Q4_K_M Q5_K_M Q3_K_M Q2_K IQ4_XS; do
  name="$(echo "$type" | tr 'A-Z' 'a-z')"
  quantize "smol-$name.gguf" "$type"
done
