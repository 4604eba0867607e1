// The per-row bodies of the RMSNorm, RoPE, Hadamard and FP4 act_quant kernels (rms_norm.cu, rope.cu,
// hadamard.cu, act_quant.cu), shared with the fused kernels that chain them on one row
// (model/cuda/norm_rope.cu): one copy of each op's arithmetic, so a fused kernel equals the sequence
// of the ops bit for bit by construction (its tests check the composition: the order, the barriers
// between the steps, the operands).
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

// The bf16 chain's scale 1 / RMS from the row's sum of bf16-rounded squares (summed in index order).
__device__ __forceinline__ float bf16_chain_rs(float sum, int64_t dim, float eps) {
  const float mean = round_bf16(div_rn(sum, static_cast<float>(dim)));
  return round_bf16(div_rn(1.0f, sqrtf(round_bf16(add_rn(mean, eps)))));
}

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
    if (threadIdx.x == 0) sm.rs = bf16_chain_rs(sum, dim, eps);
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
// (cos, sin) of the pair's angle; a table of these (one per token and pair) lets the rows of a
// token share them (norm_rope's prefill kernels).
__device__ __forceinline__ float2 rope_cos_sin(int64_t pos, float inv_freq_i) {
  const float ang = mul_rn(static_cast<float>(pos), inv_freq_i);
  double sd, cd;
  sincos(static_cast<double>(ang), &sd, &cd);
  return make_float2(static_cast<float>(cd), static_cast<float>(sd));
}

// The pair (a, b) rotated by cs = rope_cos_sin(...).
__device__ __forceinline__ void rope_rotate(float& a, float& b, float2 cs, bool inverse, bool round_out) {
  const float c = cs.x, sn = inverse ? -cs.y : cs.y;
  float re = sub_rn(mul_rn(a, c), mul_rn(b, sn));
  float im = add_rn(mul_rn(a, sn), mul_rn(b, c));
  if (round_out) {
    re = round_bf16(re);
    im = round_bf16(im);
  }
  a = re;
  b = im;
}

__device__ __forceinline__ void rope_pair(float* x, int64_t pos, float inv_freq_i, bool inverse, bool round_out) {
  float a = x[0], b = x[1];
  rope_rotate(a, b, rope_cos_sin(pos, inv_freq_i), inverse, round_out);
  x[0] = a;
  x[1] = b;
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

// The largest |x[i]| of x[0, block) over the lanes of a warp (lanes stride the block); NaN compares
// false: ignored, as the CPU op. Every lane gets it.
__device__ __forceinline__ float warp_amax(const float* x, int block, int lane) {
  float amax = 0.0f;
  for (int i = lane; i < block; i += kWarp) {
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
  }
  return warp_max(amax);  // never NaN here
}

// act_quant FP4 (e2m1, power-of-two E8M0 scale) of one block xs[0, block) into xd (may equal xs),
// by the 32 lanes of a warp: exact division by the scale, no FMA; NaN passes through (codes +0).
// codes (optional): the block's packed codes [block / 2]; scale (optional): its E8M0 byte.
__device__ __forceinline__ void fp4_block_warp(const float* xs, float* xd, int block, int lane, uint8_t* codes,
                                               uint8_t* scale) {
  const float amax = warp_amax(xs, block, lane);
  const int e = num::ue8m0_scale_exponent(amax, num::kE2m1Max, num::kFp4ActAmaxFloor);
  const float s = num::pow2_int(e);
  if (scale && lane == 0) *scale = num::e8m0_from_exponent(e);
  __syncwarp();  // every lane has read the block before any lane writes it (in place)
  // Each lane owns element pairs so a packed code byte has one writer.
  for (int i = 2 * lane; i < block; i += 2 * kWarp) {
    uint8_t c[2];
    float out[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float x = xs[i + j];
      c[j] = num::f32_to_e2m1(clamp_std(div_rn(x, s), -num::kE2m1Max, num::kE2m1Max));
      out[j] = is_nan(x) ? x : mul_rn(num::e2m1_decode(c[j]), s);
    }
    if (codes) codes[i / 2] = static_cast<uint8_t>((c[0] & 0xf) | ((c[1] & 0xf) << 4));
    xd[i] = out[0];
    xd[i + 1] = out[1];
  }
}

}  // namespace tandem::kernels::cuda::row
