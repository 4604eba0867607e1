#!/usr/bin/env bash
# End-to-end test of `tandem bench` (the serving benchmark client) against `tandem serve`:
#  1. the echo engine behind an API key: a short sweep must succeed with consistent token counts,
#     the report must carry every field and the SVG must be well-formed XML;
#  2. failure accounting: a wrong model name and over-long requests are counted as failed (exit 3),
#     a wrong API key and an unreachable server are clear errors (exit 1), never crashes;
#  3. the built-in model with DSpark: consistent counts, server counters that match the client's,
#     speculative acceptance from /metrics, and a counting output the check accepts.
#   tools/bench-e2e.sh [BUILD_DIR] [MODEL_DIR]
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-models/builtin}
cd "$(dirname "$0")/.."
BIN="$PWD/$BUILD/tandem"
[[ -x "$BIN" ]] || { echo "bench-e2e: $BIN not built"; exit 1; }
source tools/serve-lib.sh
OUT=$(mktemp -d /tmp/tandem-bench-e2e.XXXXXX)
PID=""
cleanup() { [[ -n "$PID" ]] && kill -KILL "$PID" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "bench-e2e: FAILED: $*"; [[ -f "$OUT/serve.log" ]] && tail -20 "$OUT/serve.log"; exit 1; }

# expect_rc WANT CMD...: runs CMD, keeps its output in $OUT/last.log, fails unless it exits WANT.
expect_rc() {
  local want=$1; shift
  set +e; "$@" >"$OUT/last.log" 2>&1; local rc=$?; set -e
  [[ $rc -eq $want ]] || { cat "$OUT/last.log"; fail "exit $rc, expected $want: $*"; }
}

# check_report JSON SVG PYTHON_ASSERTIONS: the fields every report has, the SVG parses as XML, plus
# the caller's assertions (variables: r = report).
check_report() {
  python3 - "$1" "$2" "$3" <<'PY' || fail "report check ($1)"
import json, sys, xml.etree.ElementTree as ET
r = json.load(open(sys.argv[1]))
for k in ("date", "client_commit", "target", "settings", "runs", "summary", "totals", "warmup", "definitions"):
    assert k in r, "missing " + k
assert r["client_commit"] not in ("", "unknown"), r["client_commit"]
for k in ("base_url", "model", "metrics_available", "served_models"):
    assert k in r["target"], "target." + k
for k in ("workloads", "concurrency", "repeats", "stagger_ms", "long_prompt_words", "temperature"):
    assert k in r["settings"], "settings." + k
s = r["settings"]
assert len(r["runs"]) == len(s["workloads"]) * len(s["concurrency"]) * s["repeats"], len(r["runs"])
for run in r["runs"]:
    assert len(run["request_records"]) == run["requests"] == run["concurrency"], run["requests"]
    assert run["succeeded"] + run["failed"] == run["requests"]
t = r["totals"]
assert t["requests"] == sum(run["requests"] for run in r["runs"])
svg = ET.parse(sys.argv[2]).getroot()
assert svg.tag == "{http://www.w3.org/2000/svg}svg", svg.tag
exec(sys.argv[3])
PY
}

# ---- 1. echo engine ----
KEY="bench-$RANDOM$RANDOM"
TANDEM_API_KEY="$KEY" "$BIN" serve --model echo: --host 127.0.0.1 --port 0 --served-model-name tandem \
  >"$OUT/serve.log" 2>&1 &
PID=$!
wait_for_port bench-e2e "$OUT/serve.log" "$PID" 60
BASE="http://127.0.0.1:$PORT"
expect_rc 0 "$BIN" bench --base-url "$BASE/v1" --model tandem --api-key "$KEY" --workloads count,prose,long-prompt \
  --concurrency 1,2,4 --repeats 2 --stagger-ms 5 --max-tokens 64 --long-prompt-words 300 \
  --notes "bench-e2e echo" --output "$OUT/echo.json"
grep -q "0 failed, 0 with inconsistent token counts, 0 runs" "$OUT/last.log" || fail "summary line: $(tail -2 "$OUT/last.log")"
check_report "$OUT/echo.json" "$OUT/echo.svg" '
assert t["requests"] == 3 * (1 + 2 + 4) * 2 and t["failed"] == 0 and t["inconsistent_token_counts"] == 0
assert t["counter_mismatches"] == 0
assert r["target"]["metrics_available"] and r["target"]["model_listed"]
assert r["settings"]["api_key_sent"] and "'"$KEY"'" not in open(sys.argv[1]).read()
for run in r["runs"]:
    assert run["server"]["generation_tokens"] == run["completion_tokens"] > 0
    assert run["ttft_s"]["median"] > 0 and run["aggregate_tok_s"] > 0
    # the echo engine replies "Echo: <prompt>", one byte per token, one chunk per token on one line
    # (the long prompt has newlines, which may share a chunk with their neighbours)
    assert run["tokens_per_chunk"] == 1.0 or run["workload"] == "long-prompt", run["tokens_per_chunk"]
    assert run["tokens_per_chunk"] >= 1.0
