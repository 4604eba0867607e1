#!/usr/bin/env bash
# Stage of tools/gpu-session.sh: Nsight Compute on the decode kernels that dominate the full-size
# step (issue 23): the decode MoE's three kernels and the decode GEMV, from bench-kernels' MoE and
# linear sections (--only), with the sections that say where a kernel's time goes (speed of light,
# memory, occupancy, warp stalls). Clocks are left alone (--clock-control none). Text reports
# under $1; PROFILE_KERNELS (a regex) and PROFILE_ONLY (bench-kernels sections) override.
set -uo pipefail
OUT=$1
cd "$(dirname "$0")/.."
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [[ -z $ncu ]]; then echo "no ncu on this machine"; exit 1; fi
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
          --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis)
run() {  # name only regex count
  timeout 240 "$ncu" --clock-control none --target-processes all --kernel-name "regex:$3" --launch-count "$4" \
    "${sections[@]}" build-cuda/tandem bench-kernels --only "$2" --out "$OUT/profile-$1.json" \
    > "$OUT/profile-$1.txt" 2>&1
  echo "ncu $1 rc=$?"
  grep -E '^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issued Ipc|L2 Hit|L1/TEX Hit' \
    "$OUT/profile-$1.txt" | head -n 120
}
run moe "${PROFILE_ONLY:-moe}" "${PROFILE_KERNELS:-gate_route_kernel|expert_kernel}" 6
run gemv linear "decode_gemm_kernel" 2
