// mHC hc_post: one thread per (token, 4 channels) (float4; else per (token, channel)) computes those
// channels of every output stream, reading all residual streams first, so out may alias res. Same
// operation order as the CPU op (no FMA), so the result is bit-exact. f goes through the load
// epilogue (HcPostParams::f_add, f_round) with the arithmetic of the launches it replaces after a
// tensor-parallel all-reduce: round_bf16's bf16(f), moe_add_shared's bf16(f + shared).
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kMaxHc = 16;

// f as loaded, from f's value and f_add's (unused without f_add).
__device__ __forceinline__ float load_f(const HcPostParams& p, float f, float fa) {
  const float v = p.f_add ? add_rn(f, fa) : f;
  return p.f_round ? round_bf16(v) : v;
}

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
    const float f = load_f(p, p.f[t * D + d], p.f_add ? p.f_add[t * D + d] : 0.0f);
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

// Channel j of float4 v.
__device__ __forceinline__ float& lane4(float4& v, int j) {
  return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
}

// The same per channel as hc_post_kernel, four channels (one float4) per thread: blockIdx.x * 128 +
// threadIdx.x is the float4 column q < dim / 4, blockIdx.y the first token (grid-stride over
// tokens). kMax >= hc bounds the register arrays (4: the model's hc).
template <int kMax>
__global__ void __launch_bounds__(128) hc_post_vec_kernel(HcPostParams p) {
  pdl_enter();
  const int hc = p.hc;
  const int64_t D4 = p.dim / 4;
  const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= D4) return;
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const float4* res = reinterpret_cast<const float4*>(p.res + t * hc * p.dim) + q;
    float4 r[kMax];
#pragma unroll
    for (int j = 0; j < kMax; ++j)
      if (j < hc) r[j] = res[j * D4];
    float4 f = reinterpret_cast<const float4*>(p.f + t * p.dim)[q];
    if (p.f_add || p.f_round) {
      float4 fa =
          p.f_add ? reinterpret_cast<const float4*>(p.f_add + t * p.dim)[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int e = 0; e < 4; ++e) lane4(f, e) = load_f(p, lane4(f, e), lane4(fa, e));
    }
    const float* post = p.post + t * hc;
    const float* C = p.comb + t * hc * hc;
    float4* out = reinterpret_cast<float4*>(p.out + t * hc * p.dim) + q;
#pragma unroll
    for (int k = 0; k < kMax; ++k) {
      if (k >= hc) break;
      float c[kMax];
#pragma unroll
      for (int j = 0; j < kMax; ++j) c[j] = j < hc ? C[j * hc + k] : 0.0f;
      const float pk = post[k];
      float4 fv = f, v;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kMax; ++j)
          if (j < hc) s = add_rn(s, mul_rn(c[j], lane4(r[j], e)));
        const float x = add_rn(mul_rn(pk, lane4(fv, e)), s);
        lane4(v, e) = p.round_bf16 ? round_bf16(x) : x;
      }
      out[k * D4] = v;
    }
  }
}

}  // namespace

void hc_post(const HcPostParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK(p.hc <= kMaxHc);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p.res) | reinterpret_cast<uintptr_t>(p.f) |
                         reinterpret_cast<uintptr_t>(p.f_add) | reinterpret_cast<uintptr_t>(p.out);
  const bool vec = p.dim % 4 == 0 && p.dim >= 4 && (addr & 15) == 0;
  if (vec) {
    // 128 threads x 4 channels per CTA: a decode token's 4096 channels on 8 SMs.
    const dim3 grid(ceil_div(p.dim / 4, 128), static_cast<unsigned>(p.tokens < 65535 ? p.tokens : 65535));
    if (p.hc <= 4) launch_pdl(hc_post_vec_kernel<4>, grid, 128, 0, s, p);
    else launch_pdl(hc_post_vec_kernel<kMaxHc>, grid, 128, 0, s, p);
  } else {
    launch_pdl(hc_post_kernel, grid_for(p.tokens * p.dim, 256), 256, 0, s, p);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
