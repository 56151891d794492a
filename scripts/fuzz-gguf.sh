#!/usr/bin/env bash
# Builds the GGUF reader's libFuzzer target (fuzz/gguf_fuzz.cc; scripts/build-fuzz.sh) and runs it
# for SECONDS (default 180) on the committed seed corpus fuzz/corpus/gguf/. New inputs it finds go
# to build-fuzz/corpus-gguf/ (not committed); crashes to build-fuzz/crashes/ -- fix them, then
# copy the input into fuzz/corpus/gguf/. Exits non-zero on a crash. Needs clang
# (scripts/setup-fuzz.sh).
#   scripts/fuzz-gguf.sh [SECONDS] [extra libFuzzer flags...]
#   JOBS=N  compile jobs and fuzzing processes run in parallel (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-180}"
shift || true
JOBS="${JOBS:-1}"
OUT=build-fuzz
JOBS="$JOBS" bash scripts/build-fuzz.sh >&2
mkdir -p "$OUT/corpus-gguf" "$OUT/crashes"
PAR=()
if [ "$JOBS" -gt 1 ]; then PAR=(-fork="$JOBS"); fi
# Each input goes through a temporary file: keep it in memory when possible.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "fuzz-gguf: running for ${SECONDS_TO_RUN}s" >&2
exec "$OUT/gguf_fuzz" -max_total_time="$SECONDS_TO_RUN" -max_len=16384 -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$OUT/crashes/" -print_final_stats=1 "${PAR[@]}" "$@" \
  "$OUT/corpus-gguf" fuzz/corpus/gguf
