#!/usr/bin/env bash
# The fuzzers' part of the test command: installs the build dependencies and clang
# (scripts/setup.sh, scripts/setup-fuzz.sh), builds both libFuzzer targets (scripts/build-fuzz.sh)
# and runs each for SECONDS (default 60) on its committed corpus, without changing it (MERGE=0;
# new inputs stay in build-fuzz/). Fails when either finds a crash, leak, timeout or broken
# invariant: its log's end is printed, the input is in build-fuzz/crashes*/ (fix the bug, then add
# the input to the corpus).
#   scripts/test-fuzz.sh [SECONDS]
#   JOBS=N  parallel compile jobs (default: all cores, nproc); each fuzzer runs as one process
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-60}"
start=$(date +%s)
bash scripts/setup.sh
bash scripts/setup-fuzz.sh
JOBS="${JOBS:-$(nproc)}" bash scripts/build-fuzz.sh
echo "test-fuzz: built in $(($(date +%s) - start))s" >&2
failed=0
for name in gguf requests; do
  log="build-fuzz/test-fuzz-$name.log"  # libFuzzer prints a line per new input: kept out of CI's log
  if MERGE=0 JOBS=1 bash "scripts/fuzz-$name.sh" "$SECONDS_TO_RUN" >"$log" 2>&1; then
    echo "test-fuzz: $name: $(grep -E '^Done [0-9]+ runs' "$log" | tail -n1)" >&2
  else
    tail -n 60 "$log" >&2
    echo "test-fuzz: $name FAILED (whole log: $log)" >&2
    failed=1
  fi
done
echo "test-fuzz: $([ "$failed" = 0 ] && echo passed || echo failed) in $(($(date +%s) - start))s" >&2
exit "$failed"
