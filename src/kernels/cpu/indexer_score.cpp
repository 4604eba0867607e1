// Lightning-indexer scores I[t][s] = sum_h w[t][h] * relu(q[t][h] . k[s]) with the reference's
// bf16 rounding points; entries past visible[t] get -inf.
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void indexer_score(const IndexerScoreParams& p) {
  validate(p);
  const int64_t ldk = ld_or(p.ldk, p.dim), lds = ld_or(p.lds, p.entries);
  const int64_t H = p.heads, D = p.dim;
  const bool b16 = p.bf16_numerics;
  // Parallel over (token, entry-chunk): decode has one token and many entries.
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (p.entries + kChunk - 1) / kChunk;
  const int64_t work = p.tokens * chunks;
#pragma omp parallel for schedule(static) num_threads(threads_for(work, 2.0 * kChunk * H * D))
  for (int64_t wi = 0; wi < work; ++wi) {
    const int64_t t = wi / chunks, c = wi % chunks;
    const float* q = p.q + t * H * D;
    const float* w = p.w + t * H;
    float* out = p.scores + t * lds;
    const int64_t vis = p.visible[t];
    const int64_t s0 = c * kChunk, s1 = std::min(p.entries, s0 + kChunk);
    for (int64_t s = s0; s < s1; ++s) {
      if (s >= vis) {
        out[s] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float* k = p.k + s * ldk;
      float total = 0.0f;
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q + h * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < D; ++i) dot += qh[i] * k[i];
        if (b16) dot = num::round_bf16(dot);
        float term = (dot > 0.0f ? dot : 0.0f) * w[h];
        if (b16) term = num::round_bf16(term);
        total += term;
      }
      out[s] = b16 ? num::round_bf16(total) : total;
    }
  }
}

}  // namespace tandem::kernels::cpu
