// Pieces shared by hc_pre and hc_head: the normalized mixing projection and the stream collapse.
#pragma once

#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

// mixes[t][j] = (fn[j] . h[t]) * rsqrt(mean(h[t]^2) + eps); returns per-call scratch
// (calling thread's slot 2) of [tokens, nmix].
inline float* hc_mixes(const float* h, const float* fn, int64_t tokens, int nmix, int64_t hd, float eps) {
  float* mixes = thread_scratch(static_cast<size_t>(tokens * nmix), 2);
  GemmParams g;
  g.x = h;
  g.w.format = WeightFormat::kF32;
  g.w.data = fn;
  g.w.n = nmix;
  g.w.k = hd;
  g.y = mixes;
  g.m = tokens;
  g.n = nmix;
  g.k = hd;
  gemm(g);
#pragma omp parallel for schedule(static) num_threads(threads_for(tokens, 2.0 * hd))
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = h + t * hd;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < hd; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(hd)) + eps);
    for (int j = 0; j < nmix; ++j) mixes[t * nmix + j] *= r;
  }
  return mixes;
}

// y[d] = sum_i pre[i] * h[i][d] (fp32, i ascending), optionally bf16-rounded.
inline void hc_collapse(const float* h, const float* pre, int hc, int64_t dim, float* y, bool round) {
  for (int64_t d = 0; d < dim; ++d) {
    float s = 0.0f;
    for (int i = 0; i < hc; ++i) s += pre[i] * h[i * dim + d];
    y[d] = round ? num::round_bf16(s) : s;
  }
}

}  // namespace tandem::kernels::cpu
