#!/usr/bin/env bash
# Configures and builds gemma4rt into ./build (Release). Extra args go to cmake's configure step.
# JOBS: parallel compile jobs (default: all cores, nproc). BUILD_TARGET: build only that target (run.sh
# builds just `gemma4rt`: the tests and benchmarks are most of the build's time).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"${JOBS:-$(nproc)}" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
