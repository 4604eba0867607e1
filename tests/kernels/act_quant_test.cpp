// act_quant_fp8 / fp4_act_quant / round_bf16 against an independent float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {
using testing::randn;

// Nearest value of a code table (ties to the code with even LSB), input already clamped.
double nearest(double x, const float* table, int ncodes, bool (*valid)(int)) {
  int best = -1;
  double bd = 0;
  for (int c = 0; c < ncodes; ++c) {
    if (!valid(c)) continue;
    double d = std::fabs(table[c] - x);
    if (best < 0 || d < bd || (d == bd && (c & 1) == 0)) {
      best = c;
      bd = d;
    }
  }
  return table[best];
}
bool e4m3_ok(int c) { return (c & 0x7f) != 0x7f; }
bool all_ok(int) { return true; }

// Reference scale exponent: ceil(log2(fl32(amax * fl32(1/qmax)))) computed with libm.
int ref_exp(float amax, float qmax, float floor) {
  amax = std::max(amax, floor);
  const float q = amax * (1.0f / qmax);
  return static_cast<int>(std::ceil(std::log2(static_cast<double>(q))));
}

void ref_fp8(std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld, int block) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / block; ++b) {
      float* v = x.data() + r * ld + b * block;
      float amax = 0;
      for (int i = 0; i < block; ++i)
        if (!std::isnan(v[i])) amax = std::max(amax, std::fabs(v[i]));
      const double s = std::ldexp(1.0, ref_exp(amax, 448.0f, 1e-4f));
      for (int i = 0; i < block; ++i) {
        if (std::isnan(v[i])) continue;
        double q = std::clamp(static_cast<double>(v[i]) / s, -448.0, 448.0);
        v[i] = static_cast<float>(nearest(q, num::kE4m3Table.data(), 256, e4m3_ok) * s);
      }
    }
}

TEST(ActQuant, Fp8MatchesReferenceBitExact) {
  for (auto [rows, cols, ld, block] : {std::tuple<int64_t, int64_t, int64_t, int>{1, 128, 128, 128},
                                       {5, 512, 512, 128},
                                       {7, 448, 512, 64},  // KV nope dims, rope dims untouched
                                       {3, 4096, 4100, 128}}) {
    auto x = randn(rows * ld, 11 + rows, 3.0f);
    // Edge blocks: an all-zero block, an amax that is an exact multiple of 448, tiny values.
    for (int i = 0; i < block; ++i) x[i] = 0.0f;
    if (rows > 1) {
      for (int i = 0; i < block; ++i) x[ld + i] = 0.25f * static_cast<float>(i % 5);
      x[ld + 3] = 448.0f * 2.0f;
    }
    if (rows > 2)
      for (int i = 0; i < block; ++i) x[2 * ld + i] = 1e-6f * static_cast<float>(i + 1);
    if (rows > 3)  // wide dynamic range: e4m3 subnormals, grid ties, underflow to zero
      for (int i = 0; i < block; ++i)
        x[3 * ld + i] = (i % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f + 0.0625f * (i % 16), -(i % 23));
    auto want = x;
    ref_fp8(want, rows, cols, ld, block);
    std::vector<uint8_t> codes(rows * cols), scales(rows * cols / block);
    ActQuantFp8Params p;
    p.x = x.data();
    p.rows = rows;
    p.cols = cols;
    p.ldx = ld;
    p.block = block;
    p.codes = codes.data();
    p.scales = scales.data();
    cpu::act_quant_fp8(p);
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ld; ++c) {
        const float g = x[r * ld + c], w = want[r * ld + c];
        if (g != w) ++bad;
        if (c < cols) {
          // Stored form decodes to the same value.
          const float dec = num::e4m3_to_f32(codes[r * cols + c]) * num::e8m0_to_f32(scales[r * (cols / block) + c / block]);
          ASSERT_EQ(dec, g) << r << "," << c;
        }
      }
    EXPECT_EQ(bad, 0) << rows << "x" << cols;
  }
}

