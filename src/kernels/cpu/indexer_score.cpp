// Lightning-indexer scores I[t][s] = sum_h w[t][h] * relu(q[t][h] . k[s]) with the reference's
// bf16 rounding points; entries past visible[t] get -inf. The q.k products are one GEMM per
// (token group, entry chunk) through cpu::gemm (batch-invariant), then a parallel epilogue.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void indexer_score(const IndexerScoreParams& p) {
  validate(p);
  const int64_t ldk = ld_or(p.ldk, p.dim), lds = ld_or(p.lds, p.entries);
  const int64_t H = p.heads, D = p.dim;
  const bool b16 = p.bf16_numerics;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t tg = std::max<int64_t>(1, 512 / H);      // tokens per GEMM (rows = tg * H)
  const int64_t sc = 512;                                 // entries per GEMM
  // One parallel region over (token group, entry chunk) items; each item runs its GEMM serially
  // (no per-chunk barriers) followed by its epilogue.
  const int64_t ntg = (p.tokens + tg - 1) / tg, nsc = (p.entries + sc - 1) / sc;
  const int64_t work = ntg * nsc;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(work, 2.0 * tg * H * sc * D))
  for (int64_t wi = 0; wi < work; ++wi) {
    const int64_t t0 = (wi / nsc) * tg, s0 = (wi % nsc) * sc;
    const int64_t nt = std::min(tg, p.tokens - t0), ns = std::min(sc, p.entries - s0);
    float* dots = thread_scratch(static_cast<size_t>(tg * H * sc + (ldk != D ? sc * D : 0)), 1);
    float* kpack = dots + tg * H * sc;
    int64_t vmax = 0;
    for (int64_t t = t0; t < t0 + nt; ++t) vmax = std::max<int64_t>(vmax, std::clamp<int64_t>(p.visible[t], 0, p.entries));
    const int64_t nvis = std::clamp<int64_t>(vmax - s0, 0, ns);
    if (nvis > 0) {
      const float* kc = p.k + s0 * ldk;
      if (ldk != D) {
        for (int64_t s = 0; s < nvis; ++s) std::memcpy(kpack + s * D, kc + s * ldk, sizeof(float) * D);
        kc = kpack;
      }
      GemmParams g;
      g.x = p.q + t0 * H * D;
      g.w.format = WeightFormat::kF32;
      g.w.data = kc;
      g.w.n = nvis;
      g.w.k = D;
      g.y = dots;
      g.m = nt * H;
      g.n = nvis;
      g.k = D;
      g.ldy = sc;
      gemm(g);
    }
    // Epilogue over 16-entry groups: heads summed in ascending order (fp32), bf16 roundings at the
    // reference's points; vectorized across entries.
    for (int64_t tt = 0; tt < nt; ++tt) {
      const int64_t t = t0 + tt, vis = p.visible[t];
      float* out = p.scores + t * lds + s0;
      const float* w = p.w + t * H;
      for (int64_t s = 0; s < ns; s += 16) {
        if (s + 16 <= nvis) {
          vf16 total = {};
          for (int64_t h = 0; h < H; ++h) {
            vf16 dot = load16(dots + (tt * H + h) * sc + s);
            if (b16) dot = round_bf16_v(dot);
            vf16 term = (vf16)((vi16)dot & (vi16)(dot > 0.0f)) * w[h];
            if (b16) term = round_bf16_v(term);
            total += term;
          }
          if (b16) total = round_bf16_v(total);
          float tmp[16];
          store16(tmp, total);
          for (int i = 0; i < 16; ++i) out[s + i] = s0 + s + i < vis ? tmp[i] : kNegInf;
          continue;
        }
        for (int64_t si = s; si < std::min(s + 16, ns); ++si) {
          if (s0 + si >= vis) {
            out[si] = kNegInf;
            continue;
          }
          float total = 0.0f;
          for (int64_t h = 0; h < H; ++h) {
            float dot = dots[(tt * H + h) * sc + si];
            if (b16) dot = num::round_bf16(dot);
            float term = (dot > 0.0f ? dot : 0.0f) * w[h];
            if (b16) term = num::round_bf16(term);
            total += term;
          }
          out[si] = b16 ? num::round_bf16(total) : total;
        }
      }
    }
  }
}

}  // namespace tandem::kernels::cpu
