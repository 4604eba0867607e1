// Internal fp32 building blocks of the CPU forward pass (see math.h).
#include "model/math.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "common/numeric.h"
#include "kernels/ops.h"

namespace tandem::model {

void round_bf16(float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = num::round_bf16(x[i]);
}

// x86-64: an AVX2 clone picked at load time where available; same per-lane operations in the same
// order as the default (SSE) clone, so results are bit-identical (no FMA contraction: fma is not
// enabled). Other CPUs (aarch64: NEON) compile the one portable version.
#if defined(__x86_64__)
#define TANDEM_DOT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TANDEM_DOT_CLONES
#endif
TANDEM_DOT_CLONES float dot(const float* a, const float* b, int64_t n) {
  // 8 independent partial sums in a fixed pattern (lane j sums elements i with i % 8 == j), as a
  // GCC vector so it vectorizes without -ffast-math; the order does not depend on the caller's
  // batching.
  typedef float v8 __attribute__((vector_size(32)));
  v8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8 va, vb;
    std::memcpy(&va, a + i, sizeof(v8));
    std::memcpy(&vb, b + i, sizeof(v8));
    acc += va * vb;
  }
  float r[8];
  std::memcpy(r, &acc, sizeof(r));
  for (; i < n; ++i) r[i & 7] += a[i] * b[i];
  return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
}

void RopeTable::build(int dim, int64_t original_seq_len, double base, double factor,
                      double beta_fast, double beta_slow) {
  rope_dim = dim;
  freqs.assign(static_cast<size_t>(dim / 2), 0.0f);
  kernels::RopeFreqParams p;
  p.inv_freq = freqs.data();
  p.rope_dim = dim;
  p.base = base;
  p.original_seq_len = original_seq_len;
  p.factor = factor;
  p.beta_fast = beta_fast;
  p.beta_slow = beta_slow;
  kernels::rope_inv_freq(p);
}

}  // namespace tandem::model
