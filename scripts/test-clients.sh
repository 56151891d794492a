#!/usr/bin/env bash
# Client compatibility test: the official OpenAI Python SDK against `gemma4rt serve`.
# Installs openai + pytest from PyPI into a venv under build/ (once), starts ./build/gemma4rt serve
# on the default model on a free loopback port with an API key, waits for /health, runs
# tests/clients/test_openai.py with pytest, stops the server; then the same for the tool-call round
# trip, tests/clients/test_tools.py, against ./build/gemma4rt_scripted_serve (the server over a
# backend replaying tests/clients/tools_script.json; a test-only target of scripts/build.sh).
# Exits non-zero on any failure after printing pytest's summary lines.
#   GEMMA4RT_BIN            the binary (default ./build/gemma4rt; must have the `serve` subcommand)
#   GEMMA4RT_SCRIPTED_BIN   the scripted server (default ./build/gemma4rt_scripted_serve)
#   GEMMA4RT_DEFAULT_MODEL  the model (default: scripts/fetch-default-model.sh)
#   CLIENTS_VENV            the venv (default build/clients-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${GEMMA4RT_BIN:-./build/gemma4rt}"
VENV="${CLIENTS_VENV:-build/clients-venv}"
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "test-clients: python3 is needed" >&2; exit 1; }
[ -x "$BIN" ] || { echo "test-clients: $BIN not found (run scripts/build.sh)" >&2; exit 1; }
"$BIN" serve --help >/dev/null 2>&1 || { echo "test-clients: $BIN has no 'serve' subcommand" >&2; exit 1; }
MODEL="${GEMMA4RT_DEFAULT_MODEL:-$(bash scripts/fetch-default-model.sh)}"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai, pytest" 2>/dev/null; then
  echo "test-clients: creating $VENV with openai and pytest from PyPI" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "openai==3.57.0" "pytest>=8"
fi

PORT="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
KEY="test-key-$RANDOM$RANDOM"
LOG=build/test-clients-server.log
"$BIN" serve -m "$MODEL" --host 127.0.0.1 --port "$PORT" -np 4 -c 2048 --api-key "$KEY" --metrics >"$LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
}
trap stop_server EXIT

URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 600); do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "test-clients: the server exited during start-up; its log:" >&2
    cat "$LOG" >&2
    exit 1
  fi
  if "$VENV/bin/python" -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('$URL/health', timeout=2).status == 200 else 1)" 2>/dev/null; then
    break
  fi
  sleep 0.2
done
"$VENV/bin/python" -c "import urllib.request; urllib.request.urlopen('$URL/health', timeout=2)" 2>/dev/null ||
  { echo "test-clients: $URL/health never answered 200; server log:" >&2; cat "$LOG" >&2; exit 1; }

status=0
GEMMA4RT_BASE_URL="$URL" GEMMA4RT_API_KEY="$KEY" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/clients/test_openai.py || status=$?
if [ "$status" != 0 ]; then
  echo "test-clients: FAILED (pytest exit $status); server log tail:" >&2
  tail -n 20 "$LOG" >&2
fi
stop_server

SCRIPTED="${GEMMA4RT_SCRIPTED_BIN:-./build/gemma4rt_scripted_serve}"
[ -x "$SCRIPTED" ] || { echo "test-clients: $SCRIPTED not found (scripts/build.sh builds it)" >&2; exit 1; }
PORT="$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
LOG=build/test-clients-scripted.log
"$SCRIPTED" tests/golden/gemma4-e2b-tiny/model-f32.gguf tests/data/tokenizer_gemma4_tiny tests/clients/tools_script.json \
  "$PORT" >"$LOG" 2>&1 &
SERVER_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 300); do
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "test-clients: the scripted server exited; its log:" >&2; cat "$LOG" >&2; exit 1; }
  "$VENV/bin/python" -c "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('$URL/health', timeout=2).status == 200 else 1)" 2>/dev/null && break
  sleep 0.2
done
GEMMA4RT_SCRIPTED_URL="$URL" "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/clients/test_tools.py || {
  status=1
  echo "test-clients: tool round trip FAILED; scripted server log tail:" >&2
  tail -n 20 "$LOG" >&2
}
exit "$status"
