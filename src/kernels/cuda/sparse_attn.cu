// Sparse MQA with the attention sink, one CTA per (token, head), 128 threads; thread i owns output
// dims i, i+128, ... in registers. Per block of `block` list positions: each warp computes the dots
// of a quarter of the positions (lanes split the dim, q in shared memory), warp 0 runs the
// reference's block softmax bookkeeping (running max, fp32 block sum, bf16 p), then
// every thread rescales its accumulator and adds p * kv. Numerically the reference kernel's online
// softmax; the CPU op applies the same rescaling as suffix products, so results agree to rounding.
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/smem_bounds.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxDimPerThread = 8;  // dim <= 1024
constexpr int kMaxBlock = 1024;

// q [dim] plus the block's scores, probabilities and mask [3 * block].
size_t smem_bytes(int64_t dim, int64_t block) { return static_cast<size_t>(dim + 3 * block) * sizeof(float); }

struct AttnArgs {
  SparseAttnParams p;
  int64_t ldkv, ldi, qts, ots;
  float scale;
};

__global__ void __launch_bounds__(kThreads) sparse_attn_kernel(AttnArgs a) {
  extern __shared__ float smem[];
  const SparseAttnParams& p = a.p;
  const int64_t D = p.dim, K = p.topk;
  const int blk = p.block;
  float* qs = smem;            // [D]
  float* sc = qs + D;          // [blk] scaled scores
  float* pb = sc + blk;        // [blk] probabilities (bf16 with bf16_numerics)
  float* ok = pb + blk;        // [blk] 1 = the position has a key
  __shared__ float s_alpha, s_m, s_l;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool b16 = p.bf16_numerics;
  for (int64_t th = blockIdx.x; th < p.tokens * p.heads; th += gridDim.x) {
    const int64_t t = th / p.heads, h = th % p.heads;
    const float* q = p.q + t * a.qts + h * D;
    const int32_t* idx = p.idx + t * a.ldi;
    for (int64_t d = threadIdx.x; d < D; d += kThreads) qs[d] = q[d];
    if (threadIdx.x == 0) {
      s_m = -INFINITY;
      s_l = 0.0f;
    }
    float acc[kMaxDimPerThread];
#pragma unroll
    for (int j = 0; j < kMaxDimPerThread; ++j) acc[j] = 0.0f;
    __syncthreads();
    for (int64_t i0 = 0; i0 < K; i0 += blk) {
      const int nb = static_cast<int>(K - i0 < blk ? K - i0 : blk);
      for (int i = warp; i < nb; i += kWarps) {
        const int32_t row = idx[i0 + i];
        const bool valid = row >= 0 && row < p.kv_rows;
        float dot = 0.0f;
        if (valid) {
          const float* kv = p.kv + static_cast<int64_t>(row) * a.ldkv;
          for (int64_t d = lane; d < D; d += kWarp) dot = fmaf(qs[d], kv[d], dot);
          dot = warp_sum(dot);
        }
        if (lane == 0) {
          sc[i] = mul_rn(dot, a.scale);
          ok[i] = valid ? 1.0f : 0.0f;
        }
      }
      __syncthreads();
      if (warp == 0) {
        // The block's bookkeeping on warp 0: the max is order-free; the fp32 block sum is a fixed
        // tree (the CPU sums in list order: equal up to rounding).
        const float m = s_m;
        float bm = m;
        for (int i = lane; i < nb; i += kWarp) {
          const float v = sc[i];
          if (ok[i] != 0.0f) bm = v > bm ? v : bm;
        }
        bm = warp_max(bm);
        const float alpha = m == -INFINITY ? 0.0f : expf(sub_rn(m, bm));
        float bsum = 0.0f;
        for (int i = lane; i < nb; i += kWarp) {
          if (ok[i] == 0.0f || bm == -INFINITY) {
            pb[i] = 0.0f;
            continue;
          }
          const float e = expf(sub_rn(sc[i], bm));
          bsum = add_rn(bsum, e);
          pb[i] = b16 ? round_bf16(e) : e;
        }
        bsum = warp_sum(bsum);
        if (lane == 0) {
          s_alpha = alpha;
          s_l = add_rn(mul_rn(s_l, alpha), bsum);
          s_m = bm;
        }
      }
      __syncthreads();
      const float alpha = s_alpha;
#pragma unroll
      for (int j = 0; j < kMaxDimPerThread; ++j) acc[j] = mul_rn(acc[j], alpha);
      for (int i = 0; i < nb; ++i) {
        const float pr = pb[i];
        if (ok[i] == 0.0f) continue;
        const float* kv = p.kv + static_cast<int64_t>(idx[i0 + i]) * a.ldkv;
#pragma unroll
        for (int j = 0; j < kMaxDimPerThread; ++j) {
          const int64_t d = threadIdx.x + static_cast<int64_t>(j) * kThreads;
          if (d < D) acc[j] = fmaf(pr, kv[d], acc[j]);
        }
      }
      __syncthreads();  // sc / pb / s_alpha reused by the next block
    }
    const float m = s_m;
    float* o = p.out + t * a.ots + h * D;
    const float z = m == -INFINITY ? 1.0f : add_rn(s_l, expf(sub_rn(p.sink[h], m)));
#pragma unroll
    for (int j = 0; j < kMaxDimPerThread; ++j) {
      const int64_t d = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      if (d >= D) continue;
      float v = m == -INFINITY ? 0.0f : div_rn(acc[j], z);
      o[d] = b16 ? round_bf16(v) : v;
    }
    __syncthreads();  // qs / s_m reused by the next (token, head)
  }
}

}  // namespace

void sparse_attn(const SparseAttnParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK_MSG(p.dim <= kThreads * kMaxDimPerThread, "sparse_attn: dim <= 1024");
  TANDEM_CHECK_MSG(p.block <= kMaxBlock, "sparse_attn: block <= 1024");
  AttnArgs a{p, 0, 0, 0, 0, 0.0f};
  a.ldkv = p.ldkv > 0 ? p.ldkv : p.dim;
  a.ldi = p.ldi > 0 ? p.ldi : p.topk;
  a.qts = p.q_token_stride > 0 ? p.q_token_stride : p.heads * p.dim;
  a.ots = p.out_token_stride > 0 ? p.out_token_stride : p.heads * p.dim;
  a.scale = p.scale > 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.dim)));
  const size_t smem = smem_bytes(p.dim, p.block);
  sparse_attn_kernel<<<grid_for(p.tokens * p.heads, 1), kThreads, smem, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

SmemBound sparse_attn_smem_bound() {
  return {"sparse_attn_kernel", static_cast<int64_t>(smem_bytes(kThreads * kMaxDimPerThread, kMaxBlock)),
          "dim 1024, block 1024 (the launcher's limits)", ""};
}

}  // namespace tandem::kernels::cuda
