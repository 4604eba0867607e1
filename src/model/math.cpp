// Internal fp32 building blocks of the CPU forward pass (see math.h).
#include "model/math.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
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

namespace {
std::atomic<bool> g_softmax_jitter{false};
// One ulp down (1), none (0) or up (2) by a hash of the weight's bits, its head and key index.
float jittered(float p, int64_t h, size_t i) {
  uint64_t x = (static_cast<uint64_t>(num::f32_bits(p)) << 24) ^ (static_cast<uint64_t>(h) << 52) ^ i;
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  switch (x % 3) {
    case 1: return std::nextafter(p, 0.0f);
    case 2: return std::nextafter(p, INFINITY);
    default: return p;
  }
}
}  // namespace

void set_softmax_jitter(bool on) { g_softmax_jitter.store(on, std::memory_order_relaxed); }

void attend(const float* q, int64_t heads, int64_t hd, const float* const* keys, size_t nk, const float* sink,
            float* o, float* scores) {
  const bool jitter = g_softmax_jitter.load(std::memory_order_relaxed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * hd;
    float mx = -INFINITY;
    for (size_t i = 0; i < nk; ++i) {
      scores[i] = dot(qh, keys[i], hd) * scale;
      mx = std::max(mx, scores[i]);
    }
    float* oh = o + h * hd;
    std::fill(oh, oh + hd, 0.0f);
    float z = 0.0f;
    for (size_t i = 0; i < nk; ++i) {
      float p = std::exp(scores[i] - mx);
      if (jitter && scores[i] != mx) p = jittered(p, h, i);  // exp(0) = 1 exactly everywhere
      z += p;
      const float* k = keys[i];
      for (int64_t d = 0; d < hd; ++d) oh[d] += p * k[d];
    }
    const float ps = std::exp(sink[h] - mx);
    z += jitter ? jittered(ps, h, nk) : ps;
    for (int64_t d = 0; d < hd; ++d) oh[d] = num::round_bf16(oh[d] / z);
  }
}

void hc_pre(const HcShape& sh, const float* h, int64_t n, const float* fn, const float* scale, const float* base,
            float* x, float* post, float* comb, float* mixes) {
  const int hc = sh.hc;
  const int64_t D = sh.dim, HD = hc * D, mix = (2 + hc) * hc;
  const float eps = sh.norm_eps, heps = sh.hc_eps;
  for (int64_t t = 0; t < n; ++t) {
    const float* ht = h + t * HD;
    double ss = 0.0;
    for (int64_t i = 0; i < HD; ++i) ss += static_cast<double>(ht[i]) * ht[i];
    const float rs = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(HD)) + eps);
    for (int64_t m = 0; m < mix; ++m) mixes[m] = dot(ht, fn + m * HD, HD) * rs;
    float pre[16];
    float* pt = post + t * hc;
    float* c = comb + t * hc * hc;
    for (int j = 0; j < hc; ++j) pre[j] = 1.0f / (1.0f + std::exp(-(mixes[j] * scale[0] + base[j]))) + heps;
    for (int j = 0; j < hc; ++j) pt[j] = 2.0f / (1.0f + std::exp(-(mixes[j + hc] * scale[1] + base[j + hc])));
    for (int j = 0; j < hc; ++j)
      for (int k = 0; k < hc; ++k) c[j * hc + k] = mixes[j * hc + k + 2 * hc] * scale[2] + base[j * hc + k + 2 * hc];
    // softmax over rows + eps, column normalise, then (iters-1) x (row, column).
    for (int j = 0; j < hc; ++j) {
      float mx = c[j * hc];
      for (int k = 1; k < hc; ++k) mx = std::max(mx, c[j * hc + k]);
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += (c[j * hc + k] = std::exp(c[j * hc + k] - mx));
      for (int k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + heps;
    }
    auto col_norm = [&] {
      for (int k = 0; k < hc; ++k) {
        float cs = 0.0f;
        for (int j = 0; j < hc; ++j) cs += c[j * hc + k];
        for (int j = 0; j < hc; ++j) c[j * hc + k] /= (cs + heps);
      }
    };
    auto row_norm = [&] {
      for (int j = 0; j < hc; ++j) {
        float rsum = 0.0f;
        for (int k = 0; k < hc; ++k) rsum += c[j * hc + k];
        for (int k = 0; k < hc; ++k) c[j * hc + k] /= (rsum + heps);
      }
    };
    col_norm();
    for (int it = 0; it < sh.sinkhorn_iters - 1; ++it) {
      row_norm();
      col_norm();
    }
    float* xt = x + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int j = 0; j < hc; ++j) acc += pre[j] * ht[j * D + d];
      xt[d] = num::round_bf16(acc);
    }
  }
}

void hc_head(const HcShape& sh, const float* h, int64_t n, const float* fn, const float* scale, const float* base,
             float* y) {
  const int hc = sh.hc;
  const int64_t D = sh.dim, HD = hc * D;
  const float eps = sh.norm_eps, heps = sh.hc_eps;
  for (int64_t t = 0; t < n; ++t) {
    const float* ht = h + t * HD;
    double ss = 0.0;
    for (int64_t i = 0; i < HD; ++i) ss += static_cast<double>(ht[i]) * ht[i];
    const float rs = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(HD)) + eps);
    float pre[16];
    for (int j = 0; j < hc; ++j) {
      const float m = dot(ht, fn + j * HD, HD) * rs;
      pre[j] = 1.0f / (1.0f + std::exp(-(m * scale[0] + base[j]))) + heps;
    }
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int j = 0; j < hc; ++j) acc += pre[j] * ht[j * D + d];
      y[t * D + d] = num::round_bf16(acc);
    }
  }
}

void compressor_rows(const float* kv, const float* gate, const float* ape, int64_t n, int64_t chans, int ratio,
                     int64_t start_pos, float* rows) {
  const int64_t C = chans;
  for (int64_t t = 0; t < n; ++t) std::memcpy(&rows[t * 2 * C], &kv[t * C], sizeof(float) * C);
  for (int64_t t = 0; t < n; ++t) {
    const float* a = ape + ((start_pos + t) % ratio) * C;
    for (int64_t c = 0; c < C; ++c) rows[t * 2 * C + C + c] = gate[t * C + c] + a[c];
  }
}

void taps_mean(const float* h, int hc, int64_t dim, float* dst) {
  for (int64_t d = 0; d < dim; ++d) {
    float acc = 0.0f;
    for (int k = 0; k < hc; ++k) acc += h[k * dim + d];
    dst[d] = num::round_bf16(acc / static_cast<float>(hc));
  }
}

void scale_round_bf16(float* x, int64_t n, float scale) {
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

}  // namespace tandem::model
