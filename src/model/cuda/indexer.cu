// The lightning indexer kernels (indexer.h).
#include "model/cuda/indexer.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/device.cuh"

namespace tandem::cuda_model {

using kernels::cuda::ceil_div;
using kernels::cuda::warp_sum;

namespace {

// Block: one row t, a chunk of 8 entries per iteration (one warp per entry). q[t] in shared memory.
__global__ void indexer_kernel(IndexerArgs a) {
  extern __shared__ float smem[];
  const int heads = a.heads, dim = a.dim;
  float* sq = smem;                   // [heads * dim]
  float* sw = smem + heads * dim;     // [heads]
  const int64_t t = blockIdx.y;
  if (t >= a.rows) return;
  const int64_t p = a.m.positions[t];
  const int64_t vis = (p + 1) / 4;
  if (blockIdx.x == 0 && threadIdx.x == 0) a.visible[t] = static_cast<int32_t>(vis);
  for (int i = threadIdx.x; i < heads * dim; i += blockDim.x) sq[i] = a.q[t * heads * dim + i];
  for (int i = threadIdx.x; i < heads; i += blockDim.x) sw[i] = a.w[t * heads + i];
  __syncthreads();
  const int seq = a.m.row_seq[t];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int64_t per_block = static_cast<int64_t>(nw) * 16;
  const int64_t e0 = blockIdx.x * per_block;
  for (int64_t e = e0 + warp; e < e0 + per_block && e < a.n_cols; e += nw) {
    float total = -INFINITY;
    if (e < vis) {
      const int64_t pos = 4 * e;
      const int32_t blk = a.m.block_tables[static_cast<int64_t>(seq) * a.m.max_blocks + pos / a.m.block_size];
      const uint8_t* rec =
          a.pool + static_cast<int64_t>(blk) * a.block_bytes + a.pool_idx + ((pos % a.m.block_size) / 4) * a.key.bytes;
      // Each lane holds dims lane, lane+32, ... of the key.
      float kreg[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) kreg[i] = (lane + 32 * i < dim) ? index_key_get(rec, a.key, lane + 32 * i) : 0.0f;
      total = 0.0f;
      for (int h = 0; h < heads; ++h) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (lane + 32 * i < dim) acc += sq[h * dim + lane + 32 * i] * kreg[i];
        acc = warp_sum(acc);
        const float dot = num::round_bf16(acc);
        const float term = num::round_bf16((dot > 0.0f ? dot : 0.0f) * sw[h]);
        total += term;
      }
      total = num::round_bf16(total);
    }
    if (lane == 0) a.scores[t * a.n_cols + e] = total;
  }
}

__global__ void scale_round_kernel(ScaleRoundArgs a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.n) a.x[i] = num::round_bf16(a.x[i] * a.scale);
}

}  // namespace

void indexer_scores_paged(const IndexerArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  TANDEM_CHECK_MSG(a.dim <= 256, "indexer head dim above 256");
  const int threads = 256;
  const int64_t per_block = (threads / 32) * 16;
  const size_t smem = sizeof(float) * (static_cast<size_t>(a.heads) * a.dim + a.heads);
  TANDEM_CHECK_MSG(smem <= 96 * 1024, "indexer query too large for shared memory");
  TANDEM_CHECK_MSG(a.rows <= 65535, "indexer launched for more than 65535 rows (chunk the call)");
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(indexer_kernel), smem);
  dim3 grid(std::max<unsigned>(1, ceil_div(a.n_cols, per_block)), static_cast<unsigned>(a.rows));
  indexer_kernel<<<grid, threads, smem, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void scale_round(const ScaleRoundArgs& a, cudaStream_t s) {
  if (a.n == 0) return;
  scale_round_kernel<<<ceil_div(a.n, 256), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
