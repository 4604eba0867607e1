// Row softmax / log-softmax with temperature, one CTA per row: max, then the fp64 sum of
// exp(y - max) (as the CPU op), then the output. Reads x again for every pass, so y may equal x.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 1024;

__global__ void __launch_bounds__(kThreads) softmax_kernel(SoftmaxParams p, int64_t ldx, int64_t ldy) {
  pdl_enter();
  __shared__ float redf[32];
  __shared__ double redd[32];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.x + r * ldx;
    float* y = p.y + r * ldy;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
      const float v = div_rn(x[i], p.temperature);
      m = v > m ? v : m;  // NaN ignored, as the CPU loop
    }
    m = block_max(m, redf);
    double z = 0.0;
    for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) z += exp(static_cast<double>(sub_rn(div_rn(x[i], p.temperature), m)));
    z = block_sum(z, redd);  // all reads of x done before any write below
    if (p.log) {
      const float lz = static_cast<float>(log(z));
      for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) y[i] = sub_rn(sub_rn(div_rn(x[i], p.temperature), m), lz);
    } else {
      const float inv = static_cast<float>(1.0 / z);
      for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x) y[i] = mul_rn(expf(sub_rn(div_rn(x[i], p.temperature), m)), inv);
    }
    __syncthreads();
  }
}

}  // namespace

void softmax(const SoftmaxParams& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0) return;
  const int64_t ldx = p.ldx > 0 ? p.ldx : p.n, ldy = p.ldy > 0 ? p.ldy : p.n;
  launch_pdl(softmax_kernel, grid_for(p.rows, 1), kThreads, 0, s, p, ldx, ldy);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
