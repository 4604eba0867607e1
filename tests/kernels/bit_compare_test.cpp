// The comparators of bit_compare.h on hand-made cases: they must reject exactly the faults they are
// there to see (a dropped rounding, truncation, a NaN or inf in the wrong place) and accept the
// correctly rounded values, in bf16 and in the scaled e4m3 / e2m1 grids.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "bit_compare.h"
#include "common/numeric.h"

namespace tandem::kernels::testing {
namespace {

TEST(BitCompare, Bf16RoundToNearestEvenPassesTruncationAndUnroundedFail) {
  std::vector<double> want;
  std::vector<float> rne, trunc, raw;
  for (int i = 0; i < 200; ++i) {
    const double w = std::sin(0.37 * i + 0.1) * std::ldexp(1.0, i % 9 - 4);
    want.push_back(w);
    const float f = static_cast<float>(w);
    rne.push_back(num::round_bf16(f));
    trunc.push_back(num::bits_f32(num::f32_bits(f) & 0xffff0000u));
    raw.push_back(f);
  }
  EXPECT_TRUE(correctly_rounded(rne, want, Stored::kBf16));
  EXPECT_FALSE(correctly_rounded(trunc, want, Stored::kBf16));  // about half are past half an ulp
  EXPECT_FALSE(correctly_rounded(raw, want, Stored::kBf16));    // not representable in bf16
}

TEST(BitCompare, SpecialValuesMustSitAtTheSamePositions) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<double> want = {1.0, std::nan(""), -INFINITY};
  EXPECT_TRUE(correctly_rounded(std::vector<float>{1.0f, nan, -inf}, want, Stored::kBf16));
  EXPECT_FALSE(correctly_rounded(std::vector<float>{nan, 1.0f, -inf}, want, Stored::kBf16));
  EXPECT_FALSE(correctly_rounded(std::vector<float>{1.0f, nan, inf}, want, Stored::kBf16));
  const float a[3] = {1.0f, nan, 2.0f}, b[3] = {1.0f, nan, 2.0f}, c[3] = {1.0f, nan, std::nextafter(2.0f, 3.0f)};
  EXPECT_TRUE(bits_equal(a, b, 3));
  EXPECT_FALSE(bits_equal(a, c, 3));
}

TEST(BitCompare, ScaledE4m3AndE2m1Grids) {
  // e4m3 with block scale 2^-3: 1.125 * 2^-3 is on the grid, 1.0625 * 2^-3 is a midpoint.
  const double s = 0.125;
  const double scale[2] = {s, s};
  const float on_grid[2] = {static_cast<float>(1.125 * s), static_cast<float>(-1.25 * s)};
  const double want[2] = {1.13 * s, -1.24 * s};
  EXPECT_TRUE(correctly_rounded(on_grid, want, 2, Stored::kE4m3, 0.0, nullptr, scale));
  const float off_grid[2] = {static_cast<float>(1.0625 * s), static_cast<float>(-1.25 * s)};
  EXPECT_FALSE(correctly_rounded(off_grid, want, 2, Stored::kE4m3, 0.0, nullptr, scale));
  // e2m1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6: 2.4 rounds to 2, 2.6 to 3; 3 for 2.4 is a full step off.
  const double w2[2] = {2.4, 2.6};
  const float good[2] = {2.0f, 3.0f}, bad[2] = {3.0f, 3.0f};
  EXPECT_TRUE(correctly_rounded(good, w2, 2, Stored::kE2m1));
  EXPECT_FALSE(correctly_rounded(bad, w2, 2, Stored::kE2m1));
}

}  // namespace
}  // namespace tandem::kernels::testing
