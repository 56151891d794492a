#!/usr/bin/env bash
# Builds the GGUF reader's libFuzzer target (fuzz/gguf_fuzz.cc) with clang and ASan+UBSan, and
# runs it for SECONDS (default 180) on the committed seed corpus fuzz/corpus/gguf/. New inputs it
# finds go to build-fuzz/corpus-gguf/ (not committed); crashes to build-fuzz/crashes/ -- copy a
# crashing input into fuzz/corpus/gguf/ once it is fixed. Needs clang (scripts/setup-fuzz.sh).
#   scripts/fuzz-gguf.sh [SECONDS] [extra libFuzzer flags...]
#   JOBS=N  run N fuzzing processes in parallel (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-180}"
shift || true
CXX="${CXX_FUZZ:-clang++}"
command -v "$CXX" >/dev/null || { echo "fuzz-gguf: $CXX not found; run scripts/setup-fuzz.sh" >&2; exit 1; }
OUT=build-fuzz
mkdir -p "$OUT/corpus-gguf" "$OUT/crashes"
SRCS=(fuzz/gguf_fuzz.cc src/model/gguf.cc src/base/mapped_file.cc src/base/status.cc
      src/tensor/dtype.cc src/tensor/dequant.cc src/tensor/tensor.cc)
echo "fuzz-gguf: building $OUT/gguf_fuzz" >&2
"$CXX" -std=c++20 -g -O1 -fno-omit-frame-pointer -Isrc \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "${SRCS[@]}" -o "$OUT/gguf_fuzz"
JOBS="${JOBS:-1}"
PAR=()
if [ "$JOBS" -gt 1 ]; then PAR=(-fork="$JOBS"); fi
# Each input goes through a temporary file: keep it in memory when possible.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "fuzz-gguf: running for ${SECONDS_TO_RUN}s" >&2
exec "$OUT/gguf_fuzz" -max_total_time="$SECONDS_TO_RUN" -max_len=16384 -rss_limit_mb=2048 \
  -artifact_prefix="$OUT/crashes/" -print_final_stats=1 "${PAR[@]}" "$@" \
  "$OUT/corpus-gguf" fuzz/corpus/gguf
