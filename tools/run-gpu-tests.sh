#!/usr/bin/env bash
# `make test-gpu`: on a machine with an NVIDIA GPU, runs the CUDA test binary as one process (tests/cuda: every
# kernel against its CPU reference, the CUDA model against the CPU oracle, golden cases through
# `tandem logits --device cuda`, speculative == plain greedy on the GPU, no allocation after
# start-up, tensor parallelism with the ranks sharing the GPU: the sharded model, the device
# collectives, TP=2/4 through CUDA; NCCL from LD_LIBRARY_PATH, TANDEM_NCCL_LIBRARY or a Python
# wheel, docs/OPERATIONS.md §9), the step benchmark on the built-in model, and a `tandem serve --device cuda` smoke
# test; writes bench/results/gpu-tests-<date>-<gpu>.json and bench/results/bench-model-<date>-<gpu>.json
# (TANDEM_FULLSIZE=1: also one rank of TP=2 of the full-size model with synthetic weights).
# Usage: tools/run-gpu-tests.sh [BUILD_DIR] [RESULTS_DIR]
set -uo pipefail
BUILD=${1:-build}
RESULTS=${2:-bench/results}
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test-gpu: no NVIDIA GPU visible on this machine; run it on a GPU host" >&2
  exit 2
fi
if [[ ! -x "$BUILD/test_cuda" ]]; then
  echo "test-gpu: $BUILD/test_cuda is missing (build with the CUDA toolkit installed: make build)" >&2
  exit 2
