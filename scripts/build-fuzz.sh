#!/usr/bin/env bash
# Builds both libFuzzer targets (fuzz/CMakeLists.txt: gguf_fuzz and request_fuzz, clang with
# ASan+UBSan, every source compiled once for both) into build-fuzz/. Incremental: a second run
# rebuilds only what changed. Needs clang with libFuzzer (scripts/setup-fuzz.sh).
#   JOBS=N  parallel compile jobs (default: all cores, nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
CXX="${CXX_FUZZ:-clang++}"
command -v "$CXX" >/dev/null || { echo "build-fuzz: $CXX not found; run scripts/setup-fuzz.sh" >&2; exit 1; }
LAUNCHER=()
if command -v ccache >/dev/null; then LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER="$CXX" "${LAUNCHER[@]}" >/dev/null
cmake --build build-fuzz -j"${JOBS:-$(nproc)}"
