#!/usr/bin/env bash
# Stage of tools/gpu-session.sh for the prefill tensor-core GEMMs (issue 24): their op tests in a
# process of their own (a kernel that traps cannot take the rest of test_cuda with it), the SASS of
# the sm_90 warp-specialized kernels (wgmma, TMA and setmaxnreg present, no local memory), then
# bench-gemm. Logs under $1.
set -uo pipefail
OUT=$1
cd "$(dirname "$0")/.."
filter='CudaFp8Quant.*:CudaFp8GemmTc.*:CudaBf16GemmTc.*:CudaMoePrefill.*:MoePrefillFit.*:CudaLtGemm.*'
timeout 300 build-cuda/test_cuda --gtest_filter="$filter" --gtest_output="json:$OUT/prefill-tests.json" \
  > "$OUT/prefill-tests.log" 2>&1
echo "prefill op tests rc=$?"
grep -E '^\[  FAILED  \]|^\[  PASSED  \]|\[fp8-tc\]|\[bf16-tc\]|\[moe-prefill\]|\[lt\]' "$OUT/prefill-tests.log" | tail -n 60
dump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
if [[ -x $dump ]]; then
  "$dump" -sass build-cuda/tandem > "$OUT/tandem.sass" 2>&1
  # Per warp-specialized kernel: tensor-core, TMA, register-reallocation and local-memory instructions.
  awk '/Function :/ { name = $3 }
       name ~ /ws_dense_kernel|moe_ws_kernel/ {
         for (i = 1; i <= NF; ++i) {
           op = $i; sub(/\..*/, "", op)
           if (op ~ /^(QGMMA|HGMMA|UTMALDG|USETMAXREG|SYNCS|LDL|STL)$/) n[name " " op]++
         }
       }
       END { for (k in n) print k, n[k] }' "$OUT/tandem.sass" | sort
else
  echo "no cuobjdump on this machine: SASS not checked"
fi
timeout 240 build-cuda/tandem bench-gemm --out "$OUT/bench-gemm.json" > "$OUT/bench-gemm.log" 2>&1
echo "bench-gemm rc=$?"
tail -n 80 "$OUT/bench-gemm.log"
