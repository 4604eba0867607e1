#!/usr/bin/env bash
# Tensor parallelism on GPUs, tested on ONE GPU (ranks share it: --tp-share-gpus; NCCL over
# loopback, the peer path through CUDA IPC) or on several. Runs:
#  1. test_cuda's DeviceComm* suites (every collective path against host sums, eager and in graphs,
#     TP=2 and TP=4 rank processes; killed / stopped / absent peers) and TpCuda* (TP=2/4 vs TP=1
#     through CUDA, speculative greedy, logits across runs and ranks, lost and mismatched ranks);
#  2. `tandem serve --device cuda --tensor-parallel-size 2` on a tiny checkpoint: a chat request,
#     the audit's collectives, then a killed and a stopped worker: /health 503 and the in-flight
#     request failed within 5 s, serve exiting non-zero;
# and writes bench/results/gpu-tp-tests-<date>-<gpu>.json. (`make test-gpu` runs the same suites
# inside its one test_cuda process; this script runs them alone, with the serve checks.)
# Usage: tools/gpu-tp-tests.sh [BUILD_DIR] [RESULTS_DIR]   (NCCL: LD_LIBRARY_PATH or TANDEM_NCCL_LIBRARY)
set -uo pipefail
BUILD=${1:-build}
RESULTS=${2:-bench/results}
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-tp-tests: no NVIDIA GPU visible on this machine" >&2
  exit 2
fi
for b in tandem test_cuda; do
  [[ -x "$BUILD/$b" ]] || { echo "gpu-tp-tests: $BUILD/$b is missing" >&2; exit 2; }
