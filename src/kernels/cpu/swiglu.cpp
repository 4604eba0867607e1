// SwiGLU with the V4 clamp (up in [-limit, limit], gate <= limit) and optional routing weight.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void swiglu(const SwigluParams& p) {
  validate(p);
  const int64_t ldg = ld_or(p.ldg, p.cols), ldu = ld_or(p.ldu, p.cols), ldo = ld_or(p.ldo, p.cols);
  const bool clamp = p.limit > 0.0f;
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 20.0 * p.cols))
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* g = p.gate + r * ldg;
    const float* u = p.up + r * ldu;
    float* o = p.out + r * ldo;
    const float w = p.row_weight ? p.row_weight[r] : 1.0f;
    for (int64_t i = 0; i < p.cols; ++i) {
      float gv = g[i], uv = u[i];
      if (clamp) {
        uv = std::clamp(uv, -p.limit, p.limit);
        gv = std::min(gv, p.limit);
      }
      float v = gv / (1.0f + std::exp(-gv)) * uv;
      if (p.row_weight) v = w * v;
      o[i] = p.round_bf16 ? num::round_bf16(v) : v;
    }
  }
}

}  // namespace tandem::kernels::cpu
