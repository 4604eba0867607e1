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

// AVX2 clone picked at load time where available; same per-lane operations in the same order as
// the default (SSE) clone, so results are bit-identical (no FMA contraction: fma is not enabled).
__attribute__((target_clones("avx2", "default"))) float dot(const float* a, const float* b, int64_t n) {
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

void matmul(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y, int threads) {
  const int64_t work = m * n * k;
  if (threads <= 0) threads = omp_get_max_threads();
  if (work < (1 << 20) || threads == 1) {  // a parallel region costs more than a small GEMV
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) y[r * n + c] = dot(x + r * k, w + c * k, k);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < n; ++c)
    for (int64_t r = 0; r < m; ++r) y[r * n + c] = dot(x + r * k, w + c * k, k);
}

void act_quant_fp8(float* x, int64_t rows, int64_t n, int64_t block, int64_t row_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * row_stride;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      const int64_t b1 = std::min(n, b0 + block);
      float amax = 0.0f;
      for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(row[i]));
      const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
      const float s = std::ldexp(1.0f, e);
      const float inv = std::ldexp(1.0f, -e);
      for (int64_t i = b0; i < b1; ++i) {
        float v = std::clamp(row[i] * inv, -num::kE4m3Max, num::kE4m3Max);
        row[i] = num::round_bf16(num::round_e4m3(v) * s);
      }
    }
  }
}

void act_quant_fp4(float* x, int64_t rows, int64_t n, int64_t row_stride) {
  constexpr int64_t block = 32;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * row_stride;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      const int64_t b1 = std::min(n, b0 + block);
      float amax = 0.0f;
      for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(row[i]));
      const int e = num::ue8m0_scale_exponent(amax, num::kE2m1Max, num::kFp4ActAmaxFloor);
      const float s = std::ldexp(1.0f, e);
      const float inv = std::ldexp(1.0f, -e);
      for (int64_t i = b0; i < b1; ++i) {
        float v = std::clamp(row[i] * inv, -num::kE2m1Max, num::kE2m1Max);
        row[i] = num::round_bf16(num::round_e2m1(v) * s);
      }
    }
  }
}

void rms_norm(const float* x, const float* weight, int64_t n, float eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float var = static_cast<float>(ss / static_cast<double>(n));
  const float r = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * r;
    if (weight) v *= weight[i];
    y[i] = num::round_bf16(v);
  }
}

void head_rms_norm_bf16(float* q, int64_t heads, int64_t dim, float eps) {
  for (int64_t h = 0; h < heads; ++h) {
    float* row = q + h * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += num::round_bf16(row[i] * row[i]);
    const float mean = num::round_bf16(static_cast<float>(ss / static_cast<double>(dim)));
    const float r = num::round_bf16(1.0f / std::sqrt(num::round_bf16(mean + eps)));
    for (int64_t i = 0; i < dim; ++i) row[i] = num::round_bf16(row[i] * r);
  }
}

void hadamard_bf16(float* x, int64_t n) {
  TANDEM_CHECK((n & (n - 1)) == 0);
  for (int64_t len = 1; len < n; len <<= 1)
    for (int64_t i = 0; i < n; i += 2 * len)
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = num::round_bf16(x[i] * scale);
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

void RopeTable::apply(float* x, int64_t pos, bool inverse) const {
  TANDEM_CHECK(pos >= 0);
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float ang = static_cast<float>(pos) * freqs[i];
    const float c = static_cast<float>(std::cos(static_cast<double>(ang)));
    const float sn = static_cast<float>(inverse ? -std::sin(static_cast<double>(ang)) : std::sin(static_cast<double>(ang)));
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = num::round_bf16(a * c - b * sn);
    x[2 * i + 1] = num::round_bf16(a * sn + b * c);
  }
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace tandem::model
