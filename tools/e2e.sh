#!/usr/bin/env bash
# End-to-end test of `tandem serve`: starts it on a free loopback port with the given model dir
# (default "echo:", the built-in EchoEngine), runs the Node tests (official openai SDK + ajv, raw
# sockets), a bounded load test (LOAD_CLIENTS=64 streaming clients for LOAD_SECONDS, default 10),
# then sends SIGTERM and requires a clean exit 0.
#   tools/e2e.sh [MODEL_DIR] [BUILD_DIR]      e.g. tools/e2e.sh models/builtin build
set -euo pipefail
MODEL=${1:-echo:}
BUILD=${2:-build}
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="$ROOT/$BUILD/tandem"
[[ -x "$BIN" ]] || { echo "e2e: $BIN not built"; exit 1; }
command -v node >/dev/null || { echo "e2e: node not installed"; exit 1; }

E2E="$ROOT/tests/e2e"
if [[ ! -d "$E2E/node_modules/openai" ]]; then
  (cd "$E2E" && npm ci --no-audit --no-fund --loglevel=error)
fi

API_KEY=${TANDEM_E2E_API_KEY:-e2e-$RANDOM$RANDOM}
LOG=$(mktemp /tmp/tandem-e2e.XXXXXX.log)
TANDEM_API_KEY="$API_KEY" "$BIN" serve --model "$MODEL" --host 127.0.0.1 --port 0 --served-model-name tandem \
  ${E2E_SERVE_ARGS:-} >"$LOG" 2>&1 &
PID=$!
cleanup() { if kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID" 2>/dev/null || true; fi; }
trap cleanup EXIT

source tools/serve-lib.sh
wait_for_port e2e "$LOG" "$PID" "${E2E_START_TIMEOUT:-600}"
BASE="http://127.0.0.1:$PORT"
MAX_LEN=$(curl -s -H "Authorization: Bearer $API_KEY" "$BASE/v1/models" | node -e \
  'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).data[0].max_model_len))')
echo "e2e: server pid $PID on $BASE (model $MODEL, max_model_len $MAX_LEN)"

export TANDEM_BASE_URL="$BASE" TANDEM_API_KEY="$API_KEY" TANDEM_MODEL_NAME=tandem TANDEM_MAX_MODEL_LEN="$MAX_LEN"
[[ "$MODEL" == echo:* ]] && export TANDEM_E2E_ECHO=1
rc=0
(cd "$E2E" && node --test --test-concurrency=1 openai.test.mjs raw_socket.test.mjs) || rc=1
(cd "$E2E" && LOAD_CLIENTS=${LOAD_CLIENTS:-64} LOAD_SECONDS=${LOAD_SECONDS:-10} node load.mjs) || { echo "e2e: load test FAILED"; rc=1; }

kill -TERM "$PID"
if wait "$PID"; then echo "e2e: server exited 0 after SIGTERM"; else echo "e2e: server exit code $? after SIGTERM"; rc=1; fi
trap - EXIT
[[ $rc -eq 0 ]] && echo "e2e: PASSED" || { echo "e2e: FAILED (server log: $LOG)"; tail -20 "$LOG"; }
exit $rc
