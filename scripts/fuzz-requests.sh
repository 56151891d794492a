#!/usr/bin/env bash
# Builds the server request layer's libFuzzer target (fuzz/request_fuzz.cc: src/server/api.cc's
# parsing and validation of /v1/chat/completions, /v1/completions, /tokenize, /detokenize,
# /apply-template bodies; scripts/build-fuzz.sh: clang, ASan+UBSan) and runs it for SECONDS (default 180) on the
# committed corpus fuzz/corpus/requests/ with the dictionary fuzz/request.dict. New inputs go to
# build-fuzz/corpus-requests/; afterwards those that add coverage are merged into
# fuzz/corpus/requests/ (the kept corpus; MERGE=0 to skip). Crashes go to build-fuzz/crashes-requests/
# -- fix them, then copy the input into fuzz/corpus/requests/. Exits non-zero on a crash. Needs
# clang (scripts/setup-fuzz.sh).
#   scripts/fuzz-requests.sh [SECONDS] [extra libFuzzer flags...]
#   JOBS=N  compile jobs and fuzzing processes run in parallel (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-180}"
shift || true
JOBS="${JOBS:-1}"
OUT=build-fuzz
JOBS="$JOBS" bash scripts/build-fuzz.sh >&2
BIN="$OUT/request_fuzz"
mkdir -p "$OUT/corpus-requests" "$OUT/crashes-requests" fuzz/corpus/requests
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
