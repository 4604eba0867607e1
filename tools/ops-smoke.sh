#!/usr/bin/env bash
# Operations smoke test against the real server on the built-in model (issue 13):
#  - `tandem audit` prints the contract and fails closed on a manifest mismatch;
#  - `tandem serve` runs the audit at start-up (TANDEM_RUNTIME_AUDIT_PASS), refuses on a manifest
#    mismatch and when the memory headroom floor cannot be met (with the numbers);
#  - `tandem proof` against it: no gate fails, knowledge gates are pass or not_meaningful, never
#    faked; a wrong model name fails the identity gate;
#  - restart: SIGTERM drains an in-flight request and exits 0, a new server on the same port
#    answers again.
#   tools/ops-smoke.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-models/builtin}
cd "$(dirname "$0")/.."
bash tools/builtin-model.sh "$BUILD/tandem" "$MODEL" >/dev/null
source tools/serve-lib.sh
T=$BUILD/tandem
TMP=$(mktemp -d /tmp/tandem-ops.XXXXXX)
PID=""
trap '[[ -n "$PID" ]] && kill -KILL $PID 2>/dev/null; rm -rf "$TMP"' EXIT
fail() { echo "ops-smoke: FAILED: $*"; for f in "$TMP"/*.log; do echo "== $f"; tail -15 "$f"; done; exit 1; }
json_get() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval("d" + sys.argv[2]))' "$1" "$2"; }
SPEC='{"method":"dspark","num_speculative_tokens":5}'
# Small pools, one thread and fixed verification (no start-up batch-shape profiling): quick starts.
LIGHT=(--max-num-seqs 2 --kv-cache-memory 256M --threads 1)
SPEC_FIXED='{"method":"dspark","num_speculative_tokens":5,"verify_mode":"fixed"}'

# ---- tandem audit ----
"$T" audit >"$TMP/audit.json" 2>"$TMP/audit.log" || fail "tandem audit (build facts) failed"
[[ $(json_get "$TMP/audit.json" "['tandem']['version']") != "" ]] || fail "audit has no version"
grep -q TANDEM_RUNTIME_AUDIT_PASS "$TMP/audit.log" || fail "audit did not pass"
echo '{"kv_cache_dtype":"nvfp4","speculative":{"method":"dspark","num_speculative_tokens":5}}' >"$TMP/nvfp4.json"
if "$T" audit --model "$MODEL" "${LIGHT[@]}" --kv-cache-dtype fp8 --speculative-config "$SPEC_FIXED" --manifest "$TMP/nvfp4.json" \
     >"$TMP/audit2.json" 2>"$TMP/audit2.log"; then fail "audit passed against a mismatching manifest"; fi
grep -q 'mismatch: kv_cache_dtype: manifest "nvfp4", runtime "fp8"' "$TMP/audit2.log" || fail "mismatch not named"
[[ $(json_get "$TMP/audit2.json" "['ranks'][0]['kernels']['sparse_attention']") == cpu-reference ]] \
  || fail "kernel path not reported"
echo '{"kv_cache_dtype":"fp8","speculative":{"method":"dspark","num_speculative_tokens":5}}' >"$TMP/fp8.json"

# ---- serve refuses: manifest mismatch, headroom floor ----
if "$T" serve --model "$MODEL" "${LIGHT[@]}" --port 0 --kv-cache-dtype fp8 --audit-manifest "$TMP/nvfp4.json" \
     >"$TMP/refuse1.log" 2>&1; then fail "serve started against a mismatching manifest"; fi
grep -q 'TANDEM_RUNTIME_AUDIT_FAIL' "$TMP/refuse1.log" || fail "serve did not report the audit failure"
if "$T" serve --model "$MODEL" "${LIGHT[@]}" --port 0 --memory-headroom-floor 1048576G >"$TMP/refuse2.log" 2>&1; then
  fail "serve started under the memory headroom floor"; fi
grep -q 'under the floor of 1024.00 TiB\|under the floor of 1048576.00 GiB' "$TMP/refuse2.log" \
  || fail "headroom refusal without the numbers"

# ---- serve with the audit manifest; proof against it ----
"$T" serve --model "$MODEL" "${LIGHT[@]}" --served-model-name builtin --host 127.0.0.1 --port 0 \
  --speculative-config "$SPEC_FIXED" --kv-cache-dtype fp8 --audit-manifest "$TMP/fp8.json" >"$TMP/serve.log" 2>&1 &
PID=$!
wait_for_port ops-smoke "$TMP/serve.log" "$PID" 300
grep -q '^TANDEM_RUNTIME_AUDIT_PASS' "$TMP/serve.log" || fail "serve did not log TANDEM_RUNTIME_AUDIT_PASS"
grep -q 'memory plan:' "$TMP/serve.log" || fail "no start-up memory report"
BASE="http://127.0.0.1:$PORT"
"$T" proof --base-url "$BASE/v1" --model builtin --context-tokens 1500 --timeout 600 --output "$TMP/proof.json" \
  >/dev/null 2>"$TMP/proof.log" || fail "tandem proof reported a failed gate: $(cat "$TMP/proof.log")"
python3 - "$TMP/proof.json" <<'PY' || fail "proof report"
import json, sys
r = json.load(open(sys.argv[1]))
g = {x["name"]: x for x in r["gates"]}
must = ["served_model_identity", "deterministic_temperature_0", "tool_call_forced", "strict_json_schema",
        "streaming_usage_consistency"]
for n in must:
    assert g[n]["status"] == "pass", (n, g[n])
for n in ["tool_call_auto", "tool_result_continuation", "uncached_long_context_retrieval"]:
    assert g[n]["status"] in ("pass", "not_meaningful"), (n, g[n])
    if g[n]["status"] == "not_meaningful":
        assert not r["capability_probe"]["capable"], n
lc = g["uncached_long_context_retrieval"]["evidence"]
assert lc["cached_tokens"] == 0 and lc["prompt_tokens"] >= 1500, lc
print("proof: %(pass)d pass, %(fail)d fail, %(not_meaningful)d not meaningful" % r["summary"])
PY
cp "$TMP/proof.json" "$BUILD/proof-builtin.json"
if "$T" proof --base-url "$BASE" --model not-the-model --context-tokens 200 >"$TMP/proof2.json" 2>/dev/null; then
  fail "proof passed with the wrong model name"; fi
[[ $(json_get "$TMP/proof2.json" "['gates'][0]['status']") == fail ]] || fail "identity gate did not fail"
curl -s "$BASE/metrics" | grep -q '^tandem:prefill_tokens_pending' || fail "no prefill progress in /metrics"

# ---- restart: SIGTERM drains an in-flight request, then a new server on the same port ----
body='{"model":"builtin","messages":[{"role":"user","content":"Count from 1 to 20."}],"max_tokens":64,"temperature":0}'
curl -s --max-time 120 "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >"$TMP/inflight.json" &
CURL=$!
sleep 0.3
kill -TERM "$PID"
wait "$PID" || fail "server exit code $? after SIGTERM"
wait "$CURL" || true
grep -q '"finish_reason"' "$TMP/inflight.json" || fail "in-flight request not drained: $(cat "$TMP/inflight.json")"
"$T" serve --model "$MODEL" "${LIGHT[@]}" --served-model-name builtin --host 127.0.0.1 --port "$PORT" \
  --speculative-config "$SPEC_FIXED" >"$TMP/restart.log" 2>&1 &
PID=$!
wait_for_port ops-smoke "$TMP/restart.log" "$PID" 300
out=$(curl -s --max-time 120 "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$body")
echo "$out" | grep -q '"content":"1, 2, 3, 4, 5' || fail "after restart: $out"
[[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health") == 200 ]] || fail "/health after restart"
kill -TERM "$PID"
wait "$PID" || fail "restarted server exit code $?"
PID=""
echo "ops-smoke: PASSED (audit, start-up refusals, proof, SIGTERM drain and restart)"
