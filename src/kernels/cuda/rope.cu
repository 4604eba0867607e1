// Interleaved RoPE on the tail dims of every head, one thread per (token, head, pair). The rotation
// is computed with separately rounded products (no FMA), as the CPU op; cos/sin come from the
// double-precision sincos rounded to float (the correctly rounded values, as the CPU's cosf/sinf):
// row::rope_pair (row_math.cuh).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"

namespace tandem::kernels::cuda {
namespace {

__global__ void rope_kernel(RopeParams p, int64_t head_stride, int64_t token_stride) {
  pdl_enter();
  const int half = p.rope_dim / 2;
  const int64_t per_token = p.heads * half;
  const int64_t total = p.tokens * per_token;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t t = g / per_token, rem = g % per_token, h = rem / half;
    const int i = static_cast<int>(rem % half);
    row::rope_pair(p.x + t * token_stride + h * head_stride + p.rope_offset + 2 * i, p.positions[t], p.inv_freq[i],
                   p.inverse, p.round_bf16);
  }
}

}  // namespace

void rope(const RopeParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  const int64_t head_stride = p.head_stride > 0 ? p.head_stride : p.rope_offset + p.rope_dim;
  const int64_t token_stride = p.token_stride > 0 ? p.token_stride : p.heads * head_stride;
  launch_pdl(rope_kernel, grid_for(p.tokens * p.heads * (p.rope_dim / 2), 256), 256, 0, s, p, head_stride,
             token_stride);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
