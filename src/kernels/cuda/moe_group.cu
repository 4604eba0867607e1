// Counting sort of (token, slot) routing pairs by expert in one CTA, stable (ascending pair index,
// hence ascending token within an expert) and deterministic without atomics deciding positions:
//  1. the pairs are cut into S contiguous segments, one per warp; each warp counts its segment's
//     experts into its own row of a [S][E] shared table;
//  2. a block scan over experts gives offsets[e]; each (segment, expert) cursor starts at
//     offsets[e] + the counts of the earlier segments;
//  3. each warp walks its segment in index order, 32 pairs at a time; lanes with the same expert
//     rank themselves with __match_any_sync and the group's leader advances the cursor.
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kTableInts = 8192;  // [S][E] cursors, 32 KiB of shared memory

__global__ void __launch_bounds__(kThreads) moe_group_kernel(MoeGroupParams p, int segs) {
  __shared__ int32_t table[kTableInts];
  __shared__ int32_t wsum[32];
  const int E = p.n_experts;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = p.tokens * p.topk;
  const int64_t seg_len = (n + segs - 1) / segs;
  for (int i = threadIdx.x; i < segs * E; i += blockDim.x) table[i] = 0;
  __syncthreads();
  // 1. per-segment counts
  if (warp < segs) {
    const int64_t b = warp * seg_len, e_ = b + seg_len < n ? b + seg_len : n;
    for (int64_t i = b + lane; i < e_; i += kWarp) {
      const int e = p.expert_ids[i];
      if (e >= 0 && e < E) atomicAdd(&table[warp * E + e], 1);  // ids are a caller invariant
    }
  }
  __syncthreads();
  // 2. per-expert totals (each thread owns a contiguous run of experts), a block exclusive scan
  // over the runs, then the cursors: offsets[e] + counts of the earlier segments.
  const int per = (E + kThreads - 1) / kThreads;
  const int e0 = threadIdx.x * per < E ? threadIdx.x * per : E, e1 = e0 + per < E ? e0 + per : E;
  int32_t local = 0;
  for (int e = e0; e < e1; ++e)
    for (int s = 0; s < segs; ++s) local += table[s * E + e];
  int32_t incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int32_t v = wsum[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += u;
    }
    wsum[lane] = v;  // inclusive over warps
  }
  __syncthreads();
  int32_t run = incl - local + (warp > 0 ? wsum[warp - 1] : 0);
  for (int e = e0; e < e1; ++e) {
    p.offsets[e] = run;
    for (int s = 0; s < segs; ++s) {
      const int32_t c = table[s * E + e];
      table[s * E + e] = run;
      run += c;
    }
  }
  if (threadIdx.x == 0) p.offsets[E] = static_cast<int32_t>(n);
  __syncthreads();
  // 3. stable placement
  if (warp < segs) {
    const int64_t b = warp * seg_len, e_ = b + seg_len < n ? b + seg_len : n;
    int32_t* cursor = table + warp * E;
    for (int64_t i0 = b; i0 < e_; i0 += kWarp) {
      const int64_t i = i0 + lane;
      int e = i < e_ ? p.expert_ids[i] : -1;
      if (e < 0 || e >= E) e = -1 - lane;  // inactive lanes: unique keys, no write
      const unsigned peers = __match_any_sync(0xffffffffu, e);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      if (e >= 0) {
        const int32_t pos = cursor[e] + rank;
        p.token_of[pos] = static_cast<int32_t>(i / p.topk);
        p.slot_of[pos] = static_cast<int32_t>(i % p.topk);
      }
      __syncwarp();  // every lane has read its cursor before the leaders advance them
      if (e >= 0 && rank == 0) cursor[e] += __popc(peers);
      __syncwarp();
    }
  }
}

}  // namespace

void moe_group(const MoeGroupParams& p, cudaStream_t s) {
  validate(p);
  const int E = p.n_experts;
  TANDEM_CHECK_MSG(E <= kTableInts, "moe_group: at most 8192 experts");
  const int64_t n = p.tokens * p.topk;
  TANDEM_CHECK_MSG(n < (int64_t{1} << 31), "moe_group: too many pairs");
  int segs = kTableInts / E;
  segs = segs > kThreads / kWarp ? kThreads / kWarp : segs;
  // Short inputs: fewer segments (at least 32 pairs each).
  const int64_t by_len = (n + kWarp - 1) / kWarp;
  if (by_len < segs) segs = static_cast<int>(by_len < 1 ? 1 : by_len);
  moe_group_kernel<<<1, kThreads, 0, s>>>(p, segs);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
