// Device-side helpers shared by the CUDA kernels: the bit-exact scalar formats of the CPU oracle
// (common/numeric_core.h, compiled for the device), warp/block reductions and launch arithmetic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/numeric_core.h"
#include "kernels/cuda/cuda_util.h"

namespace tandem::kernels::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `smem` holds at least 32 values; the call contains __syncthreads().
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  T r = lane < nw ? smem[lane] : T(0);
  return warp_sum(r);
}
__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  float r = lane < nw ? smem[lane] : -INFINITY;
  return warp_max(r);
}

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Largest grid.x we launch; kernels that cover more work loop (grid-stride) over it.
constexpr unsigned kMaxGridX = 1u << 30;
inline unsigned grid_for(int64_t work, int64_t per_block) {
  const int64_t g = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(g < 1 ? 1 : (g > kMaxGridX ? kMaxGridX : g));
}

// ---- exact fp32 arithmetic (never contracted into FMA, so the GPU rounds as the CPU oracle, whose
// x86-64 baseline code has no FMA) ----
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float round_bf16(float x) { return num::round_bf16(x); }
__device__ __forceinline__ bool is_nan(float x) { return num::is_nan_bits(x); }
// e^x rounded to fp32 from the fp64 exp: the correctly rounded value except when e^x lies within
// about 2^-52 (relative) of an fp32 rounding midpoint, so a host computing the same way agrees bit for
// bit (expf is within 2 ulp only). For the few exps of a row (mHC), where the cost is nil.
__device__ __forceinline__ float exp_cr(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
// std::clamp / std::min semantics (a NaN input passes through).
__device__ __forceinline__ float clamp_std(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }
__device__ __forceinline__ float min_std(float a, float b) { return b < a ? b : a; }

// ---- total orders for selection (topk, argmax, moe_gate) ----
// A uint32 key whose unsigned order is the selection order of a score: NaN above +inf (all NaNs
// equal), -0 == +0, otherwise the float order.
__device__ __forceinline__ uint32_t score_key(float x) {
  uint32_t u = num::f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
// (score, index) as one uint64 whose larger value comes first: higher score, then lower index.
__device__ __forceinline__ uint64_t select_key(float x, uint32_t index) {
  return (static_cast<uint64_t>(score_key(x)) << 32) | static_cast<uint64_t>(0xffffffffu - index);
}
__device__ __forceinline__ uint32_t select_key_index(uint64_t key) {
  return 0xffffffffu - static_cast<uint32_t>(key & 0xffffffffu);
}
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}


// torch's NaN-propagating max for amax computations that must ignore NaN: fmaxf already does.
}  // namespace tandem::kernels::cuda
