// The generic CUDA ops' dynamic shared memory bounds (smem_bounds.h): one entry per op file whose
// launcher passes dynamic shared memory, each computed next to its launcher.
#include "kernels/cuda/smem_bounds.h"

namespace tandem::kernels::cuda {

std::vector<SmemBound> dynamic_smem_bounds() { return {sparse_attn_smem_bound(), hadamard_smem_bound()}; }

}  // namespace tandem::kernels::cuda
