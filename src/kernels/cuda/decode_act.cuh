// One row of decode_act_pack (decode_gemm.h) by a whole 256-thread CTA: the optional RMSNorm, then
// act_quant(., 128) into e4m3 codes and E8M0 scales. Shared by decode_act_pack's kernel
// (decode_act.cu) and hc_pre_pack's finishing kernel (hc_pre.cu), so the two give the same bits.
#pragma once

#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda::pack {
// Internal linkage: each including .cu gets its own copy.
namespace {

constexpr int kThreads = 256;  // == rms_norm.cu's kThreads: the fp64 sum's order depends on it
constexpr int kBlock = 128;
constexpr int kPer = kBlock / kWarp;  // values of a block per lane

// rs = 1 / sqrt(ss / dim + eps) from the fp64 sum of squares ss, as rms_norm.cu's fp32 mode.
__device__ __forceinline__ float rms_scale(double ss, int64_t dim, float eps) {
  const float var = static_cast<float>(ss / static_cast<double>(dim));
  return div_rn(1.0f, sqrtf(add_rn(var, eps)));
}

// One 128-column block (columns c0 .. c0 + 127 of the row, c0 = 128 * block) by one warp: xb holds
// the block's 128 values (xb[i] = x[c0 + i]); v = norm_weight ? round_bf16(w * (x * rs)) : x, then
// act_quant.cu's amax, E8M0 scale and e4m3 codes. codes/scales/y are the row's (indexed by column /
// block); y is written only with norm_weight.
// wv (optional): this lane's norm weights of the block (wv[i] = norm_weight[c0 + lane + 32 i]),
// loaded by the caller (decode_act_pack's kernel: before its dependency wait).
__device__ __forceinline__ void pack_block(const float* xb, int64_t c0, const float* norm_weight, float rs, float* y,
                                           uint8_t* codes, uint8_t* scales, const float* wv = nullptr) {
  const int lane = threadIdx.x & 31;
  float v[kPer];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float xv = xb[lane + i * kWarp];
    const float w = norm_weight ? (wv ? wv[i] : norm_weight[c0 + lane + i * kWarp]) : 0.0f;
    v[i] = norm_weight ? round_bf16(mul_rn(w, mul_rn(xv, rs))) : xv;
    const float av = fabsf(v[i]);
    amax = av > amax ? av : amax;  // NaN compares false: ignored, as the act_quant op
  }
  amax = warp_max(amax);
  const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
  const float sc = num::pow2_int(e);
  if (lane == 0) scales[c0 / kBlock] = num::e8m0_from_exponent(e);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t c = c0 + lane + i * kWarp;
    const float q = clamp_std(div_rn(v[i], sc), -num::kE4m3Max, num::kE4m3Max);
    // num::e4m3_from_clamped: f32_to_e4m3's code on every clamped float, without its branches.
    codes[c] = is_nan(v[i]) ? static_cast<uint8_t>(((__float_as_uint(v[i]) >> 24) & 0x80u) | 0x7fu)
                            : num::e4m3_from_clamped(q);
    if (norm_weight && y) y[c] = v[i];
  }
}

// x [dim] -> v = norm_weight ? round_bf16(w * (x * rs)) : x; codes [dim], scales [dim / 128] of v;
// y [dim] (optional, with norm_weight) = v. y may equal x. The norm's fp64 sum of squares repeats
// rms_norm.cu's fp32 mode operation for operation (same thread count and element order, so the same
// block sum), then each warp normalizes and quantizes whole 128-column blocks as act_quant.cu does
// (same amax, scale and e4m3 conversion). Call with blockDim.x == kThreads from every thread (the
// block sum has barriers); `red` holds 32 doubles of shared memory, free at the call. hc_pre.cu's
// cluster kernel repeats the sum over distributed shared memory: keep the two in step.
// wv (optional, with norm_weight): the norm weights of this warp's blocks warp, warp + 8, ... in
// registers (wv[j][i]: block warp + 8 j, pack_block's wv), for rows of at most kPreBlocks * 8 blocks.
constexpr int kPreBlocks = 4;
__device__ __forceinline__ void pack_row(const float* x, int64_t dim, const float* norm_weight, float eps, float* y,
                                         uint8_t* codes, uint8_t* scales, double* red,
                                         const float (*wv)[kPer] = nullptr) {
  const int warp = threadIdx.x >> 5;
  const int64_t nb = dim / kBlock;
  float rs = 1.0f;
  if (norm_weight) {
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
      const float v = x[i];
      ss += static_cast<double>(v) * v;
    }
    // Every thread has read its elements of x before any is rewritten (y may equal x): the block
    // sum's barriers order the reads above before the writes below.
    ss = block_sum(ss, red);
    rs = rms_scale(ss, dim, eps);
  }
  if (wv) {
#pragma unroll
    for (int j = 0; j < kPreBlocks; ++j) {
      const int64_t b = warp + j * (kThreads / kWarp);
      if (b < nb) pack_block(x + b * kBlock, b * kBlock, norm_weight, rs, y, codes, scales, wv[j]);
    }
  } else {
    for (int64_t b = warp; b < nb; b += kThreads / kWarp)
      pack_block(x + b * kBlock, b * kBlock, norm_weight, rs, y, codes, scales);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda::pack