fi
mkdir -p "$RESULTS"
date=$(date -u +%Y-%m-%d)
commit=${TANDEM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
tag=$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-' | tr 'A-Z' 'a-z' | sed 's/-*$//; s/^nvidia-//')
log=$(mktemp /tmp/tandem-gpu-tests.XXXXXX.log)
rc=0

echo "== test_cuda on $gpu (driver $driver, commit $commit)"
# The whole binary as ONE process (as a user runs it): state one suite leaves behind (a stream, a
# graph, device memory) must not break the next. gtest's own JSON keeps the per-suite report.
mkdir -p "$RESULTS/.gtest"
gjson="$RESULTS/.gtest/test_cuda.json"
rm -f "$gjson"
timeout 2400 "$BUILD/test_cuda" --gtest_output="json:$gjson" 2>&1 | tee -a "$log"
code=${PIPESTATUS[0]}
if [[ $code -ne 0 ]]; then
  rc=1
  echo "test_cuda exited with $code"
  # A crash (abort, device fault) leaves no JSON: record it as one failed case.
  [[ -f "$gjson" ]] || echo "{\"testsuites\":[{\"name\":\"test_cuda\",\"testsuite\":[{\"name\":\"(crashed: exit $code)\",\"failures\":[1]}]}]}" > "$gjson"
fi
# On a GPU machine nothing may be skipped: a run that executed no GPU test, or skipped one (no GPU
# visible to the binary, no kernels for this GPU, a missing file), fails and says why.
python3 - "$gjson" "$log" <<'PY' || rc=1
import json, sys
gjson, log = sys.argv[1:]
cases = [c for s in json.load(open(gjson)).get("testsuites", []) for c in s.get("testsuite", [])]
ran = [c for c in cases if c.get("result") != "SKIPPED" and c.get("status", "RUN") == "RUN"]
skipped = [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"]
# gtest prints "file:line: Skipped", the reason, then "[  SKIPPED ] Suite.Test".
why, cur, reasons = {}, None, []
for line in open(log, errors="replace"):
    line = line.rstrip("\n")
    if line.endswith(": Skipped"):
        cur, reasons = True, []
    elif line.startswith("[  SKIPPED ] ") and cur:
        why[line.split()[3]] = " ".join(reasons) or "(no reason given)"
        cur = None
    elif cur and line.strip():
        reasons.append(line.strip())
bad = False
if not ran:
    print("test-gpu FAILED: test_cuda executed no test on this GPU machine")
    bad = True
for name in skipped:
    print(f"test-gpu FAILED: {name} was skipped: {why.get(name, '(reason not in the log)')}")
    bad = True
sys.exit(1 if bad else 0)
PY

echo "== bench-model on the built-in model"
bench="$RESULTS/bench-model-$date-$tag.json"
TANDEM_COMMIT=$commit "$BUILD/tandem" bench-model --model data/builtin --batches 1,2,4,8 --reps 50 --context 200 \
  --long-contexts 4096 --prefill 8192 --ttft none --out "$bench" || rc=1
if [[ -n "${TANDEM_FULLSIZE:-}" ]]; then
  # One rank of TP=2 of the real model on one GPU (synthetic weights; about 3-4 minutes).
  echo "== bench-model: synthetic deepseek-v4-flash-0731, rank 0 of TP=2"
  TANDEM_COMMIT=$commit "$BUILD/tandem" bench-model --synthetic deepseek-v4-flash-0731 --tensor-parallel-size 2 \
    --rank 0 --out "$RESULTS/bench-model-0731-tp2r0-$date-$tag.json" || rc=1
fi

echo "== tandem serve --device cuda smoke test"
port=${GPU_SMOKE_PORT:-18777}
"$BUILD/tandem" serve --model data/builtin --device cuda --served-model-name builtin --port "$port" \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5}' > /tmp/tandem-gpu-serve.log 2>&1 &
spid=$!
smoke=fail
for _ in $(seq 1 120); do
  if python3 - "$port" <<'PY' 2>/dev/null; then smoke=pass; break; fi
import json, sys, urllib.request
port = sys.argv[1]
urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
body = {"model": "builtin", "messages": [{"role": "user", "content": "Count from 1 to 20."}],
        "temperature": 0, "max_tokens": 64}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
r = json.loads(urllib.request.urlopen(req, timeout=60).read())
text = r["choices"][0]["message"]["content"]
print("serve --device cuda answered:", text[:120].replace("\n", " "))
assert "1, 2, 3" in text, text
PY
  sleep 1
done
kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
grep -m3 -i "cuda\|device" /tmp/tandem-gpu-serve.log || true
[[ $smoke == pass ]] || { rc=1; echo "serve smoke test FAILED"; tail -20 /tmp/tandem-gpu-serve.log; }

echo "== serving benchmark: tandem bench against tandem serve --device cuda (built-in model, DSpark on and off)"
serving="$RESULTS/serving-builtin-$date-$tag.json"
sdir=$(mktemp -d /tmp/tandem-gpu-serving.XXXXXX)
if SERVING_BUILD="$BUILD" SERVING_PORT="$port" TANDEM_COMMIT="$commit" bash tools/gpu-stage-serving.sh "$sdir"; then
  cp "$sdir/serving-builtin.json" "$serving" && echo "wrote $serving"
else
  rc=1
fi

python3 - "$RESULTS/.gtest" "$RESULTS/gpu-tests-$date-$tag.json" "$date" "$commit" "$gpu" "$driver" "$smoke" "$log" <<'PY'
import glob, json, os, sys
src, dst, date, commit, gpu, driver, smoke, log = sys.argv[1:]
suites = []
for f in sorted(glob.glob(os.path.join(src, "*.json"))):
    try:
        suites += json.load(open(f)).get("testsuites", [])
    except Exception:
        pass
cases = []
for s in suites:
    for c in s.get("testsuite", []):
        cases.append({"name": s["name"] + "." + c["name"], "status": "fail" if c.get("failures") else
                      ("skipped" if c.get("result") == "SKIPPED" else "pass"), "time": c.get("time")})
lines = [l.strip() for l in open(log, errors="replace") if l.startswith(("[cuda", "[sample_rows]"))]
json.dump({"date": date, "commit": commit, "gpu": gpu, "driver": driver,
           "tests": len(cases), "passed": sum(c["status"] == "pass" for c in cases),
           "failed": sum(c["status"] == "fail" for c in cases),
           "skipped": sum(c["status"] == "skipped" for c in cases),
           "serve_smoke": smoke, "cases": cases, "measurements": lines}, open(dst, "w"), indent=2)
print("wrote", dst)
PY
rm -rf "$RESULTS/.gtest"
exit $rc
