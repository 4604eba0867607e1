// Row top-k, one CTA per row. Every candidate becomes a unique 64-bit key (device.cuh's
// select_key: NaN first, then larger score, then lower index), so "the k largest keys" is exactly
// the CPU's selection including its tie rule. A radix select over the key, 8 bits per pass from the
// top (warp-aggregated shared-memory histograms), finds the k-th largest key and stops as soon as a
// whole bucket is wanted; the selected keys are gathered into shared memory and bitonic-sorted
// (descending), which is the output order.
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kMaxK = 4096;  // 32 KiB of keys in shared memory

__global__ void __launch_bounds__(kThreads) topk_kernel(TopkParams p, int64_t lds, int64_t ldo) {
  __shared__ uint64_t cand[kMaxK];
  __shared__ uint32_t hist[256];
  __shared__ uint64_t s_prefix, s_mask;
  __shared__ int64_t s_want;
  __shared__ int s_done;
  __shared__ uint32_t s_count;
  const int lane = threadIdx.x & 31;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float* x = p.scores + r * lds;
    int32_t* out = p.out + r * ldo;
    int64_t nv = p.n;
    if (p.n_valid) {
      const int64_t v = p.n_valid[r];
      nv = v < 0 ? 0 : (v > p.n ? p.n : v);
    }
    const int64_t kk = p.k < nv ? p.k : nv;
    // threshold: select every key >= thr (thr = 0 selects all nv candidates)
    uint64_t thr = 0;
    if (kk < nv && kk > 0) {
      if (threadIdx.x == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_want = kk;
        s_done = 0;
      }
      for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint64_t prefix = s_prefix, mask = s_mask;
        for (int64_t i0 = 0; i0 < nv; i0 += blockDim.x) {
          const int64_t i = i0 + threadIdx.x;
          int digit = -1 - lane;  // inactive: unique, never counted
          if (i < nv) {
            const uint64_t key = select_key(x[i], static_cast<uint32_t>(i));
            if ((key & mask) == prefix) digit = static_cast<int>((key >> shift) & 255u);
          }
          const unsigned active = __activemask();
          const unsigned peers = __match_any_sync(active, digit);
          if (digit >= 0 && (peers & ((1u << lane) - 1u)) == 0) atomicAdd(&hist[digit], __popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < kWarp) {
          // Find the bucket holding the want-th largest key: lane L sums digits 255-8L .. 248-8L,
          // a warp scan gives the keys above each lane's range, and the lane whose range crosses
          // `want` walks its 8 buckets (the serial scan from digit 255 down, in 32 pieces).
          const int64_t want = s_want;
          int64_t tot = 0;
          for (int q = 8 * lane; q < 8 * lane + 8; ++q) tot += hist[255 - q];
          int64_t incl = tot;
#pragma unroll
          for (int o = 1; o < 32; o <<= 1) {
            const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
          }
          const int64_t excl = incl - tot;
          const unsigned hit = __ballot_sync(0xffffffffu, excl < want && want <= incl);
          if (hit && lane == __ffs(hit) - 1) {
            int64_t above = excl;
            int d = 255 - 8 * lane;
            for (int q = 8 * lane; q < 8 * lane + 8; ++q) {
              d = 255 - q;
              if (above + hist[d] >= want) break;
              above += hist[d];
            }
            s_want = want - above;
            s_prefix = prefix | (static_cast<uint64_t>(d) << shift);
            s_mask = mask | (uint64_t{255} << shift);
            if (hist[d] == s_want) s_done = 1;  // the whole bucket is wanted: keys >= prefix are exactly kk
          }
        }
        __syncthreads();
        if (s_done) break;
      }
      thr = s_prefix;
    }
    // gather
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    if (kk > 0) {
      for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
        const uint64_t key = select_key(x[i], static_cast<uint32_t>(i));
        if (key >= thr) cand[atomicAdd(&s_count, 1u)] = key;
      }
    }
    __syncthreads();
    // bitonic sort, descending, padded with 0 (below every real key)
    int P = 1;
    while (P < kk) P <<= 1;
    for (int64_t i = kk + threadIdx.x; i < P; i += blockDim.x) cand[i] = 0;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = threadIdx.x; i < P; i += blockDim.x) {
          const int j = i ^ stride;
          if (j > i) {
            const uint64_t a = cand[i], b = cand[j];
            const bool desc = (i & size) == 0;
            if (desc ? a < b : a > b) {
              cand[i] = b;
              cand[j] = a;
            }
          }
        }
        __syncthreads();
      }
    }
    for (int64_t i = threadIdx.x; i < p.k; i += blockDim.x)
      out[i] = i < kk ? static_cast<int32_t>(select_key_index(cand[i])) + p.index_offset : -1;
    __syncthreads();  // cand / hist reused by the next row
  }
}

}  // namespace

void topk(const TopkParams& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0 || p.k == 0) return;
  TANDEM_CHECK_MSG(p.k <= kMaxK, "topk: k <= 4096");
  TANDEM_CHECK_MSG(p.n < (int64_t{1} << 32) - 1, "topk: row too long");
  const int64_t lds = p.lds > 0 ? p.lds : p.n, ldo = p.ldo > 0 ? p.ldo : p.k;
  topk_kernel<<<grid_for(p.rows, 1), kThreads, 0, s>>>(p, lds, ldo);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
