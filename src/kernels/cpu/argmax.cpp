// Row argmax: first maximum wins; NaN counts as the maximum (torch.argmax).
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void argmax(const ArgmaxParams& p) {
  validate(p);
  const int64_t ldx = ld_or(p.ldx, p.n);
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 1.0 * p.n))
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * ldx;
    int64_t best = 0;
    for (int64_t i = 1; i < p.n; ++i) {
      if (std::isnan(x[best])) break;
      if (std::isnan(x[i]) || x[i] > x[best]) best = i;
    }
    p.out[r] = static_cast<int32_t>(best);
    if (p.max_value) p.max_value[r] = x[best];
  }
}

}  // namespace tandem::kernels::cpu
