#!/usr/bin/env bash
# Runs the whole test suite: the gtest binaries (through ctest; with CUDA, test_cuda_limits checks
# the compiled sm_120/sm_121 kernels), then each libFuzzer target for a bounded time, the
# end-to-end and operations smokes and the aarch64 smoke. Prints one closing line "N passed, N failed".
set -uo pipefail
BUILD=${1:-build}
FUZZ_BUILD=${2:-build-fuzz}
FUZZ_SECONDS=${3:-30}
cd "$(dirname "$0")/.."

passed=0; failed=0
(cd "$BUILD" && ctest --output-on-failure -j1)
ctest_rc=$?

# Count gtest cases from the ctest logs for the closing line.
log="$BUILD/Testing/Temporary/LastTest.log"
if [[ -f "$log" ]]; then
  p=$(grep -c '^\[       OK \]' "$log" || true)
  f=$(grep -c '^\[  FAILED  \].*(' "$log" || true)
  passed=$((passed + p)); failed=$((failed + f))
fi
if [[ $ctest_rc -ne 0 && $failed -eq 0 ]]; then failed=1; fi

# libFuzzer targets: clang build with ASan/UBSan, each run for a bounded time.
if ls fuzz/*.cpp >/dev/null 2>&1 && command -v clang++ >/dev/null; then
  if [[ ! -f "$FUZZ_BUILD/build.ninja" ]]; then
    CC=clang CXX=clang++ cmake -S . -B "$FUZZ_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTANDEM_FUZZ=ON >/dev/null
  fi
  targets=()
  for f in fuzz/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
  if cmake --build "$FUZZ_BUILD" -j "$(nproc)" --target "${targets[@]}"; then
    for t in "${targets[@]}"; do
      corpus="fuzz/corpus/$t"
      mkdir -p "$FUZZ_BUILD/corpus-$t"
      args=("$FUZZ_BUILD/corpus-$t")
      [[ -d "$corpus" ]] && args+=("$corpus")
      echo "fuzz: $t for ${FUZZ_SECONDS}s"
      if "$FUZZ_BUILD/$t" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=4096 -print_final_stats=1 \
          "${args[@]}" >"$FUZZ_BUILD/$t.log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$FUZZ_BUILD/$t.log" | grep -o '[0-9]*$' || echo "?")
        echo "fuzz: $t ok ($runs inputs in ${FUZZ_SECONDS}s, no crash)"
        passed=$((passed + 1))
      else
        echo "fuzz: $t FAILED"; tail -40 "$FUZZ_BUILD/$t.log"; failed=$((failed + 1))
      fi
    done
  else
    echo "fuzz: build FAILED"; failed=$((failed + 1))
  fi
fi

# End-to-end: the official openai Node SDK, raw sockets and a bounded 64-client load test against
# `tandem serve` (deterministic echo engine), then the real engine on the built-in model.
if command -v node >/dev/null && command -v npm >/dev/null; then
  e2e_log=$(mktemp /tmp/tandem-e2e-run.XXXXXX.log)
  if LOAD_SECONDS=${LOAD_SECONDS:-10} bash tools/e2e.sh echo: "$BUILD" 2>&1 | tee "$e2e_log"; then :; fi
  p=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$e2e_log" | tail -1); f=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$e2e_log" | tail -1)
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
  if grep -q '^e2e: PASSED' "$e2e_log"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
else
  echo "e2e: node/npm missing"; failed=$((failed + 1))
fi
if bash tools/smoke-builtin.sh "$BUILD"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
# `tandem bench` against `tandem serve` (echo engine and built-in model): report fields, SVG,
# failure accounting, clear errors for a refused key or an unreachable server.
if bash tools/bench-e2e.sh "$BUILD"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
# Operations smoke: audit, start-up refusals, tandem proof against tandem serve, SIGTERM drain, restart.
if bash tools/ops-smoke.sh "$BUILD"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
# aarch64 smoke: the CPU ops and their suite cross-compiled for aarch64 and run under qemu (the full
# emulated run is `make test-aarch64`; on an aarch64 host this is a no-op).
bash tools/aarch64/run.sh smoke "${AARCH64_BUILD:-build-aarch64}"
case $? in 0) passed=$((passed + 1)) ;; 77) ;; *) failed=$((failed + 1)) ;; esac

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
