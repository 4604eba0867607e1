// Lightning-indexer scores, one CTA per (32-entry tile, token): the token's queries (64 heads at a
// time) and the tile's keys are staged in shared memory in 32-dim slices; lane = entry, warp w owns
// heads w, w+8, ..., so every thread keeps 8 fp32 dot products. The per-entry head sum runs on warp 0
// in ascending head order with the CPU's bf16 rounding points. Tiles past visible[t] only write -inf.
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kTile = 32;      // entries per CTA (one per lane)
constexpr int kWarps = 8;
constexpr int kHeadGroup = 64; // heads per pass (8 per warp)
constexpr int kDSlice = 32;

__global__ void __launch_bounds__(kWarps * kWarp) indexer_score_kernel(IndexerScoreParams p, int64_t ldk, int64_t lds) {
  __shared__ float qs[kHeadGroup][kDSlice];
  __shared__ float ks[kTile][kDSlice + 1];
  __shared__ float terms[kHeadGroup][kTile];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t H = p.heads, D = p.dim;
  const bool b16 = p.bf16_numerics;
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const int64_t v = p.visible[t];
    const int64_t vis = v < 0 ? 0 : (v > p.entries ? p.entries : v);
    float* out = p.scores + t * lds;
    if (s0 >= vis) {
      if (warp == 0 && s0 + lane < p.entries) out[s0 + lane] = -INFINITY;
      continue;
    }
    const float* q = p.q + t * H * D;
    const float* w = p.w + t * H;
    float total = 0.0f;  // warp 0: the sum over heads of entry s0 + lane
    for (int64_t h0 = 0; h0 < H; h0 += kHeadGroup) {
      const int nh = static_cast<int>(H - h0 < kHeadGroup ? H - h0 : kHeadGroup);
      float acc[kHeadGroup / kWarps] = {};
      for (int64_t d0 = 0; d0 < D; d0 += kDSlice) {
        __syncthreads();  // previous readers of qs / ks are done
        for (int i = threadIdx.x; i < kHeadGroup * kDSlice; i += blockDim.x) {
          const int hl = i / kDSlice, dd = i % kDSlice;
          qs[hl][dd] = hl < nh && d0 + dd < D ? q[(h0 + hl) * D + d0 + dd] : 0.0f;
        }
        for (int i = threadIdx.x; i < kTile * kDSlice; i += blockDim.x) {
          const int e = i / kDSlice, dd = i % kDSlice;
          ks[e][dd] = s0 + e < vis && d0 + dd < D ? p.k[(s0 + e) * ldk + d0 + dd] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int dd = 0; dd < kDSlice; ++dd) {
          const float kv = ks[lane][dd];
#pragma unroll
          for (int j = 0; j < kHeadGroup / kWarps; ++j) acc[j] = fmaf(qs[warp + kWarps * j][dd], kv, acc[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kHeadGroup / kWarps; ++j) {
        const int hl = warp + kWarps * j;
        if (hl >= nh) continue;
        float dot = acc[j];
        if (b16) dot = round_bf16(dot);
        float term = mul_rn(dot > 0.0f ? dot : 0.0f, w[h0 + hl]);
        if (b16) term = round_bf16(term);
        terms[hl][lane] = term;
      }
      __syncthreads();
      if (warp == 0)
        for (int hl = 0; hl < nh; ++hl) total = add_rn(total, terms[hl][lane]);
      // terms is next written after the next group's first __syncthreads
    }
    if (warp == 0 && s0 + lane < p.entries) {
      const int64_t s = s0 + lane;
      out[s] = s < vis ? (b16 ? round_bf16(total) : total) : -INFINITY;
    }
  }
}

}  // namespace

void indexer_score(const IndexerScoreParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0 || p.entries == 0) return;
  const int64_t ldk = p.ldk > 0 ? p.ldk : p.dim, lds = p.lds > 0 ? p.lds : p.entries;
  const int64_t tiles = (p.entries + kTile - 1) / kTile;
  TANDEM_CHECK_MSG(tiles < (int64_t{1} << 31), "indexer_score: too many entries");
  const unsigned gy = static_cast<unsigned>(p.tokens < 65535 ? p.tokens : 65535);
  indexer_score_kernel<<<dim3(static_cast<unsigned>(tiles), gy), kWarps * kWarp, 0, s>>>(p, ldk, lds);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
