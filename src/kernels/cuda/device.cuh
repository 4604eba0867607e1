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

// torch's NaN-propagating max for amax computations that must ignore NaN: fmaxf already does.
}  // namespace tandem::kernels::cuda
