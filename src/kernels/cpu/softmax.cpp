// Row softmax / log-softmax with temperature, for sampling and verification.
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void softmax(const SoftmaxParams& p) {
  validate(p);
  const int64_t ldx = ld_or(p.ldx, p.n), ldy = ld_or(p.ldy, p.n);
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 20.0 * p.n))
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * ldx;
    float* y = p.y + r * ldy;
    float m = -INFINITY;
    for (int64_t i = 0; i < p.n; ++i) {
      const float v = x[i] / p.temperature;
      y[i] = v;
      m = v > m ? v : m;
    }
    double z = 0.0;
    for (int64_t i = 0; i < p.n; ++i) z += std::exp(static_cast<double>(y[i] - m));
    if (p.log) {
      const float lz = static_cast<float>(std::log(z));
      for (int64_t i = 0; i < p.n; ++i) y[i] = y[i] - m - lz;
    } else {
      const float inv = static_cast<float>(1.0 / z);
      for (int64_t i = 0; i < p.n; ++i) y[i] = std::exp(y[i] - m) * inv;
    }
  }
}

}  // namespace tandem::kernels::cpu
