// RMSNorm (weighted / weightless), fp32 as RMSNorm in model.py, plus the bf16 op chain the
// reference uses for the per-head q normalization.
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void rms_norm(const RmsNormParams& p) {
  validate(p);
  const int64_t ldx = ld_or(p.ldx, p.dim), ldy = ld_or(p.ldy, p.dim);
  using num::round_bf16;
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 4.0 * p.dim))
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * ldx;
    float* y = p.y + r * ldy;
    if (p.mode == RmsNormMode::kBf16Chain) {
      float sum = 0.0f;  // torch accumulates a bf16 mean in fp32
      for (int64_t i = 0; i < p.dim; ++i) sum += round_bf16(x[i] * x[i]);
      const float mean = round_bf16(sum / static_cast<float>(p.dim));
      const float rs = round_bf16(1.0f / std::sqrt(round_bf16(mean + p.eps)));
      for (int64_t i = 0; i < p.dim; ++i) {
        float v = round_bf16(x[i] * rs);
        if (p.weight) v = round_bf16(p.weight[i] * v);
        if (p.weight_bf16) v = round_bf16(num::bf16_to_f32(p.weight_bf16[i]) * v);
        y[i] = v;
      }
      continue;
    }
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < p.dim; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float var = static_cast<float>(ss / static_cast<double>(p.dim));
    const float rs = 1.0f / std::sqrt(var + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      float v = x[i] * rs;
      if (p.weight) v = p.weight[i] * v;
      if (p.weight_bf16) v = num::bf16_to_f32(p.weight_bf16[i]) * v;
      y[i] = p.round_bf16 ? round_bf16(v) : v;
    }
  }
}

}  // namespace tandem::kernels::cpu
