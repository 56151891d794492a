#!/usr/bin/env bash
# Load benchmark (not a test): starts ./build/gemma4rt serve on the default model on a free loopback
# port with NP slots, runs bench/load.py (CONCURRENCY streaming clients, REQUESTS requests of
# MAX_TOKENS tokens; aggregate and per-stream tokens/s, errors, server VmRSS), stops the server.
# Installs httpx from PyPI into the venv under build/ once. To load an already running server
# instead: build/clients-venv/bin/python bench/load.py --url URL --pid PID [--api-key KEY].
#   NP=8 CONCURRENCY=32 REQUESTS=64 MAX_TOKENS=16 CTX=1024 THREADS=(all cores) PROMPT_FILE= scripts/bench-load.sh
# PROMPT_FILE: every other request sends 5000 characters of this file (load.py --prompt-file).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${GEMMA4RT_BIN:-./build/gemma4rt}"
VENV="${CLIENTS_VENV:-build/clients-venv}"
NP="${NP:-8}"
CTX="${CTX:-1024}"
THREADS="${THREADS:-0}"
[ -x "$BIN" ] || { echo "bench-load: $BIN not found (run scripts/build.sh)" >&2; exit 1; }
MODEL="${GEMMA4RT_DEFAULT_MODEL:-$(bash scripts/fetch-default-model.sh)}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import httpx" 2>/dev/null; then
  echo "bench-load: creating $VENV with httpx from PyPI" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "httpx==0.28.1"
fi
PORT="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
LOG=build/bench-load-server.log
CMD=("$BIN" serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" -np "$NP" -c "$CTX" -t "$THREADS")
echo "bench-load: ${CMD[*]}" >&2
"${CMD[@]}" >"$LOG" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "bench-load: server exited; log:" >&2; cat "$LOG" >&2; exit 1; }
  "$VENV/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && break
  sleep 0.2
done
"$VENV/bin/python" bench/load.py --url "http://127.0.0.1:$PORT" --pid "$SERVER_PID" \
  --concurrency "${CONCURRENCY:-32}" --requests "${REQUESTS:-64}" --max-tokens "${MAX_TOKENS:-16}" --timeout "${TIMEOUT:-900}" \
  ${PROMPT_FILE:+--prompt-file "$PROMPT_FILE"}
