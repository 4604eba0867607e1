// RMSNorm, one CTA per row. kF32: the sum of squares in fp64 (as the CPU op), so the fp32 scale is
// the CPU's in all but pathological cases. kBf16Chain: the reference's bf16 chain sums the rounded
// squares sequentially in fp32, an order-dependent sum, so one thread walks the row in index order
// (rows are one head, 512 wide; all threads stage the rounded squares in shared memory first) and
// the result is bit-exact with the CPU op. The row body is row::rms_norm_row (row_math.cuh).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = row::kNormThreads;

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p, int64_t ldx, int64_t ldy) {
  pdl_enter();
  __shared__ row::NormSmem sm;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x)
    row::rms_norm_row(p.x + r * ldx, p.y + r * ldy, p.dim, p.weight, p.weight_bf16, p.eps, p.mode, p.round_bf16, sm);
}

}  // namespace

void rms_norm(const RmsNormParams& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0) return;
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.dim, ldy = p.ldy > 0 ? p.ldy : p.dim;
  launch_pdl(rms_norm_kernel, grid_for(p.rows, 1), kThreads, 0, s, p, ldx, ldy);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
