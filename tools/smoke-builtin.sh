#!/usr/bin/env bash
# Smoke test of the real engine behind the real server: serves the built-in model (with DSpark,
# as `make run` does) on a free loopback port, asks it to count with greedy decoding (plain and
# streamed) and for a Python function, checks the answers, prefix caching, /metrics and /health,
# then SIGTERM must exit 0.
#   tools/smoke-builtin.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-models/builtin}
cd "$(dirname "$0")/.."
bash tools/builtin-model.sh "$BUILD/tandem" "$MODEL" >/dev/null
LOG=$(mktemp /tmp/tandem-smoke.XXXXXX.log)
"$BUILD/tandem" serve --model "$MODEL" --served-model-name builtin --host 127.0.0.1 --port 0 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' >"$LOG" 2>&1 &
PID=$!
trap 'kill -KILL $PID 2>/dev/null || true' EXIT
source tools/serve-lib.sh
wait_for_port smoke "$LOG" "$PID" 300
BASE="http://127.0.0.1:$PORT"
fail() { echo "smoke: FAILED: $*"; tail -20 "$LOG"; exit 1; }

body='{"model":"builtin","messages":[{"role":"user","content":"Count from 1 to 20."}],"max_tokens":64,"temperature":0}'
out=$(curl -s --max-time 120 "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d "$body")
echo "$out" | grep -q '"content":"1, 2, 3, 4, 5, 6, 7, 8, 9, 10' || fail "counting answer: $out"
stream=$(curl -sN --max-time 120 "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "${body%\}},\"stream\":true,\"stream_options\":{\"include_usage\":true}}")
echo "$stream" | tail -1 | grep -q '^data: \[DONE\]' || fail "stream did not end with [DONE]"
echo "$stream" | grep -o '"content":"[^"]*"' | sed 's/"content":"//; s/"$//' | tr -d '\n' \
  | grep -q '^1, 2, 3, 4, 5' || fail "streamed text differs"
# A chat request about Python code gets Python code (the built-in model's chat training, issue 6).
pbody='{"model":"builtin","messages":[{"role":"user","content":"Write a Python function that reverses a string."}],"max_tokens":160,"temperature":0}'
py=$(curl -s --max-time 120 "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d "$pbody")
echo "$py" | grep -q '```python\\n.*def [a-z_]*(.*return' || fail "Python answer without a code block: $py"
# A prompt longer than one KV block (256 tokens), twice: the second must hit the prefix cache.
long=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 1 60))
lbody="{\"model\":\"builtin\",\"messages\":[{\"role\":\"system\",\"content\":\"$long\"},{\"role\":\"user\",\"content\":\"List the days of the week.\"}],\"max_tokens\":24,\"temperature\":0}"
first=$(curl -s --max-time 120 "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d "$lbody")
second=$(curl -s --max-time 120 "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d "$lbody")
echo "$second" | grep -q '"cached_tokens":[1-9]' || fail "second identical long prompt reported no cached tokens: $second"
[[ "$(echo "$first" | grep -o '"content":"[^"]*"')" == "$(echo "$second" | grep -o '"content":"[^"]*"')" ]] \
  || fail "cached prompt changed the greedy output"
metrics=$(curl -s "$BASE/metrics")
echo "$metrics" | grep -q '^vllm:spec_decode_num_accepted_tokens_total{model_name="builtin"} [1-9]' \
  || fail "no accepted draft tokens in /metrics"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$BASE/health") == 200 ]] || fail "/health"
kill -TERM "$PID"
wait "$PID" || fail "server exit code $? after SIGTERM"
trap - EXIT
echo "smoke: PASSED (builtin model, DSpark K=5, $(echo "$metrics" | sed -n 's/^vllm:spec_decode_num_accepted_tokens_total{model_name="builtin"} //p') accepted draft tokens)"
