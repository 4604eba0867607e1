// Pieces shared by hc_pre and hc_head: the split-K mixing projection of the flattened streams
// (hc_mix.h: fn . xf for every mix row, plus sum(xf^2) in fp64 as the CPU op) into per-device
// scratch, the fixed-order reduction of its partials, and the stream collapse.
#pragma once

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/hc_mix.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda::hc {
// Internal linkage: each including .cu gets its own copy of the kernel.
namespace {

constexpr int kThreads = 256;
// Partials staged per token by the finishing CTA: (nmix + 1) * ksplit doubles of shared memory
// (hc_mix_ksplit keeps it <= kMaxStage), at least 32 (the block sums that reuse it).
constexpr int kMaxStage = 4096;

inline size_t stage_bytes(int nmix, int ksplit) {
  const int64_t n = static_cast<int64_t>(nmix + 1) * ksplit;
  TANDEM_CHECK(n <= kMaxStage);
  return static_cast<size_t>(n < 32 ? 32 : n) * sizeof(double);
}

// The partials of every token (hc_mix.h) in the op scratch; returns them.
inline double* launch_mix(const float* h, const float* fn, int64_t tokens, int nmix, int64_t hd, int ksplit,
                          cudaStream_t s) {
  const size_t n = static_cast<size_t>(tokens) * (nmix + 1) * ksplit;
  double* partial = static_cast<double*>(scratch(ScratchSlot::kHc, n * sizeof(double), s));
  hc_mix_partials(h, fn, tokens, nmix, hd, ksplit, partial, s);
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

// y[d] = sum_i pre[i] * h[i * ld + d] for d < dim (fp32, i ascending, no FMA), optionally
// bf16-rounded, by `nt` threads (this one is number `tid`; any split of the columns, over threads or
// CTAs, gives the same bits). ld: the streams' row stride (a column slice of wider streams: dim <
// ld). Four columns per thread per step, their hc loads issued together (h and y do not overlap), so
// a CTA keeps enough loads in flight.
__device__ __forceinline__ void collapse(const float* __restrict__ h, int64_t ld, const float* pre, int hc,
                                         int64_t dim, float* __restrict__ y, bool round, int tid, int nt) {
  constexpr int kU = 4;
  for (int64_t d0 = tid; d0 < dim; d0 += kU * nt) {
    float s[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) s[u] = 0.0f;
#pragma unroll 4
    for (int i = 0; i < hc; ++i) {
      const float p = pre[i];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t d = d0 + static_cast<int64_t>(u) * nt;
        if (d < dim) s[u] = add_rn(s[u], mul_rn(p, h[i * ld + d]));
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t d = d0 + static_cast<int64_t>(u) * nt;
      if (d < dim) y[d] = round ? round_bf16(s[u]) : s[u];
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda::hc
