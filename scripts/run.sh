#!/usr/bin/env bash
# The main job on a fresh machine: installs build dependencies, builds, gets the default model and
# runs gemma4rt. With no arguments it runs the default demo; otherwise the arguments are passed to
# gemma4rt (e.g. `scripts/run.sh info -m DIR`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
bash scripts/build.sh >&2
if [ "$#" -eq 0 ]; then
  # Until GGUF + tokenizer support lands, the demo runs the tiny E2B-like golden checkpoint.
  set -- generate -m tests/golden/gemma4-e2b-tiny --tokens 2,105,236,107 -n 16
fi
exec ./build/gemma4rt "$@"
