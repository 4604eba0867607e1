// mHC hc_post: one thread per (token, channel) computes that channel of every output stream,
// reading all residual streams first, so out may alias res. Same operation order as the CPU op
// (no FMA), so the result is bit-exact.
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxHc = 16;

__global__ void hc_post_kernel(HcPostParams p) {
  pdl_enter();
  const int hc = p.hc;
  const int64_t D = p.dim, total = p.tokens * D;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t t = g / D, d = g % D;
    const float* res = p.res + t * hc * D + d;
    const float* post = p.post + t * hc;
    const float* C = p.comb + t * hc * hc;
    float* out = p.out + t * hc * D + d;
    const float f = p.f[t * D + d];
    float r[kMaxHc];
#pragma unroll
    for (int j = 0; j < kMaxHc; ++j) r[j] = j < hc ? res[j * D] : 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxHc; ++k) {
      if (k >= hc) break;
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j)
        if (j < hc) s = add_rn(s, mul_rn(C[j * hc + k], r[j]));
      const float v = add_rn(mul_rn(post[k], f), s);
      out[k * D] = p.round_bf16 ? round_bf16(v) : v;
    }
  }
}

}  // namespace

void hc_post(const HcPostParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK(p.hc <= kMaxHc);
  launch_pdl(hc_post_kernel, grid_for(p.tokens * p.dim, 256), 256, 0, s, p);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
