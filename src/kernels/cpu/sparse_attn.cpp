// Sparse MQA over a per-token index list with a per-head attention sink, reproducing the reference
// kernel's blocked online softmax (running max per block of list positions, bf16 probabilities
// before P.V, fp32 denominators).
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void sparse_attn(const SparseAttnParams& p) {
  validate(p);
  const int64_t H = p.heads, D = p.dim;
  const int64_t ldkv = ld_or(p.ldkv, D), ldi = ld_or(p.ldi, p.topk);
  const int64_t qts = ld_or(p.q_token_stride, H * D), ots = ld_or(p.out_token_stride, H * D);
  const float scale = p.scale > 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t blk = p.block;
  const bool b16 = p.bf16_numerics;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Work item: one token and a group of heads (decode has a single token).
  const int64_t hg = H >= 8 ? 8 : H;
  const int64_t groups = (H + hg - 1) / hg;
  const int64_t work = p.tokens * groups;
#pragma omp parallel for schedule(static) num_threads(threads_for(work, 4.0 * hg * p.topk * D))
  for (int64_t wi = 0; wi < work; ++wi) {
    const int64_t t = wi / groups, h0 = (wi % groups) * hg, nh = std::min(hg, H - h0);
    float* acc = thread_scratch(static_cast<size_t>(nh * D + nh * blk), 0);
    float* prob = acc + nh * D;  // [nh, blk]
    float mrun[64], lsum[64];
    TANDEM_CHECK(nh <= 64);
    std::memset(acc, 0, sizeof(float) * nh * D);
    for (int64_t h = 0; h < nh; ++h) {
      mrun[h] = kNegInf;
      lsum[h] = 0.0f;
    }
    const int32_t* idx = p.idx + t * ldi;
    for (int64_t b0 = 0; b0 < p.topk; b0 += blk) {
      const int64_t bn = std::min(blk, p.topk - b0);
      // Scores for the block.
      for (int64_t h = 0; h < nh; ++h) {
        const float* q = p.q + t * qts + (h0 + h) * D;
        float bmax = mrun[h];
        for (int64_t i = 0; i < bn; ++i) {
          const int32_t r = idx[b0 + i];
          float s = kNegInf;
          if (r >= 0) {
            TANDEM_DCHECK(r < p.kv_rows);
            const float* kv = p.kv + static_cast<int64_t>(r) * ldkv;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += q[d] * kv[d];
            s = dot * scale;
          }
          prob[h * blk + i] = s;
          bmax = s > bmax ? s : bmax;
        }
        // Running max update; an all-masked prefix keeps m = -inf and contributes nothing.
        const float alpha = mrun[h] == kNegInf ? 0.0f : std::exp(mrun[h] - bmax);
        float bsum = 0.0f;
        for (int64_t i = 0; i < bn; ++i) {
          const float s = prob[h * blk + i];
          const float e = (s == kNegInf) ? 0.0f : std::exp(s - bmax);
          bsum += e;
          prob[h * blk + i] = b16 ? num::round_bf16(e) : e;
        }
        lsum[h] = lsum[h] * alpha + bsum;
        mrun[h] = bmax;
        float* a = acc + h * D;
        if (alpha != 1.0f) {
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
        }
      }
      // P.V for the block (rows shared by the head group).
      for (int64_t i = 0; i < bn; ++i) {
        const int32_t r = idx[b0 + i];
        if (r < 0) continue;
        const float* kv = p.kv + static_cast<int64_t>(r) * ldkv;
        for (int64_t h = 0; h < nh; ++h) {
          const float pr = prob[h * blk + i];
          float* a = acc + h * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] += pr * kv[d];
        }
      }
    }
    for (int64_t h = 0; h < nh; ++h) {
      float* o = p.out + t * ots + (h0 + h) * D;
      if (mrun[h] == kNegInf) {
        std::memset(o, 0, sizeof(float) * D);
        continue;
      }
      const float z = lsum[h] + std::exp(p.sink[h0 + h] - mrun[h]);
      const float* a = acc + h * D;
      for (int64_t d = 0; d < D; ++d) {
        const float v = a[d] / z;
        o[d] = b16 ? num::round_bf16(v) : v;
      }
    }
  }
}

}  // namespace tandem::kernels::cpu
