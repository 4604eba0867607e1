// Normalized Walsh-Hadamard transform (Sylvester order), the indexer's rotate_activation.
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void hadamard(const HadamardParams& p) {
  validate(p);
  const int64_t ldx = ld_or(p.ldx, p.n);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.n)));
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 2.0 * p.n * 8))
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * ldx;
    for (int64_t h = 1; h < p.n; h *= 2) {
      for (int64_t i = 0; i < p.n; i += 2 * h) {
#pragma omp simd
        for (int64_t j = i; j < i + h; ++j) {
          const float a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
      }
    }
    for (int64_t i = 0; i < p.n; ++i) {
      const float v = x[i] * scale;
      x[i] = p.round_bf16 ? num::round_bf16(v) : v;
    }
  }
}

}  // namespace tandem::kernels::cpu
