#!/usr/bin/env bash
# Configures and builds gemma4rt into ./build (Release). Extra args go to cmake's configure step.
# JOBS: parallel compile jobs (default: all cores, nproc). BUILD_TARGET: build only that target (run.sh
# builds just `gemma4rt`: the tests and benchmarks are most of the build's time).
# The CUDA backend is built where nvcc is found (on PATH or /usr/local/cuda/bin; no GPU needed):
# GEMMA4RT_CUDA=OFF turns that off, CUDA_ARCHS=90 (say) builds for fewer architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_args=()
nvcc="$(command -v nvcc || true)"
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ "${GEMMA4RT_CUDA:-ON}" != OFF ] && [ -n "$nvcc" ]; then
  cuda_args=(-DGEMMA4RT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
  if [ -n "${CUDA_ARCHS:-}" ]; then cuda_args+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS"); fi
  echo "build: CUDA backend on ($nvcc)"
else
  cuda_args=(-DGEMMA4RT_CUDA=OFF)
  echo "build: CUDA backend off (${nvcc:+GEMMA4RT_CUDA=OFF}${nvcc:-no nvcc on PATH or in /usr/local/cuda/bin})"
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" "$@" >/dev/null
cmake --build build -j"${JOBS:-$(nproc)}" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
