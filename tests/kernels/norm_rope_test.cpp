// rms_norm (fp32 and the bf16 chain), RoPE + YaRN table, Hadamard.
#include <gtest/gtest.h>

#include <cmath>

#include "bit_compare.h"
#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
using testing::bf16d;
using testing::close;
using testing::correctly_rounded;
using testing::randn;
using testing::Stored;

TEST(RmsNorm, WeightedWeightlessAndStrides) {
  const int64_t rows = 5, dim = 300, ld = 310;
  auto x = randn(rows * ld, 1, 2.0f);
  auto wf = randn(dim, 2, 1.0f);
  std::vector<uint16_t> wb(dim);
  for (int64_t i = 0; i < dim; ++i) wb[i] = num::f32_to_bf16(wf[i]);
  // variants: 0 weightless fp32, 1 fp32 weight, 2 bf16 weight + bf16 output, 3 fp32 weight + bf16 output
  for (int variant = 0; variant < 4; ++variant) {
    const bool to_bf16 = variant >= 2;
    std::vector<float> y(rows * dim);
    RmsNormParams p;
    p.x = x.data();
    p.ldx = ld;
    p.y = y.data();
    p.rows = rows;
    p.dim = dim;
    if (variant == 1 || variant == 3) p.weight = wf.data();
    if (variant == 2) p.weight_bf16 = wb.data();
    p.round_bf16 = to_bf16;
    cpu::rms_norm(p);
    std::vector<double> want(rows * dim), fp32_err(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[r * ld + i]) * x[r * ld + i];
      const double rs = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int64_t i = 0; i < dim; ++i) {
        double v = x[r * ld + i] * rs;
        if (variant >= 1) v *= wf[i];
        want[r * dim + i] = v;
        fp32_err[r * dim + i] = 1e-6 * std::fabs(v);  // a few fp32 roundings before the bf16 one
      }
    }
    if (to_bf16) {
      // The stored value is bf16(fp32 value): representable and within half a bf16 ulp.
      EXPECT_TRUE(correctly_rounded(y, want, Stored::kBf16, 0.0, &fp32_err)) << "variant " << variant;
    } else {
      EXPECT_TRUE(close(y, want, 1e-7, 2e-6)) << "variant " << variant;
    }
  }
}

TEST(RmsNorm, InPlaceAndBf16Chain) {
  const int64_t rows = 4, dim = 512;
  auto x = randn(rows * dim, 3, 0.7f);
  auto x0 = x;
  RmsNormParams p;
  p.x = x.data();
  p.y = x.data();
  p.rows = rows;
  p.dim = dim;
  p.mode = RmsNormMode::kBf16Chain;
  cpu::rms_norm(p);
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += num::round_bf16(x0[r * dim + i] * x0[r * dim + i]);
    const float mean = num::round_bf16(sum / dim);
    const float rs = num::round_bf16(static_cast<float>(1.0 / std::sqrt(double(num::round_bf16(mean + 1e-6f)))));
    for (int64_t i = 0; i < dim; ++i) {
      ASSERT_EQ(x[r * dim + i], num::round_bf16(x0[r * dim + i] * rs)) << r << "," << i;
    }
    // Result is unit RMS to bf16 accuracy.
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    EXPECT_NEAR(std::sqrt(ss / dim), 1.0, 0.02);
  }
}

TEST(Rope, YarnTableMatchesSpec) {
  float f[32], plain[32];
  RopeFreqParams p;
  p.inv_freq = f;
  p.base = 160000.0;
  p.original_seq_len = 65536;
  p.factor = 16.0;
  rope_inv_freq(p);
  RopeFreqParams q;
  q.inv_freq = plain;
  q.base = 160000.0;
  rope_inv_freq(q);
  // Spec 4.2: for base 160000, low = 15, high = 25.
  for (int i = 0; i < 32; ++i) {
    const double w = std::pow(160000.0, -2.0 * i / 64.0);
    EXPECT_NEAR(plain[i], w, 1e-6 * w);
    const double ramp = std::clamp((i - 15.0) / 10.0, 0.0, 1.0);
    const double want = w / 16.0 * ramp + w * (1.0 - ramp);
    EXPECT_NEAR(f[i], want, 2e-6 * want) << i;
    if (i <= 15) {
      EXPECT_EQ(f[i], plain[i]);
    }
  }
  EXPECT_NEAR(f[31], plain[31] / 16.0f, 1e-6 * plain[31]);
}

TEST(Rope, RotatesTailPairsAndInverseUndoes) {
  const int64_t tokens = 3, heads = 2, hd = 80, rope_off = 16, rd = 64;
  float inv[32];
  RopeFreqParams fp;
  fp.inv_freq = inv;
  rope_inv_freq(fp);
  auto x = randn(tokens * heads * hd, 4);
  auto x0 = x;
  int64_t pos[3] = {0, 7, 1048575};
  RopeParams p;
  p.x = x.data();
  p.positions = pos;
  p.inv_freq = inv;
  p.tokens = tokens;
  p.heads = heads;
  p.rope_offset = rope_off;
  p.rope_dim = rd;
  cpu::rope(p);
  std::vector<double> want(x.size());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t b = (t * heads + h) * hd;
      for (int64_t i = 0; i < rope_off; ++i) want[b + i] = x0[b + i];
      for (int i = 0; i < rd / 2; ++i) {
        const double ang = double(static_cast<float>(pos[t]) * inv[i]);
        const double a = x0[b + rope_off + 2 * i], c = x0[b + rope_off + 2 * i + 1];
        want[b + rope_off + 2 * i] = a * std::cos(ang) - c * std::sin(ang);
        want[b + rope_off + 2 * i + 1] = a * std::sin(ang) + c * std::cos(ang);
      }
    }
  EXPECT_TRUE(close(x, want, 1e-6, 1e-5));
  p.inverse = true;
  cpu::rope(p);
  std::vector<double> orig(x0.begin(), x0.end());
  EXPECT_TRUE(close(x, orig, 1e-5, 1e-5));
}

