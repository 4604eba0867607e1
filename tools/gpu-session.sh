#!/usr/bin/env bash
# On the lent GPU machine (development aid for this project's workplace; users run `make test-gpu`):
# unpacks the build carried by tools/gpu-pack.sh and runs the stages named on the command line, each
# with its own time limit, writing logs and JSON under $OUT. Stages: tests (test_cuda as one process,
# optional gtest filter in TEST_FILTER; TEST_FIRST=<filter>: those tests first, then the rest), kernels (tandem bench-kernels, sections in KERNELS_ONLY), gemm (tandem bench-gemm),
# builtin (bench-model on the built-in model), fullsize (bench-model: rank 0 of TP=2 of
# deepseek-v4-flash-0731 with synthetic weights, alone on this GPU), tp (tools/gpu-tp-tests.sh:
# the device collectives and TP=2/4 through CUDA with the ranks sharing this GPU, serve with TP=2
# and a lost worker; FULLSIZE_ARGS adds bench-model flags, FULLSIZE_TAG names its JSON), and any stage script tools/gpu-stage-<name>.sh. Logs end up in
# $OUT/logs.tar.xz beside the JSON files.
# Usage: tools/gpu-session.sh STAGE...
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
mkdir -p /work && ln -sfn "$root" /work/main   # TANDEM_SOURCE_DIR / TANDEM_BINARY of the carried build
if [[ ! -x build-cuda/tandem ]]; then
  mkdir -p build-cuda && tar -C build-cuda -xJf .devcarry/gpu.tar.xz
  mv build-cuda/bin/* build-cuda/ && rmdir build-cuda/bin
fi
nccl=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$root/build-cuda/lib:/usr/local/cuda/lib64:${nccl:+$nccl:}${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TANDEM_COMMIT=${TANDEM_COMMIT:-$(cat .devcarry/commit 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
echo "nccl: ${nccl:-not found}" | tee -a "$OUT/gpu.txt"
summary=()
stage() {  # name limit_s command...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "===== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc $((SECONDS - t0))s")
  tail -n "${TAIL_LINES:-25}" "$OUT/$name.log"
}
for s in "$@"; do
  case $s in
    tests) if [[ -n ${TEST_FIRST:-} ]]; then  # the tests of the latest changes first, then every other one
             stage tests-first "${TESTS_FIRST_LIMIT:-240}" build-cuda/test_cuda --gtest_output="json:$OUT/test_cuda_first.json" \
               --gtest_filter="$TEST_FIRST"
             stage tests "${TESTS_LIMIT:-420}" build-cuda/test_cuda --gtest_output="json:$OUT/test_cuda.json" \
               --gtest_filter="*-$TEST_FIRST"
           else
             stage tests "${TESTS_LIMIT:-420}" build-cuda/test_cuda --gtest_output="json:$OUT/test_cuda.json" \
               ${TEST_FILTER:+--gtest_filter=$TEST_FILTER}
           fi ;;
    kernels) stage kernels 150 build-cuda/tandem bench-kernels --out "$OUT/bench-kernels.json" \
               ${KERNELS_ONLY:+--only=$KERNELS_ONLY} ;;
    gemm) stage gemm 150 build-cuda/tandem bench-gemm --out "$OUT/bench-gemm.json" ;;
    builtin) stage builtin 200 build-cuda/tandem bench-model --model data/builtin --batches 1,2,4,8 --reps 50 \
               --context 200 --long-contexts 4096 --prefill 8192 --ttft none --out "$OUT/bench-model-builtin.json" ;;
    fullsize) stage fullsize "${FULLSIZE_LIMIT:-450}" build-cuda/tandem bench-model --synthetic deepseek-v4-flash-0731 \
                --tensor-parallel-size 2 --rank 0 --max-seconds 240 --out "$OUT/bench-model-0731-tp2r0${FULLSIZE_TAG:-}.json" \
                ${FULLSIZE_ARGS:-} ;;
    tp) stage tp "${TP_LIMIT:-540}" tools/gpu-tp-tests.sh build-cuda "$OUT" ;;
    *) if [[ -x tools/gpu-stage-$s.sh ]]; then stage "$s" "${STAGE_LIMIT:-300}" tools/gpu-stage-$s.sh "$OUT"
       else summary+=("$s: no such stage"); fi ;;
  esac
done
if [[ -f "$OUT/test_cuda.json" ]]; then
  python3 - "$OUT/test_cuda.json" $([[ -f $OUT/test_cuda_first.json ]] && echo "$OUT/test_cuda_first.json") <<'PY'
import json, sys
cases = [(s["name"], c) for f in sys.argv[1:] for s in json.load(open(f)).get("testsuites", []) for c in s.get("testsuite", [])]
fails = [f"{s}.{c['name']}" for s, c in cases if c.get("failures")]
skips = [f"{s}.{c['name']}" for s, c in cases if c.get("result") == "SKIPPED"]
print(f"test_cuda: {len(cases)} cases, {len(fails)} failed, {len(skips)} skipped")
for f in fails: print("  FAILED", f)
for f in skips: print("  SKIPPED", f)
PY
fi
printf '%s\n' "${summary[@]}"
# The lent machine brings back only a few files of $OUT (eight, alphabetically): everything but the
# JSON results goes into one archive, logs.tar.xz (PACK_LOGS=0 keeps the files as they are).
# A second invocation in the same $OUT packs into logs-2.tar.xz, logs-3.tar.xz, ... (never over an
# earlier archive).
if [[ ${PACK_LOGS:-1} == 1 ]]; then
  list=$(mktemp)
  archive=logs.tar.xz
  for ((i = 2; ; ++i)); do [[ -e $OUT/$archive ]] || break; archive=logs-$i.tar.xz; done
  (cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name '*.json' ! -name 'logs*.tar.xz' -printf '%P\n' > "$list" &&
     if [[ -s $list ]]; then tar -cJf "$archive" -T "$list" && xargs -d '\n' rm -rf < "$list"; fi)
  rm -f "$list"
  ls "$OUT"
fi
