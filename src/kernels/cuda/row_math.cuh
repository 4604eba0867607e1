// The per-row bodies of the RMSNorm, RoPE and Hadamard kernels (rms_norm.cu, rope.cu, hadamard.cu),
// shared with the fused kernels that chain them on one row (model/cuda/norm_rope.cu): one copy of
// each op's arithmetic, so a fused kernel equals the sequence of the ops bit for bit by construction
// (its tests check the composition: the order, the barriers between the steps, the operands).
#pragma once

#include "kernels/cuda/device.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda::row {

constexpr int kNormThreads = 256;  // the RMSNorm's block: its fp64 block sum's order depends on it
constexpr int kNormChunk = 2048;   // bf16 chain: squares staged in shared memory per pass

// Shared memory of rms_norm_row.
struct NormSmem {
  double red[32];
  float rs;
  float sq[kNormChunk];
};

// y[0, dim) = RMSNorm(x[0, dim)) as rms_norm's mode `mode` (y may equal x). Called by every thread
// of a block of kNormThreads threads; ends with a barrier (the smem may be reused, y read by any thread).
__device__ __forceinline__ void rms_norm_row(const float* x, float* y, int64_t dim, const float* weight,
                                             const uint16_t* weight_bf16, float eps, RmsNormMode mode,
                                             bool round_out, NormSmem& sm) {
  if (mode == RmsNormMode::kBf16Chain) {
    // The rounded squares are staged in shared memory by all threads (coalesced), then summed in
    // index order by thread 0.
    float sum = 0.0f;
    for (int64_t c0 = 0; c0 < dim; c0 += kNormChunk) {
      const int64_t n = dim - c0 < kNormChunk ? dim - c0 : kNormChunk;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sm.sq[i] = round_bf16(mul_rn(x[c0 + i], x[c0 + i]));
      __syncthreads();
      if (threadIdx.x == 0)
        for (int64_t i = 0; i < n; ++i) sum = add_rn(sum, sm.sq[i]);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const float mean = round_bf16(div_rn(sum, static_cast<float>(dim)));
      sm.rs = round_bf16(div_rn(1.0f, sqrtf(round_bf16(add_rn(mean, eps)))));
    }
    __syncthreads();
    const float rs = sm.rs;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      float v = round_bf16(mul_rn(x[i], rs));
      if (weight) v = round_bf16(mul_rn(weight[i], v));
      if (weight_bf16) v = round_bf16(mul_rn(num::bf16_to_f32(weight_bf16[i]), v));
      y[i] = v;
    }
  } else {
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
    ss = block_sum(ss, sm.red);  // contains __syncthreads: every x read is done before y is written
    const float var = static_cast<float>(ss / static_cast<double>(dim));
    const float rs = div_rn(1.0f, sqrtf(add_rn(var, eps)));
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      float v = mul_rn(x[i], rs);
      if (weight) v = mul_rn(weight[i], v);
      if (weight_bf16) v = mul_rn(num::bf16_to_f32(weight_bf16[i]), v);
      y[i] = round_out ? round_bf16(v) : v;
    }
  }
  __syncthreads();
}

// RoPE of one interleaved pair x[0], x[1] (frequency inv_freq_i) at position pos: separately rounded
// products (no FMA), cos/sin the double-precision sincos rounded to float (the correctly rounded
// values, as glibc's cosf/sinf give the CPU op).
__device__ __forceinline__ void rope_pair(float* x, int64_t pos, float inv_freq_i, bool inverse, bool round_out) {
  const float ang = mul_rn(static_cast<float>(pos), inv_freq_i);
  double sd, cd;
  sincos(static_cast<double>(ang), &sd, &cd);
  float sn = static_cast<float>(sd);
  const float c = static_cast<float>(cd);
  if (inverse) sn = -sn;
  const float a = x[0], b = x[1];
  float re = sub_rn(mul_rn(a, c), mul_rn(b, sn));
  float im = add_rn(mul_rn(a, sn), mul_rn(b, c));
  if (round_out) {
    re = round_bf16(re);
    im = round_bf16(im);
  }
  x[0] = re;
  x[1] = im;
}

// RoPE of the rope_dim dims at x (one head's tail) by the threads of a block; no barrier.
__device__ __forceinline__ void rope_row(float* x, int64_t pos, const float* inv_freq, int rope_dim, bool inverse,
                                         bool round_out) {
  for (int i = threadIdx.x; i < rope_dim / 2; i += blockDim.x) rope_pair(x + 2 * i, pos, inv_freq[i], inverse, round_out);
}

// x[0, n) = H_n x / sqrt(n) (scale = 1/sqrt(n) rounded to float), Sylvester order, each stage's
// outputs one a+b or a-b, as the CPU op. v: n floats of shared memory. Called by every thread of the
// block; ends with a barrier.
__device__ __forceinline__ void hadamard_row(float* x, int n, float scale, bool round_out, float* v) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = x[i];
  __syncthreads();
  for (int h = 1; h < n; h *= 2) {
    for (int j = threadIdx.x; j < n / 2; j += blockDim.x) {
      const int i = (j / h) * 2 * h + j % h;
      const float a = v[i], b = v[i + h];
      v[i] = add_rn(a, b);
      v[i + h] = sub_rn(a, b);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float y = mul_rn(v[i], scale);
    x[i] = round_out ? round_bf16(y) : y;
  }
  __syncthreads();
}

}  // namespace tandem::kernels::cuda::row
