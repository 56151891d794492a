#!/usr/bin/env bash
# Builds the server request layer's libFuzzer target (fuzz/request_fuzz.cc: src/server/api.cc's
# parsing and validation of /v1/chat/completions, /v1/completions, /tokenize, /detokenize,
# /apply-template bodies) with clang and ASan+UBSan, and runs it for SECONDS (default 180) on the
# committed corpus fuzz/corpus/requests/ with the dictionary fuzz/request.dict. New inputs go to
# build-fuzz/corpus-requests/; afterwards those that add coverage are merged into
# fuzz/corpus/requests/ (the kept corpus; MERGE=0 to skip). Crashes go to build-fuzz/crashes-requests/
# -- fix them, then copy the input into fuzz/corpus/requests/. Needs clang (scripts/setup-fuzz.sh).
#   scripts/fuzz-requests.sh [SECONDS] [extra libFuzzer flags...]
#   JOBS=N  run N fuzzing processes in parallel (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-180}"
shift || true
CXX="${CXX_FUZZ:-clang++}"
command -v "$CXX" >/dev/null || { echo "fuzz-requests: $CXX not found; run scripts/setup-fuzz.sh" >&2; exit 1; }
OUT=build-fuzz
mkdir -p "$OUT/corpus-requests" "$OUT/crashes-requests" fuzz/corpus/requests
SRCS=(fuzz/request_fuzz.cc src/server/api.cc src/tokenizer/*.cc src/runtime/sampler.cc src/base/status.cc
      src/base/mapped_file.cc src/model/gguf.cc src/tensor/dtype.cc src/tensor/dequant.cc src/tensor/tensor.cc)
BIN="$OUT/request_fuzz"
rebuild=1
if [ -x "$BIN" ]; then
  rebuild=0
  for f in "${SRCS[@]}" src/server/*.h src/tokenizer/*.h src/runtime/*.h src/base/*.h; do
    if [ "$f" -nt "$BIN" ]; then rebuild=1; break; fi
  done
fi
if ((rebuild)); then
  echo "fuzz-requests: building $BIN" >&2
  "$CXX" -std=c++20 -g -O1 -fno-omit-frame-pointer -Isrc \
    -DREQUEST_FUZZ_TOKENIZER_DIR="\"$PWD/tests/data/tokenizer_gemma4_tiny\"" \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    "${SRCS[@]}" -o "$BIN"
fi
JOBS="${JOBS:-1}"
PAR=()
if [ "$JOBS" -gt 1 ]; then PAR=(-fork="$JOBS"); fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "fuzz-requests: running for ${SECONDS_TO_RUN}s" >&2
status=0
"$BIN" -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
  -dict=fuzz/request.dict -artifact_prefix="$OUT/crashes-requests/" -print_final_stats=1 "${PAR[@]}" "$@" \
  "$OUT/corpus-requests" fuzz/corpus/requests || status=$?
if [ "${MERGE:-1}" = 1 ] && [ "$status" = 0 ]; then
  before=$(ls fuzz/corpus/requests | wc -l)
  "$BIN" -merge=1 -max_len=4096 fuzz/corpus/requests "$OUT/corpus-requests" >/dev/null 2>&1 || true
  echo "fuzz-requests: kept corpus fuzz/corpus/requests: $before -> $(ls fuzz/corpus/requests | wc -l) inputs" >&2
fi
exit "$status"