done
export NCCL_NVLS_ENABLE=0
mkdir -p "$RESULTS"
date=$(date -u +%Y-%m-%d)
commit=${TANDEM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
ngpu=$(nvidia-smi -L | wc -l)
tag=$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-' | tr 'A-Z' 'a-z' | sed 's/-*$//; s/^nvidia-//')
work=$(mktemp -d /tmp/tandem-gpu-tp.XXXXXX)
log=$work/log
rc=0

echo "== test_cuda: DeviceComm* and TpCuda* on $ngpu x $gpu (commit $commit)"
for s in DeviceComm DeviceCommTp DeviceCommFailure TpCuda; do
  timeout 1500 "$BUILD/test_cuda" --gtest_filter="$s.*" --gtest_output="json:$work/gtest-$s.json" 2>&1 | tee -a "$log"
  code=${PIPESTATUS[0]}
  if [[ $code -ne 0 ]]; then
    rc=1
    [[ -f "$work/gtest-$s.json" ]] || echo "{\"testsuites\":[{\"name\":\"$s\",\"testsuite\":[{\"name\":\"(crashed: exit $code)\",\"failures\":[1]}]}]}" > "$work/gtest-$s.json"
  fi
done

echo "== tandem serve --device cuda --tensor-parallel-size 2 (tiny tp8 checkpoint)"
model=$work/tp8
"$BUILD/tandem" make-tiny "$model" --preset tp8 --seed 3 > /dev/null
port=${GPU_TP_PORT:-18990}
serve_json=$work/serve.json
echo '{}' > "$serve_json"
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
health() { curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$port/health" 2>/dev/null; }
start_serve() {  # $1: log file
  "$BUILD/tandem" serve --model "$model" --served-model-name tiny --device cuda --tensor-parallel-size 2 --tp-share-gpus \
    --port "$port" --master-port $((port + 2)) --max-num-seqs 2 --kv-cache-memory 64M > "$1" 2>&1 &
  spid=$!
  for _ in $(seq 1 240); do
    [[ "$(health)" == 200 ]] && return 0
    kill -0 "$spid" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
# One lost-worker round: $1 = KILL or STOP. Records seconds to 503, the in-flight request's
# outcome and serve's exit code into $serve_json.
lose_worker() {
  local sig=$1 slog=$work/serve-$1.log
  if ! start_serve "$slog"; then
    kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
    echo "serve did not start"; tail -20 "$slog"; rc=1; return 0
  fi
  local worker
  worker=$(pgrep -P "$spid" | head -1)
  # A long streamed request in flight while the worker is lost.
  curl -s -N --max-time 30 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","stream":true,"max_tokens":2000,"temperature":0,"messages":[{"role":"user","content":"go"}]}' \
    > "$work/inflight-$sig.txt" 2>&1 &
  local cpid=$!
  sleep 1
  local t0 t503=-1000
  t0=$(now_ms)
  kill -"$sig" "$worker"
  for _ in $(seq 1 200); do
    if [[ "$(health)" == 503 ]]; then t503=$(( $(now_ms) - t0 )); break; fi
    sleep 0.05
  done
  wait "$cpid"
  local tdone=$(( $(now_ms) - t0 ))
  local code=0
  for _ in $(seq 1 300); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$spid" 2>/dev/null; then code=hung; kill -9 "$spid"; fi
  wait "$spid" 2>/dev/null; [[ $code == hung ]] || code=$?
  [[ $sig == STOP ]] && kill -9 "$worker" 2>/dev/null
  local failed=no
  grep -q '"error"\|finish_reason":"error"' "$work/inflight-$sig.txt" && failed=yes
  echo "worker SIG$sig: /health 503 after ${t503} ms; in-flight request ended after ${tdone} ms (error event: $failed); serve exit $code"
  python3 - "$serve_json" "$sig" "$t503" "$tdone" "$failed" "$code" <<'PY'
import json, sys
p, sig, t503, tdone, failed, code = sys.argv[1:]
t503, tdone = float(t503) / 1000, float(tdone) / 1000
ok = 0 <= t503 <= 5 and tdone <= 5 and failed == "yes" and code not in ("0", "hung")
j = json.load(open(p)); j[sig] = {"seconds_to_503": t503, "inflight_ended_s": tdone, "inflight_error": failed == "yes",
                                  "serve_exit": code, "pass": ok}
json.dump(j, open(p, "w"))
sys.exit(0 if ok else 1)
PY
  [[ $? -eq 0 ]] || rc=1
}

# A healthy round first: one request and the audit's collectives.
if start_serve "$work/serve-ok.log"; then
  curl -s --max-time 60 "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","max_tokens":16,"temperature":0,"messages":[{"role":"user","content":"hello"}]}' > "$work/chat.json" \
    || rc=1
  grep -m5 "collectives\|\[comm\]" "$work/serve-ok.log"
  kill "$spid"; wait "$spid" 2>/dev/null
  "$BUILD/tandem" audit --model "$model" --device cuda --tensor-parallel-size 2 --tp-share-gpus --master-port $((port + 4)) \
    --kv-cache-memory 64M --output "$work/audit.json" > /dev/null 2>&1 || rc=1
else
  kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  echo "serve did not start"; tail -20 "$work/serve-ok.log"; rc=1
fi
lose_worker KILL
lose_worker STOP

python3 - "$work" "$RESULTS/gpu-tp-tests-$date-$tag.json" "$date" "$commit" "$gpu" "$ngpu" "$log" <<'PY'
import glob, json, os, sys
work, dst, date, commit, gpu, ngpu, log = sys.argv[1:]
cases = []
for f in sorted(glob.glob(os.path.join(work, "gtest-*.json"))):
    try:
        for s in json.load(open(f)).get("testsuites", []):
            for c in s.get("testsuite", []):
                cases.append({"name": s["name"] + "." + c["name"],
                              "status": "fail" if c.get("failures") else ("skipped" if c.get("result") == "SKIPPED" else "pass"),
                              "time": c.get("time")})
    except Exception as e:
        cases.append({"name": f, "status": "fail", "error": str(e)})
lines = [l.strip() for l in open(log, errors="replace") if l.startswith(("[cuda devcomm]", "[cuda tp]", "[devcomm]"))]
audit = None
if os.path.exists(os.path.join(work, "audit.json")):
    a = json.load(open(os.path.join(work, "audit.json")))
    audit = [{"rank": r.get("rank"), "all_reduce": r.get("kernels", {}).get("all_reduce"), "collectives": r.get("collectives")}
             for r in a.get("ranks", [])]
out = {"date": date, "commit": commit, "gpu": gpu, "gpus": int(ngpu),
       "what": "tensor parallelism on GPUs: device collectives (NCCL, symmetric window, peer one-shot) against host sums, "
               "TP=2/4 vs TP=1 through CUDA, lost and mismatched ranks; serve with TP=2 and a lost worker",
       "tests": len(cases), "passed": sum(c["status"] == "pass" for c in cases),
       "failed": sum(c["status"] == "fail" for c in cases), "skipped": sum(c["status"] == "skipped" for c in cases),
       "cases": cases, "measurements": lines, "serve_lost_worker": json.load(open(os.path.join(work, "serve.json"))),
       "audit_collectives": audit}
json.dump(out, open(dst, "w"), indent=1)
print(f"wrote {dst}: {out['passed']} passed, {out['failed']} failed, {out['skipped']} skipped")
PY
rm -rf "$work"
exit $rc
