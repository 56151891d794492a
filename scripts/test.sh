#!/usr/bin/env bash
# The test command: installs build dependencies, builds, and runs every test (unit, golden,
# CLI) with CTest. Needs no network beyond Debian's package mirror (and none once set up).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
