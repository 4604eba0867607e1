// Interleaved rotary embedding on the tail dims (forward and conjugate), and the fp32 YaRN
// inverse-frequency table of precompute_freqs_cis.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels {

void rope_inv_freq(const RopeFreqParams& p) {
  TANDEM_CHECK(p.inv_freq && p.rope_dim > 0 && p.rope_dim % 2 == 0 && p.base > 1.0);
  const int half = p.rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2, fp32) / dim)), fp32 throughout.
    const float e = static_cast<float>(2 * i) / static_cast<float>(p.rope_dim);
    const float powv = static_cast<float>(std::pow(p.base, static_cast<double>(e)));
    p.inv_freq[i] = 1.0f / powv;
  }
  if (p.original_seq_len > 0) {
    const double two_pi = 2.0 * M_PI;
    auto corr = [&](double rot) {
      return p.rope_dim * std::log(static_cast<double>(p.original_seq_len) / (rot * two_pi)) / (2.0 * std::log(p.base));
    };
    double low = std::max(std::floor(corr(p.beta_fast)), 0.0);
    double high = std::min(std::ceil(corr(p.beta_slow)), static_cast<double>(p.rope_dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const float lin = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
      const float ramp = std::clamp(lin, 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      const float f = p.inv_freq[i];
      p.inv_freq[i] = f / static_cast<float>(p.factor) * (1.0f - smooth) + f * smooth;
    }
  }
}

namespace cpu {

void rope(const RopeParams& p) {
  validate(p);
  const int64_t head_stride = ld_or(p.head_stride, p.rope_offset + p.rope_dim);
  const int64_t token_stride = ld_or(p.token_stride, p.heads * head_stride);
  const int half = p.rope_dim / 2;
#pragma omp parallel for schedule(static) num_threads(threads_for(p.tokens, 8.0 * p.heads * p.rope_dim))
  for (int64_t t = 0; t < p.tokens; ++t) {
    float cs[256], sn[256];
    float* c = half <= 256 ? cs : thread_scratch(2 * half, 1);
    float* s = half <= 256 ? sn : c + half;
    const float pos = static_cast<float>(p.positions[t]);
    for (int i = 0; i < half; ++i) {
      const float ang = pos * p.inv_freq[i];
      c[i] = std::cos(ang);
      s[i] = p.inverse ? -std::sin(ang) : std::sin(ang);
    }
    for (int64_t h = 0; h < p.heads; ++h) {
      float* x = p.x + t * token_stride + h * head_stride + p.rope_offset;
      for (int i = 0; i < half; ++i) {
        const float a = x[2 * i], b = x[2 * i + 1];
        float re = a * c[i] - b * s[i];
        float im = a * s[i] + b * c[i];
        if (p.round_bf16) {
          re = num::round_bf16(re);
          im = num::round_bf16(im);
        }
        x[2 * i] = re;
        x[2 * i + 1] = im;
      }
    }
  }
}

}  // namespace cpu
}  // namespace tandem::kernels
