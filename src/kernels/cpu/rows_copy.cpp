// Row gather (dst[i] = src[rows[i]]) and scatter-add (dst[rows[i]] += src[i]) for MoE dispatch.
#include <cstring>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void rows_copy(const RowsCopyParams& p) {
  validate(p);
  const int64_t lds = ld_or(p.lds, p.cols), ldd = ld_or(p.ldd, p.cols);
  if (p.gather) {
#pragma omp parallel for schedule(static) num_threads(threads_for(p.count, 1.0 * p.cols))
    for (int64_t i = 0; i < p.count; ++i)
      std::memcpy(p.dst + i * ldd, p.src + static_cast<int64_t>(p.rows[i]) * lds, sizeof(float) * p.cols);
    return;
  }
  // Scatter-add: rows may repeat, so run sequentially over rows, vectorized along columns.
  for (int64_t i = 0; i < p.count; ++i) {
    float* d = p.dst + static_cast<int64_t>(p.rows[i]) * ldd;
    const float* s = p.src + i * lds;
#pragma omp simd
    for (int64_t c = 0; c < p.cols; ++c) d[c] += s[c];
  }
}

}  // namespace tandem::kernels::cpu
