// numeric_core.h is compiled for the GPU too: its arithmetic decoders must equal the CPU tables on
// every code, and the encoders must invert them.
#include <gtest/gtest.h>

#include <cmath>

#include "common/numeric.h"

namespace tandem::num {
namespace {

TEST(NumericCore, E4m3DecodeMatchesTableOnEveryCode) {
  for (int b = 0; b < 256; ++b) {
    const float t = kE4m3Table[b], c = e4m3_decode(static_cast<uint8_t>(b));
    if (std::isnan(t)) {
      EXPECT_TRUE(std::isnan(c)) << b;
    } else {
      EXPECT_EQ(f32_bits(t), f32_bits(c)) << "code " << b;
      EXPECT_EQ(round_e4m3(c), c) << b;
    }
  }
}

TEST(NumericCore, E2m1DecodeMatchesTableOnEveryCode) {
  for (int b = 0; b < 16; ++b) {
    EXPECT_EQ(f32_bits(kE2m1Table[b]), f32_bits(e2m1_decode(static_cast<uint8_t>(b)))) << b;
    if (b != 8) {  // -0 (code 8) encodes as 8 too, but +0 and -0 compare equal
      EXPECT_EQ(f32_to_e2m1(e2m1_decode(static_cast<uint8_t>(b))), b) << b;
    }
  }
}

TEST(NumericCore, E4m3EncodeRoundTripsEveryFiniteCode) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_decode(static_cast<uint8_t>(b))), b) << b;
  }
}

// The branch-free encoder the GPU quantizers use, against f32_to_e4m3 on every float of [-448, 448]
// (what they pass it after clamping; NaN is not its input).
TEST(NumericCore, E4m3FromClampedMatchesTheEncoderOnEveryFloat) {
  uint64_t bad = 0;
  uint32_t first = 0;
  const uint32_t top = f32_bits(kE4m3Max);
  for (uint32_t u = 0; u <= top; ++u) {
    for (const uint32_t bits : {u, u | 0x80000000u}) {
      const float x = bits_f32(bits);
      if (e4m3_from_clamped(x) != f32_to_e4m3(x) && bad++ == 0) first = bits;
    }
  }
  EXPECT_EQ(bad, 0u) << "first input bits 0x" << std::hex << first << " -> " << int{e4m3_from_clamped(bits_f32(first))}
                     << " want " << int{f32_to_e4m3(bits_f32(first))};
}

}  // namespace
}  // namespace tandem::num
