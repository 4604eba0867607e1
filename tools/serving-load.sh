#!/usr/bin/env bash
# Serving benchmark: starts `tandem serve` (the built-in model with DSpark K=5, or echo:), runs
# tests/e2e/load.mjs against it and writes bench/results/serving-load-<name>-<date>.json. Every field
# of that file comes from here or from load.mjs (server command, engine settings, commit, CPU, load
# average before and after), so the README can quote it as is.
#   tools/serving-load.sh builtin|echo [BUILD_DIR]
# Env: LOAD_CLIENTS (64), LOAD_SECONDS (60), LOAD_MAX_TOKENS (32), PORT (0 = any free port),
#      THREADS (1), SERVE_ARGS (extra flags).
set -euo pipefail
NAME=${1:?usage: tools/serving-load.sh builtin|echo [BUILD_DIR]}
BUILD=${2:-build}
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN="$ROOT/$BUILD/tandem"
[[ -x "$BIN" ]] || { echo "serving-load: $BIN not built"; exit 1; }
command -v node >/dev/null || { echo "serving-load: node not installed"; exit 1; }
CLIENTS=${LOAD_CLIENTS:-64} SECONDS_=${LOAD_SECONDS:-60} MAXTOK=${LOAD_MAX_TOKENS:-32} THREADS=${THREADS:-1}
TMP=$(mktemp -d /tmp/tandem-serving-load.XXXXXX)
if [[ "$NAME" == builtin ]]; then
  MODEL="$TMP/builtin"
  bash tools/builtin-model.sh "$BIN" "$MODEL" >/dev/null
  ARGS=(--speculative-config '{"method":"dspark","num_speculative_tokens":5}' --threads "$THREADS")
  ENGINE="real engine, data/builtin (DeepSeek-V4 architecture + DSpark draft) on the CPU DsV4Model, --threads $THREADS, DSpark K=5 (default verify mode), default scheduler limits"
else
  MODEL="echo:"
  ARGS=()
  ENGINE="EchoEngine (no model): the server, SSE and scheduler paths only"
fi
API_KEY=load-$RANDOM$RANDOM
LOG="$TMP/serve.log"
TANDEM_API_KEY="$API_KEY" "$BIN" serve --model "$MODEL" --host 127.0.0.1 --port "${PORT:-0}" \
  --served-model-name "$NAME" "${ARGS[@]}" ${SERVE_ARGS:-} >"$LOG" 2>&1 &
PID=$!
trap 'kill -KILL $PID 2>/dev/null || true; rm -rf "$TMP"' EXIT
source tools/serve-lib.sh
wait_for_port serving-load "$LOG" "$PID" 600
COMMAND="tandem serve --model <copy of data/builtin or echo:> --host 127.0.0.1 --served-model-name $NAME ${ARGS[*]} ${SERVE_ARGS:-}"
COMMIT=${TANDEM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo "+uncommitted")}
META=$(node -e 'const [e,c,cm,cpu,cores,load]=process.argv.slice(1);console.log(JSON.stringify({bench:"serving_load",engine:e,command:c,commit:cm,cpu,cpu_cores:Number(cores),loadavg_before:load}))' \
  "$ENGINE" "$COMMAND" "$COMMIT" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" "$(nproc)" \
  "$(cut -d' ' -f1-3 /proc/loadavg)")
OUT="bench/results/serving-load-$NAME-$(date -u +%F).json"
rc=0
(cd tests/e2e && TANDEM_BASE_URL="http://127.0.0.1:$PORT" TANDEM_API_KEY="$API_KEY" TANDEM_MODEL_NAME="$NAME" \
  LOAD_CLIENTS=$CLIENTS LOAD_SECONDS=$SECONDS_ LOAD_MAX_TOKENS=$MAXTOK LOAD_META="$META" LOAD_RESULT="$ROOT/$OUT.tmp" \
  node load.mjs) || rc=1
kill -TERM "$PID"
wait "$PID" || { echo "serving-load: server exit status $? after SIGTERM"; rc=1; }
# loadavg after the run, appended by node so the file stays one JSON object written by a program.
node -e 'const fs=require("fs");const [p,l]=process.argv.slice(1);const j=JSON.parse(fs.readFileSync(p));j.loadavg_after=l;fs.writeFileSync(p.replace(/\.tmp$/,""),JSON.stringify(j,null,2)+"\n");fs.unlinkSync(p)' \
  "$ROOT/$OUT.tmp" "$(cut -d' ' -f1-3 /proc/loadavg)"
echo "serving-load: wrote $OUT (exit $rc)"
exit $rc
