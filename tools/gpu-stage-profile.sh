#!/usr/bin/env bash
# Stage of tools/gpu-session.sh: Nsight Compute on the decode kernels that dominate the full-size
# step (issue 23): the decode MoE's three kernels and the decode GEMV, from bench-kernels' MoE and
# linear sections (--only), with the sections that say where a kernel's time goes (speed of light,
# memory, occupancy, warp stalls, the most-stalled instructions). Clocks are left alone
# (--clock-control none). Text reports under $1. PROFILE_RUNS overrides the list of runs: entries
# "name:sections-of-bench-kernels:kernel-regex:launches[:skipped launches]" separated by spaces;
# PROFILE_SOURCE=1 also keeps the reports and exports each kernel's SASS with stall samples; PROFILE_GRAPHS=graph
# leaves the kernels inside CUDA graphs out (only the benchmarks' eager warm-up launches match).
# The sections "gemm" profile bench-gemm instead (PROFILE_GEMM_ARGS, default 4,096 rows and 4,096
# routed tokens, 2 repetitions), e.g. the grouped expert GEMM: "experts:gemm:moe_ws_kernel:1:1".
set -uo pipefail
OUT=$1
cd "$(dirname "$0")/.."
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -z $ncu ]]; then echo "no ncu on this machine"; exit 1; fi
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
          --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis
          --section SourceCounters --section InstructionStats)
run() {  # name only regex count [skip]
  local rep=()
  [[ ${PROFILE_SOURCE:-0} == 1 ]] && rep=(--export "$OUT/profile-$1" --force-overwrite)
  local cmd=(build-cuda/tandem bench-kernels --only "$2")
  # shellcheck disable=SC2206
  [[ $2 == gemm ]] && cmd=(build-cuda/tandem bench-gemm ${PROFILE_GEMM_ARGS:---tokens 4096 --expert-tokens 4096 --reps 2})
  timeout 240 "$ncu" --clock-control none --target-processes all --graph-profiling "${PROFILE_GRAPHS:-node}" --kernel-name "regex:$3" \
    --launch-skip "${5:-0}" --launch-count "$4" "${rep[@]}" \
    "${sections[@]}" "${cmd[@]}" --out "$OUT/profile-$1.json" \
    > "$OUT/profile-$1.txt" 2>&1
  echo "ncu $1 rc=$?"
  if [[ ${PROFILE_SOURCE:-0} == 1 && -f $OUT/profile-$1.ncu-rep ]]; then
    # Per-instruction SASS with its stall samples and executed counts (no -lineinfo needed).
    "$ncu" --import "$OUT/profile-$1.ncu-rep" --page source --csv --print-source sass > "$OUT/profile-$1-sass.csv" 2>&1
    echo "sass page $1 rc=$? ($(wc -l < "$OUT/profile-$1-sass.csv") lines)"
  fi
  grep -E '^  [a-z_].*\(|Duration|Grid Size|Block Size|Shared Memory Configuration Size|Dynamic Shared|Waves Per SM|Theoretical Occupancy|Block Limit|Uncoalesced|Warp Stall Sampling|stalls|Instructions Executed  |DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issued Ipc|L2 Hit|L1/TEX Hit' \
    "$OUT/profile-$1.txt" | head -n "${PROFILE_LINES:-160}"
}
for r in ${PROFILE_RUNS:-moe:moe:gate_route_kernel|expert_kernel:6 gemv:linear:decode_gemm_kernel:2}; do
  IFS=: read -r name only regex count skip <<< "$r"
  run "$name" "$only" "$regex" "$count" "${skip:-0}"
done
