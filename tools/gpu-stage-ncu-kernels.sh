#!/usr/bin/env bash
# Stage of tools/gpu-session.sh (development aid for the lent GPU machine): Nsight Compute on the
# launches of `tandem bench-kernels --only $NCU_ONLY` whose names match $NCU_REGEX (graph nodes
# profiled one by one; caches and clocks left as the graph replays leave them). NCU_SKIP matches are
# skipped (the eager warm-up calls), then NCU_COUNT are profiled; NCU_EXTRA adds ncu flags. Writes $1/kernels.ncu-rep, its
# details page and per-SASS-line stall samples (CSV).
set -uo pipefail
OUT=$1
cd "$(dirname "$0")/.."
ncu --clock-control none --cache-control none --kernel-name "regex:${NCU_REGEX:?}" \
  --launch-skip "${NCU_SKIP:-10}" --launch-count "${NCU_COUNT:-4}" \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
  --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
  --import-source yes ${NCU_EXTRA:-} -o "$OUT/kernels" \
  build-cuda/tandem bench-kernels --only "${NCU_ONLY:?}" --out "$OUT/bench-kernels-ncu.json" > "$OUT/ncu-run.log" 2>&1
echo "ncu rc=$?"
tail -n 5 "$OUT/ncu-run.log"
ncu -i "$OUT/kernels.ncu-rep" --page details > "$OUT/kernels-details.txt" 2>&1
ncu -i "$OUT/kernels.ncu-rep" --page source --csv --print-source sass > "$OUT/kernels-sass.csv" 2>&1
grep -E '^  [a-zA-Z_].*\(|Duration|Issued Ipc Active|Achieved Occupancy' "$OUT/kernels-details.txt" | head -n 60
