// The generic CUDA ops' dynamic shared memory bounds (smem_bounds.h): one entry per op file whose
// launcher passes dynamic shared memory, each computed next to its launcher.
#include "kernels/cuda/smem_bounds.h"

namespace tandem::kernels::cuda {

std::vector<SmemBound> dynamic_smem_bounds() {
  std::vector<SmemBound> out = {sparse_attn_smem_bound(), hadamard_smem_bound(), sample_rows_smem_bound()};
  for (auto* more : {decode_gemm_smem_bounds, gemm_tc_smem_bounds, gemm_ws_smem_bounds, hc_smem_bounds})
    for (auto& b : more()) out.push_back(std::move(b));
  return out;
}

}  // namespace tandem::kernels::cuda
