// Walsh-Hadamard transform, one CTA per row in shared memory: the same butterfly stages in the same
// order as the CPU op (each output of a stage is one a+b or a-b), so the result is bit-exact.
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/smem_bounds.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxN = 8192;  // 32 KiB of shared memory

size_t smem_bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }  // one row

__global__ void __launch_bounds__(kThreads) hadamard_kernel(HadamardParams p, int64_t ldx, float scale) {
  pdl_enter();
  extern __shared__ float v[];
  const int n = static_cast<int>(p.n);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    row::hadamard_row(p.x + r * ldx, n, scale, p.round_bf16, v);  // ends with a barrier: v reused by the next row
  }
}

}  // namespace

void hadamard(const HadamardParams& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0) return;
  TANDEM_CHECK_MSG(p.n <= kMaxN, "hadamard: n <= 8192");
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.n;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.n)));
  launch_pdl(hadamard_kernel, grid_for(p.rows, 1), kThreads, smem_bytes(p.n), s, p, ldx, scale);
  TANDEM_CUDA_LAUNCH_CHECK();
}

SmemBound hadamard_smem_bound() {
  return {"hadamard_kernel", static_cast<int64_t>(smem_bytes(kMaxN)), "n 8192 (the launcher's limit)", ""};
}

}  // namespace tandem::kernels::cuda
