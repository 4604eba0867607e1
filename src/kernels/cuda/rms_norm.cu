// RMSNorm, one CTA per row. kF32: the sum of squares in fp64 (as the CPU op), so the fp32 scale is
// the CPU's in all but pathological cases. kBf16Chain: the reference's bf16 chain sums the rounded
// squares sequentially in fp32, an order-dependent sum, so one thread walks the row in index order
// (rows are one head, 512 wide; all threads stage the rounded squares in shared memory first) and
// the result is bit-exact with the CPU op.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 2048;  // bf16 chain: squares staged per pass

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p, int64_t ldx, int64_t ldy) {
  pdl_enter();
  __shared__ double red[32];
  __shared__ float rs_shared;
  __shared__ float sq[kChunk];
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.x + r * ldx;
    float* y = p.y + r * ldy;
    float rs;
    if (p.mode == RmsNormMode::kBf16Chain) {
      // The rounded squares are staged in shared memory by all threads (coalesced), then summed
      // in index order by thread 0.
      float sum = 0.0f;
      for (int64_t c0 = 0; c0 < p.dim; c0 += kChunk) {
        const int64_t n = p.dim - c0 < kChunk ? p.dim - c0 : kChunk;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sq[i] = round_bf16(mul_rn(x[c0 + i], x[c0 + i]));
        __syncthreads();
        if (threadIdx.x == 0)
          for (int64_t i = 0; i < n; ++i) sum = add_rn(sum, sq[i]);
        __syncthreads();
      }
      if (threadIdx.x == 0) {
        const float mean = round_bf16(div_rn(sum, static_cast<float>(p.dim)));
        rs_shared = round_bf16(div_rn(1.0f, sqrtf(round_bf16(add_rn(mean, p.eps)))));
      }
      __syncthreads();
      rs = rs_shared;
      for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
        float v = round_bf16(mul_rn(x[i], rs));
        if (p.weight) v = round_bf16(mul_rn(p.weight[i], v));
        if (p.weight_bf16) v = round_bf16(mul_rn(num::bf16_to_f32(p.weight_bf16[i]), v));
        y[i] = v;
      }
    } else {
      double ss = 0.0;
      for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
      ss = block_sum(ss, red);  // contains __syncthreads: every x read is done before y is written
      const float var = static_cast<float>(ss / static_cast<double>(p.dim));
      rs = div_rn(1.0f, sqrtf(add_rn(var, p.eps)));
      for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
        float v = mul_rn(x[i], rs);
        if (p.weight) v = mul_rn(p.weight[i], v);
        if (p.weight_bf16) v = mul_rn(num::bf16_to_f32(p.weight_bf16[i]), v);
        y[i] = p.round_bf16 ? round_bf16(v) : v;
      }
    }
    __syncthreads();  // rs_shared / red reused by the next row
  }
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