TEST(Hadamard, MatchesExplicitMatrixAndIsInvolution) {
  const int64_t n = 128, rows = 3, ld = 130;
  auto x = randn(rows * ld, 5);
  auto x0 = x;
  HadamardParams p;
  p.x = x.data();
  p.rows = rows;
  p.n = n;
  p.ldx = ld;
  cpu::hadamard(p);
  std::vector<double> want(rows * ld);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += (__builtin_popcountll(i & j) & 1 ? -1.0 : 1.0) * x0[r * ld + j];
      want[r * ld + i] = s / std::sqrt(double(n));
    }
    for (int64_t i = n; i < ld; ++i) want[r * ld + i] = x0[r * ld + i];
  }
  EXPECT_TRUE(close(x, want, 1e-6, 1e-5));
  cpu::hadamard(p);
  std::vector<double> orig(x0.begin(), x0.end());
  EXPECT_TRUE(close(x, orig, 1e-5, 1e-5));
}


// apply_rotary_emb on a bf16 tensor: the rotated pair is stored as bf16 (round to nearest even of
// the fp32 result). Positions up to 2^20 give angles whose fp32 cos/sin differ from float64 ones by
// a few fp32 ulps only, which the slack covers; truncation or a skipped rounding does not fit.
TEST(Rope, Bf16OutputIsCorrectlyRounded) {
  const int64_t tokens = 6, heads = 3, hd = 80, rope_off = 16, rd = 64;
  float inv[32];
  RopeFreqParams fp;
  fp.inv_freq = inv;
  fp.base = 160000.0;
  fp.original_seq_len = 65536;
  fp.factor = 16.0;
  rope_inv_freq(fp);
  auto x = randn(tokens * heads * hd, 14, 3.0f);
  const auto x0 = x;
  int64_t pos[6] = {0, 1, 7, 513, 65535, 1048575};
  RopeParams p;
  p.x = x.data();
  p.positions = pos;
  p.inv_freq = inv;
  p.tokens = tokens;
  p.heads = heads;
  p.rope_offset = rope_off;
  p.rope_dim = rd;
  p.round_bf16 = true;
  for (bool inverse : {false, true}) {
    x = x0;
    p.inverse = inverse;
    cpu::rope(p);
    std::vector<double> want(x.size()), err(x.size(), 0.0);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t b = (t * heads + h) * hd;
        for (int64_t i = 0; i < rope_off; ++i) want[b + i] = x0[b + i];  // untouched, already bf16
        for (int i = 0; i < rd / 2; ++i) {
          const double ang = double(static_cast<float>(pos[t]) * inv[i]);
          const double c = std::cos(ang), sn = inverse ? -std::sin(ang) : std::sin(ang);
          const double a = x0[b + rope_off + 2 * i], bb = x0[b + rope_off + 2 * i + 1];
          want[b + rope_off + 2 * i] = a * c - bb * sn;
          want[b + rope_off + 2 * i + 1] = a * sn + bb * c;
          // fp32 cos/sin (1 ulp each), two products and a sum: a few fp32 ulps of |a| + |b|.
          err[b + rope_off + 2 * i] = err[b + rope_off + 2 * i + 1] = 6e-7 * (std::fabs(a) + std::fabs(bb));
        }
      }
    EXPECT_TRUE(correctly_rounded(x, want, Stored::kBf16, 0.0, &err)) << "inverse " << inverse;
  }
}

// rotate_activation before fp4_act_quant: H x / sqrt(n) stored as bf16.
TEST(Hadamard, Bf16OutputIsCorrectlyRounded) {
  const int64_t n = 128, rows = 4;
  auto x = randn(rows * n, 15, 2.0f);
  const auto x0 = x;
  HadamardParams p;
  p.x = x.data();
  p.rows = rows;
  p.n = n;
  p.round_bf16 = true;
  cpu::hadamard(p);
  std::vector<double> want(rows * n), err(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    double l1 = 0;
    for (int64_t j = 0; j < n; ++j) l1 += std::fabs(x0[r * n + j]);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += (__builtin_popcountll(i & j) & 1 ? -1.0 : 1.0) * x0[r * n + j];
      want[r * n + i] = s / std::sqrt(double(n));
      // 7 butterfly stages and the scale, each one fp32 rounding of partial sums bounded by |x|_1.
      err[r * n + i] = 8 * 6e-8 * l1 / std::sqrt(double(n));
    }
  }
  EXPECT_TRUE(correctly_rounded(x, want, Stored::kBf16, 0.0, &err));
}

}  // namespace
}  // namespace tandem::kernels
