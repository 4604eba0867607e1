// Row argmax, one CTA per row: every thread keeps the best (score, index) key of its elements in the
// selection order of device.cuh (NaN first, then larger, then lower index), a block max finishes.
// Equals the CPU's "first maximum, first NaN wins".
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads) argmax_kernel(ArgmaxParams p, int64_t ldx) {
  __shared__ uint64_t red[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.x + r * ldx;
    uint64_t best = 0;
    for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
      const uint64_t k = select_key(x[i], static_cast<uint32_t>(i));
      best = k > best ? k : best;
    }
    best = warp_max_u64(best);
    if (lane == 0) red[wid] = best;
    __syncthreads();
    if (wid == 0) {
      uint64_t v = lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : 0;
      v = warp_max_u64(v);
      if (lane == 0) {
        const uint32_t idx = select_key_index(v);
        p.out[r] = static_cast<int32_t>(idx);
        if (p.max_value) p.max_value[r] = x[idx];
      }
    }
    __syncthreads();
  }
}

}  // namespace

void argmax(const ArgmaxParams& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0) return;
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.n;
  argmax_kernel<<<grid_for(p.rows, 1), kThreads, 0, s>>>(p, ldx);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
