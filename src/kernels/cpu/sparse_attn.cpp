// Sparse MQA over a per-token index list with a per-head attention sink, reproducing the reference
// kernel's blocked online softmax: running max per block of `block` list positions, fp32
// denominators, probabilities rounded to bf16 before P.V, and the accumulator rescaled by
// exp(m_old - m_new) at each block (applied here as the suffix product of those factors, which is
// the same arithmetic moved onto the probabilities). Per token: gather the listed rows once, then
// scores S = Q G^T and output O = P' G are two batch-invariant GEMMs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {
namespace {

void gemm_f32(const float* x, int64_t ldx, const float* w, int64_t n, int64_t k, float* y, int64_t ldy, int64_t m) {
  GemmParams g;
  g.x = x;
  g.ldx = ldx;
  g.w.format = WeightFormat::kF32;
  g.w.data = w;
  g.w.n = n;
  g.w.k = k;
  g.y = y;
  g.ldy = ldy;
  g.m = m;
  g.n = n;
  g.k = k;
  gemm(g);
}

}  // namespace

void sparse_attn(const SparseAttnParams& p) {
  validate(p);
  const int64_t H = p.heads, D = p.dim, K = p.topk;
  const int64_t ldkv = ld_or(p.ldkv, D), ldi = ld_or(p.ldi, K);
  const int64_t qts = ld_or(p.q_token_stride, H * D), ots = ld_or(p.out_token_stride, H * D);
  const float scale = p.scale > 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const int64_t blk = p.block;
  const int64_t nblk = (K + blk - 1) / blk;
  const bool b16 = p.bf16_numerics;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (K == 0) {
    for (int64_t t = 0; t < p.tokens; ++t)
      for (int64_t h = 0; h < H; ++h) std::memset(p.out + t * ots + h * D, 0, sizeof(float) * D);
    return;
  }
  // One parallel region over (token, head group) work items; each runs its GEMMs single-threaded
  // (nested regions are serialized), so there is no barrier per token (barriers are costly on a
  // busy machine).
  const int64_t hg = std::min<int64_t>(H, 8);
  const int64_t groups = (H + hg - 1) / hg;
  const int64_t work = p.tokens * groups;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(work, 4.0 * hg * K * D))
  for (int64_t wi = 0; wi < work; ++wi) {
    const int64_t t = wi / groups, h0 = (wi % groups) * hg, nh = std::min(hg, H - h0);
    float* buf = thread_scratch(static_cast<size_t>(2 * K * D + 2 * nh * K + nh * D + nblk), 1);
    float* g = buf;              // [K, D] gathered rows (zeros for -1)
    float* gt = g + K * D;       // [D, K] transposed
    float* s = gt + K * D;       // [nh, K] raw dots
    float* pp = s + nh * K;      // [nh, K] scaled probabilities P'
    float* acc = pp + nh * K;    // [nh, D]
    float* alpha = acc + nh * D; // [nblk]
    const int32_t* idx = p.idx + t * ldi;
    for (int64_t i = 0; i < K; ++i) {
      if (idx[i] >= 0) {
        TANDEM_DCHECK(idx[i] < p.kv_rows);
        std::memcpy(g + i * D, p.kv + static_cast<int64_t>(idx[i]) * ldkv, sizeof(float) * D);
      } else {
        std::memset(g + i * D, 0, sizeof(float) * D);
      }
    }
    gemm_f32(p.q + t * qts + h0 * D, D, g, K, D, s, K, nh);
    for (int64_t d0 = 0; d0 < D; d0 += 16)
      for (int64_t i = 0; i < K; ++i)
        for (int64_t d = d0; d < std::min(D, d0 + 16); ++d) gt[d * K + i] = g[i * D + d];
    float mfin[8], lsum[8];
    for (int64_t h = 0; h < nh; ++h) {
      const float* sh = s + h * K;
      float* ph = pp + h * K;
      float m = kNegInf, l = 0.0f;
      for (int64_t b = 0; b < nblk; ++b) {
        const int64_t i0 = b * blk, i1 = std::min(K, i0 + blk);
        float bm = m;
        for (int64_t i = i0; i < i1; ++i) {
          if (idx[i] < 0) continue;
          const float v = sh[i] * scale;
          bm = v > bm ? v : bm;
        }
        const float a = m == kNegInf ? 0.0f : std::exp(m - bm);
        float bsum = 0.0f;
        for (int64_t i = i0; i < i1; ++i) {
          if (idx[i] < 0 || bm == kNegInf) {
            ph[i] = 0.0f;
            continue;
          }
          const float e = std::exp(sh[i] * scale - bm);
          bsum += e;
          ph[i] = b16 ? num::round_bf16(e) : e;
        }
        alpha[b] = a;
        l = l * a + bsum;
        m = bm;
      }
      // Accumulator rescaling of later blocks, as suffix products: block b is scaled by
      // alpha[b+1] * ... * alpha[nblk-1].
      float f = 1.0f;
      for (int64_t b = nblk - 1; b >= 0; --b) {
        if (f != 1.0f)
          for (int64_t i = b * blk; i < std::min(K, (b + 1) * blk); ++i) ph[i] *= f;
        f *= alpha[b];
      }
      mfin[h] = m;
      lsum[h] = l;
    }
    gemm_f32(pp, K, gt, D, K, acc, D, nh);
    for (int64_t h = 0; h < nh; ++h) {
      float* o = p.out + t * ots + (h0 + h) * D;
      if (mfin[h] == kNegInf) {
        std::memset(o, 0, sizeof(float) * D);
        continue;
      }
      const float z = lsum[h] + std::exp(p.sink[h0 + h] - mfin[h]);
      const float* a = acc + h * D;
      for (int64_t d = 0; d < D; ++d) {
        const float v = a[d] / z;
        o[d] = b16 ? num::round_bf16(v) : v;
      }
    }
  }
}

}  // namespace tandem::kernels::cpu
