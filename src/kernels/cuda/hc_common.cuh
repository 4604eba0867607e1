// Pieces shared by hc_pre and hc_head: the split-K mixing projection of the flattened streams
// (fn . xf for every mix row, plus sum(xf^2) in fp64 as the CPU op) into per-device scratch, and
// the fixed-order reduction of its partials. Split-K keeps the ~1.5 MB fn matrix spread over many
// CTAs even for one decode token.
#pragma once

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda::hc {
// Internal linkage: each including .cu gets its own copy of the kernel.
namespace {

constexpr int kThreads = 256;
constexpr int kTokTile = 4;  // tokens per CTA in the mix kernel

// partial[((t * (nmix + 1) + j) * ksplit + ks)]: j < nmix: fp32 partial dot of fn row j over K slice
// ks (stored as double, exactly); j == nmix: fp64 partial sum of squares.
__global__ void __launch_bounds__(kThreads) mix_partial_kernel(const float* h, const float* fn, int64_t tokens,
                                                               int nmix, int64_t hd, int ksplit, double* partial) {
  pdl_enter();
  __shared__ double red[32];
  const int j = blockIdx.x, ks = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * kTokTile;
  const int64_t chunk = (hd + ksplit - 1) / ksplit;
  const int64_t k0 = ks * chunk, k1 = k0 + chunk < hd ? k0 + chunk : hd;
  const float* hr[kTokTile];
#pragma unroll
  for (int tt = 0; tt < kTokTile; ++tt) hr[tt] = h + (t0 + tt < tokens ? t0 + tt : tokens - 1) * hd;
  if (j < nmix) {
    const float* w = fn + static_cast<int64_t>(j) * hd;
    float acc[kTokTile] = {};
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
      const float wv = w[k];
#pragma unroll
      for (int tt = 0; tt < kTokTile; ++tt) acc[tt] = fmaf(hr[tt][k], wv, acc[tt]);
    }
#pragma unroll
    for (int tt = 0; tt < kTokTile; ++tt) {
      const double v = static_cast<double>(block_sum(acc[tt], reinterpret_cast<float*>(red)));
      if (threadIdx.x == 0 && t0 + tt < tokens) partial[((t0 + tt) * (nmix + 1) + j) * ksplit + ks] = v;
    }
  } else {
    double acc[kTokTile] = {};
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
#pragma unroll
      for (int tt = 0; tt < kTokTile; ++tt) acc[tt] += static_cast<double>(hr[tt][k]) * hr[tt][k];
    }
#pragma unroll
    for (int tt = 0; tt < kTokTile; ++tt) {
      const double v = block_sum(acc[tt], red);
      if (threadIdx.x == 0 && t0 + tt < tokens) partial[((t0 + tt) * (nmix + 1) + j) * ksplit + ks] = v;
    }
  }
}

// Partials staged per token by the finishing CTA: (nmix + 1) * ksplit doubles of shared memory.
constexpr int kMaxStage = 4096;

inline int ksplit_for(int64_t hd, int nmix) {
  int64_t s = hd / 1024;
  s = s < 1 ? 1 : (s > 32 ? 32 : s);
  const int64_t cap = kMaxStage / (nmix + 1);
  return static_cast<int>(s < cap ? s : (cap < 1 ? 1 : cap));
}

inline double* launch_mix(const float* h, const float* fn, int64_t tokens, int nmix, int64_t hd, int ksplit,
                          cudaStream_t s) {
  const size_t n = static_cast<size_t>(tokens) * (nmix + 1) * ksplit;
  double* partial = static_cast<double*>(scratch(ScratchSlot::kHc, n * sizeof(double), s));
  const int64_t ttiles = (tokens + kTokTile - 1) / kTokTile;
  TANDEM_CHECK_MSG(ttiles <= 65535, "hc: too many tokens for one launch");
  launch_pdl(mix_partial_kernel, dim3(nmix + 1, ksplit, static_cast<unsigned>(ttiles)), kThreads, 0, s, h, fn, tokens,
             nmix, hd, ksplit, partial);
  TANDEM_CUDA_LAUNCH_CHECK();
  return partial;
}

// mix[j] = (sum_ks partial dots, fp32) * rsqrt(mean(xf^2) + eps), as the CPU's hc_mixes, for token t,
// by the whole CTA: the partials are staged in shared memory with coalesced loads, then thread j
// reduces mix j in ks order (every thread derives the same r from the same fp64 sums).
// `stage` holds (nmix + 1) * ksplit doubles; `mix` nmix floats. Contains __syncthreads.
__device__ __forceinline__ void finish_mix(const double* partial, int64_t t, int nmix, int ksplit, int64_t hd,
                                           float norm_eps, double* stage, float* mix) {
  const double* pt = partial + t * (nmix + 1) * ksplit;
  for (int i = threadIdx.x; i < (nmix + 1) * ksplit; i += blockDim.x) stage[i] = pt[i];
  __syncthreads();
  for (int j = threadIdx.x; j < nmix; j += blockDim.x) {
    double ss = 0.0;
    for (int ks = 0; ks < ksplit; ++ks) ss += stage[nmix * ksplit + ks];
    const float r = div_rn(1.0f, sqrtf(add_rn(static_cast<float>(ss / static_cast<double>(hd)), norm_eps)));
    float d = 0.0f;
    for (int ks = 0; ks < ksplit; ++ks) d = add_rn(d, static_cast<float>(stage[j * ksplit + ks]));
    mix[j] = mul_rn(d, r);
  }
  __syncthreads();
}

__device__ __forceinline__ float sigmoid(float x) { return div_rn(1.0f, add_rn(1.0f, exp_cr(-x))); }

// y[d] = sum_i pre[i] * h[i][d] (fp32, i ascending, no FMA), optionally bf16-rounded.
__device__ __forceinline__ void collapse(const float* h, const float* pre, int hc, int64_t dim, float* y, bool round) {
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float s = 0.0f;
    for (int i = 0; i < hc; ++i) s = add_rn(s, mul_rn(pre[i], h[i * dim + d]));
    y[d] = round ? round_bf16(s) : s;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda::hc