TEST(ActQuant, Fp8VectorPathEqualsStoredFormPath) {
  // Without codes/scales the vector path runs; with them the scalar path. Both must agree bitwise.
  const int64_t rows = 16, cols = 256;
  auto a = randn(rows * cols, 31, 1.0f);
  for (int64_t i = 0; i < rows * cols; ++i) a[i] = std::ldexp(a[i], static_cast<int>(i % 37) - 18);
  auto b = a;
  std::vector<uint8_t> codes(rows * cols), scales(rows * cols / 128);
  ActQuantFp8Params p;
  p.x = a.data();
  p.rows = rows;
  p.cols = cols;
  cpu::act_quant_fp8(p);
  p.x = b.data();
  p.codes = codes.data();
  p.scales = scales.data();
  cpu::act_quant_fp8(p);
  for (int64_t i = 0; i < rows * cols; ++i) ASSERT_EQ(num::f32_bits(a[i]), num::f32_bits(b[i])) << i;
}

TEST(ActQuant, Fp8NanStaysAndInfSaturates) {
  auto x = randn(128, 3);
  x[5] = std::nanf("");
  ActQuantFp8Params p;
  p.x = x.data();
  p.rows = 1;
  p.cols = 128;
  auto want = x;
  ref_fp8(want, 1, 128, 128, 128);
  cpu::act_quant_fp8(p);
  EXPECT_TRUE(std::isnan(x[5]));
  for (int i = 0; i < 128; ++i)
    if (i != 5) {
      EXPECT_EQ(x[i], want[i]) << i;
    }
  std::vector<float> y(64, 1.0f);
  y[0] = std::numeric_limits<float>::infinity();
  ActQuantFp8Params q;
  q.x = y.data();
  q.rows = 1;
  q.cols = 64;
  q.block = 64;
  cpu::act_quant_fp8(q);
  EXPECT_TRUE(std::isinf(y[0]));
  EXPECT_EQ(y[1], 0.0f);  // 1 / 2^127 underflows to zero in e4m3
}

TEST(ActQuant, Fp4MatchesReferenceBitExact) {
  const int64_t rows = 9, cols = 128;
  auto x = randn(rows * cols, 21, 2.0f);
  for (int i = 0; i < 32; ++i) x[i] = 0.0f;                   // zero block -> floor scale
  for (int i = 32; i < 64; ++i) x[i] = 0.5f * (i % 13) - 3;   // exact ties after scaling
  x[70] = 6.0f;
  auto want = x;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      float* v = want.data() + r * cols + b * 32;
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
      const double s = std::ldexp(1.0, ref_exp(amax, 6.0f, num::kFp4ActAmaxFloor));
      for (int i = 0; i < 32; ++i)
        v[i] = static_cast<float>(nearest(std::clamp(v[i] / s, -6.0, 6.0), num::kE2m1Table.data(), 16, all_ok) * s);
    }
  std::vector<uint8_t> codes(rows * cols / 2), scales(rows * cols / 32);
  Fp4ActQuantParams p;
  p.x = x.data();
  p.rows = rows;
  p.cols = cols;
  p.codes = codes.data();
  p.scales = scales.data();
  cpu::fp4_act_quant(p);
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(x[i], want[i]) << i;
    const int64_t r = i / cols, c = i % cols;
    ASSERT_EQ(num::e2m1_to_f32(num::fp4_get(codes.data() + r * cols / 2, c)) *
                  num::e8m0_to_f32(scales[r * 4 + c / 32]),
              x[i]);
  }
  // Zero block keeps zeros and has scale 2^-126.
  EXPECT_EQ(scales[0], num::e8m0_from_exponent(-126));
  EXPECT_EQ(x[0], 0.0f);
}

TEST(ActQuant, RoundBf16RespectsLd) {
  std::vector<float> x = {1.00390625f, 1.01171875f, 3.3f, 7.7f};
  RoundBf16Params p;
  p.x = x.data();
  p.rows = 2;
  p.cols = 1;
  p.ldx = 2;
  cpu::round_bf16(p);
  EXPECT_EQ(x[0], 1.0f);           // tie -> even
  EXPECT_EQ(x[1], 1.01171875f);  // untouched (column 1)
  EXPECT_EQ(x[2], num::round_bf16(3.3f));
  EXPECT_EQ(x[3], 7.7f);
}

}  // namespace
}  // namespace tandem::kernels
