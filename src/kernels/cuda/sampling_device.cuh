// Block-level building blocks of the sampling op (kernels/cuda/sample_rows.cu) that other kernels
// drawing tokens reuse (the DSpark draft's Markov step): the block argmax with the first-maximum
// tie rule, block reductions in a fixed order, and the inverse-CDF draw over a row in id order.
// Everything here is deterministic: reductions run a fixed shuffle tree (no floating-point atomics),
// so the same inputs give the same bits on every run for a given block size.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {

// 32 slots of 8 bytes: the scratch of one block reduction (one per kernel is enough: every
// reduction begins with a __syncthreads() that protects the previous one's reads).
struct alignas(8) BlockReduceScratch {
  unsigned char bytes[32 * 8];
};

// op over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the same result.
// The tree is fixed (xor butterfly in each warp, then every warp reduces the warp results in the
// same order), so a floating-point sum is bit-identical run to run. Contains __syncthreads().
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, BlockReduceScratch& scratch) {
  T* smem = reinterpret_cast<T*>(scratch.bytes);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // the previous reduction's reads of smem are done
  if (lane == 0) smem[wid] = v;
  __syncthreads();
  T r = lane < nw ? smem[lane] : identity;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) r = op(r, __shfl_xor_sync(0xffffffffu, r, o));
  return r;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? b : a; }
};
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; }
};

__device__ __forceinline__ double block_sum_f64(double v, BlockReduceScratch& s) {
  return block_reduce(v, SumOp{}, 0.0, s);
}
__device__ __forceinline__ int64_t block_sum_i64(int64_t v, BlockReduceScratch& s) {
  return block_reduce(static_cast<long long>(v), SumOp{}, 0ll, s);
}
__device__ __forceinline__ int block_min_int(int v, BlockReduceScratch& s) {
  return block_reduce(v, MinOp{}, INT_MAX, s);
}
__device__ __forceinline__ int block_max_int(int v, BlockReduceScratch& s) {
  return block_reduce(v, MaxOp{}, INT_MIN, s);
}
// Maximum ignoring NaN (fmax), -inf when the block has nothing.
__device__ __forceinline__ double block_max_f64(double v, BlockReduceScratch& s) {
  struct F {
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
  };
  return block_reduce(v, F{}, -static_cast<double>(INFINITY), s);
}

// ---- block argmax, first maximum ----
// Each thread folds select_key(x, v) (device.cuh: higher score first, then lower index; -0 == +0)
// of its candidates with max; the block's largest key is the first maximum. 0 = no candidate (no
// real key is 0). select_key puts NaN above +inf (torch.argmax's rule); a caller that must not
// pick NaN leaves NaN elements out.
__device__ __forceinline__ uint64_t block_argmax_key(uint64_t key, BlockReduceScratch& s) {
  return block_reduce(static_cast<unsigned long long>(key), MaxOp{}, 0ull, s);
}

// ---- inverse-CDF draw in id order ----
// Thread t owns the contiguous ids [begin, end) (chunks of ceil(n / blockDim.x)); a block scan of
// the chunk masses gives each thread the mass before its chunk. The draw is the first id v whose
// cumulative mass (in id order) exceeds the target: the owning thread is the first with
// target < excl + local, and it walks its chunk adding the same masses in the same order, so it
// always finds the id (excl + the running sum reaches excl + local exactly at its last positive id).
// Masses <= 0 (and NaN) are skipped, as the host skips p <= 0.
struct ChunkScan {
  int64_t begin = 0, end = 0;  // this thread's ids
  double excl = 0.0;           // mass of the ids before `begin`
  double local = 0.0;          // mass of [begin, end), summed in id order
  double total = 0.0;          // the row's mass (same value in every thread)
  int64_t last_positive = -1;  // the row's last id with positive mass (same in every thread), or -1
};

// `mass(v)` -> double, a pure function of v (it is evaluated twice for the drawing thread's chunk).
template <typename Mass>
__device__ ChunkScan block_chunk_scan(int64_t n, Mass mass, BlockReduceScratch& s) {
  ChunkScan c;
  const int64_t chunk = (n + blockDim.x - 1) / blockDim.x;
  const int64_t b = static_cast<int64_t>(threadIdx.x) * chunk;
  c.begin = b < n ? b : n;
  c.end = c.begin + chunk < n ? c.begin + chunk : n;
  double local = 0.0;
  int64_t last = -1;
  for (int64_t v = c.begin; v < c.end; ++v) {
    const double m = mass(v);
    if (m > 0) {
      local += m;
      last = v;
    }
  }
  c.local = local;
  // exclusive scan of `local` over threads: inclusive scan in each warp, then the warp totals
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  double incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl = y + incl;
  }
  double lane_excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) lane_excl = 0.0;
  double* warp_total = reinterpret_cast<double*>(s.bytes);
  __syncthreads();
  if (lane == 31) warp_total[wid] = incl;
  __syncthreads();
  double before = 0.0, total = 0.0;
  for (int w = 0; w < nw; ++w) {
    if (w == wid) before = total;
    total += warp_total[w];
  }
  c.excl = before + lane_excl;
  c.total = total;
  c.last_positive = block_reduce(static_cast<long long>(last), MaxOp{}, -1ll, s);
  return c;
}

// The first id whose cumulative mass exceeds `target` (every thread gets it), or -1 when the
// whole row's mass does not (rounding, or a NaN target): the caller picks its fallback.
template <typename Mass>
__device__ int64_t block_chunk_find(const ChunkScan& c, Mass mass, double target, BlockReduceScratch& s) {
  const int owner = block_min_int(c.local > 0 && target < c.excl + c.local ? static_cast<int>(threadIdx.x) : INT_MAX, s);
  if (owner == INT_MAX) return -1;
  long long found = -1;
  if (static_cast<int>(threadIdx.x) == owner) {
    double run = 0.0;
    for (int64_t v = c.begin; v < c.end; ++v) {
      const double m = mass(v);
      if (m > 0) {
        run += m;
        if (target < c.excl + run) {
          found = v;
          break;
        }
      }
    }
  }
  return block_reduce(found, MaxOp{}, -1ll, s);
}

}  // namespace tandem::kernels::cuda