long = [run for run in r["runs"] if run["workload"] == "long-prompt"]
assert all(run["cached_prompt_tokens"] == 0 and run["prompt_tokens"] > 1500 for run in long)
assert all(run["output_checks"] == {"wrong": run["succeeded"]} for run in r["runs"] if run["workload"] == "count")
'

# ---- 2. failure accounting ----
expect_rc 3 "$BIN" bench --base-url "$BASE" --model no-such-model --api-key "$KEY" --workloads count \
  --concurrency 1,2 --repeats 1 --warmup 0 --output "$OUT/wrong-model.json"
check_report "$OUT/wrong-model.json" "$OUT/wrong-model.svg" '
assert t["requests"] == 3 and t["failed"] == 3, t
rec = r["runs"][0]["request_records"][0]
assert rec["http_status"] == 404 and not rec["ok"] and "no-such-model" in rec["error"], rec
assert not r["target"]["model_listed"]
'
# Requests over the echo engine's context (4096) are refused by the server: failed, with its message.
expect_rc 3 "$BIN" bench --base-url "$BASE" --model tandem --api-key "$KEY" --workloads long-prompt \
  --concurrency 2 --repeats 1 --warmup 0 --long-prompt-words 2000 --output "$OUT/too-long.json"
check_report "$OUT/too-long.json" "$OUT/too-long.svg" '
assert t["failed"] == 2, t
rec = r["runs"][0]["request_records"][0]
assert rec["http_status"] == 400 and rec["error"].startswith("HTTP 400"), rec
'
expect_rc 1 "$BIN" bench --base-url "$BASE" --model tandem --api-key wrong --workloads count --output "$OUT/x.json"
grep -q "refused the API key" "$OUT/last.log" || fail "wrong key message: $(cat "$OUT/last.log")"
expect_rc 2 "$BIN" bench --base-url "$BASE" --model tandem --workloads nope
expect_rc 2 "$BIN" bench --base-url "$BASE" --model tandem --concurrency 0
expect_rc 2 "$BIN" bench --model tandem
kill -TERM "$PID"; wait "$PID" || fail "echo server exit code $?"; PID=""
expect_rc 1 "$BIN" bench --base-url "$BASE" --model tandem --workloads count --output "$OUT/x.json"
grep -q "is the server running" "$OUT/last.log" || fail "unreachable message: $(cat "$OUT/last.log")"
[[ ! -e "$OUT/x.json" ]] || fail "a report was written for an unreachable server"

# ---- 3. built-in model, DSpark ----
bash tools/builtin-model.sh "$BIN" "$MODEL" >/dev/null
# verify_mode fixed: drafts on every step (auto may decide not to on a loaded machine, and profiles
# its costs at start-up for minutes there), so the acceptance counters must move.
"$BIN" serve --model "$MODEL" --served-model-name builtin --host 127.0.0.1 --port 0 \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5,"verify_mode":"fixed"}' >"$OUT/serve.log" 2>&1 &
PID=$!
wait_for_port bench-e2e "$OUT/serve.log" "$PID" 300
BASE="http://127.0.0.1:$PORT"
expect_rc 0 "$BIN" bench --base-url "$BASE" --model builtin --workloads count,prose,long-prompt --concurrency 1,2 \
  --repeats 1 --max-tokens 48 --long-prompt-words 200 --stagger-ms 20 --output "$OUT/builtin.json"
check_report "$OUT/builtin.json" "$OUT/builtin.svg" '
assert t["failed"] == 0 and t["inconsistent_token_counts"] == 0 and t["counter_mismatches"] == 0, t
count = [run for run in r["runs"] if run["workload"] == "count"]
# greedy counting on the trained model: 1, 2, 3, ... cut by max_tokens
assert all(run["output_checks"].get("truncated", 0) == run["succeeded"] for run in count), [c["output_checks"] for c in count]
for run in r["runs"]:
    srv = run["server"]
    assert srv["generation_tokens"] == run["completion_tokens"] > 0
    assert srv["prompt_tokens"] >= run["prompt_tokens"] - run["cached_prompt_tokens"]
assert any(run["server"].get("spec_draft_tokens", 0) > 0 for run in count)
assert all(0 <= run["server"]["acceptance_rate"] <= 1 for run in count)
# DSpark puts several accepted tokens in one chunk
assert any(run["tokens_per_chunk"] > 1 for run in count)
'
kill -TERM "$PID"; wait "$PID" || fail "builtin server exit code $?"; PID=""
trap - EXIT
rm -rf "$OUT"
echo "bench-e2e: PASSED"
