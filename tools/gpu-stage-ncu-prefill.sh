#!/usr/bin/env bash
# Stage of tools/gpu-session.sh (development aid for the lent GPU machine): Nsight Compute on the
# big kernels of one full-size prefill chunk (rank 0 of TP=2 of deepseek-v4-flash-0731, synthetic
# weights). The name filter holds prefill-only instantiations (the decode steps that bench-model
# runs first launch none of them): the attention's folding blocks, the FP8/bf16 warp-specialized
# GEMMs, the grouped experts, the staged mHC mix and the one-CTA-per-token finish. NCU_SKIP matches
# are skipped (default 30: layers 0 and 1, the sliding-window ones), then NCU_COUNT are profiled.
# Writes $1/prefill.ncu-rep, its details page and per-SASS-line stall samples (CSV).
set -uo pipefail
OUT=$1
cd "$(dirname "$0")/.."
ncu --clock-control none \
  --kernel-name "regex:mqa_kernelILi512ELb0|ws_dense_kernel|moe_ws_kernel|mix_staged_kernel|hc_pre_finishILb1" \
  --launch-skip "${NCU_SKIP:-30}" --launch-count "${NCU_COUNT:-16}" \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
  --import-source yes -o "$OUT/prefill" \
  build-cuda/tandem bench-model --synthetic deepseek-v4-flash-0731 --tensor-parallel-size 2 --rank 0 \
  --batches 1 --long-contexts 4096 --prefill 8192 --prefill-samples 2 --ttft none --reps 3 \
  --shape-seconds 0.2 --max-seconds 200 --cupti /nonexistent --out "$OUT/bench-model-ncu.json" \
  > "$OUT/ncu-run.log" 2>&1
echo "ncu rc=$?"
tail -n 5 "$OUT/ncu-run.log"
ncu -i "$OUT/prefill.ncu-rep" --page details > "$OUT/prefill-details.txt" 2>&1
ncu -i "$OUT/prefill.ncu-rep" --page source --csv --print-source sass > "$OUT/prefill-sass.csv" 2>&1
grep -E '^  [a-zA-Z_].*\(|Duration|Issued Ipc Active|Achieved Occupancy' "$OUT/prefill-details.txt" | head -n 80
