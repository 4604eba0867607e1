// Tests for common/numeric.h: every encoder is checked against a brute-force "nearest
// representable value, ties to the even code" search over the whole code table.
#include "common/numeric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace tandem::num {
namespace {

// Brute-force nearest-even encoder over a table of finite codes (sign handled by the table).
template <typename DecodeFn>
uint32_t brute_encode(double x, uint32_t ncodes, DecodeFn decode, bool (*valid)(uint32_t)) {
  uint32_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (uint32_t c = 0; c < ncodes; ++c) {
    if (!valid(c)) continue;
    double v = decode(c);
    double d = std::fabs(v - x);
    // Prefer the same sign for zero; ties go to the code with an even mantissa LSB.
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1) ||
        (d == best_d && v == 0.0 && std::signbit(v) == std::signbit(x) && (c & 1) == (best & 1))) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

bool e4m3_valid(uint32_t c) { return (c & 0x7f) != 0x7f; }
bool all_valid(uint32_t) { return true; }

TEST(Numeric, E4m3TableKnownValues) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // min subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // min normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(Numeric, E4m3RoundTripAllCodes) {
  for (uint32_t c = 0; c < 256; ++c) {
    if (!e4m3_valid(c)) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(Numeric, E4m3EncodeMatchesBruteForce) {
  std::mt19937 rng(1);
  auto dec = [](uint32_t c) { return static_cast<double>(e4m3_to_f32(static_cast<uint8_t>(c))); };
  std::vector<float> xs;
  // Exact midpoints between neighbouring codes (ties) and values just around them.
  for (uint32_t c = 0; c < 0x7e; ++c) {
    float a = e4m3_to_f32(static_cast<uint8_t>(c)), b = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    float mid = 0.5f * (a + b);
    xs.push_back(mid);
    xs.push_back(-mid);
    xs.push_back(std::nextafter(mid, 0.0f));
    xs.push_back(std::nextafter(mid, 1000.0f));
  }
  std::uniform_real_distribution<float> ue(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    float v = std::exp2(ue(rng));
    xs.push_back((rng() & 1) ? v : -v);
  }
  xs.push_back(std::ldexp(1.0f, -10));  // half of min subnormal: tie -> 0
  xs.push_back(std::ldexp(1.5f, -10));  // rounds to min subnormal
  xs.push_back(1e-30f);
  int bad = 0;
  for (float x : xs) {
    float clamped = std::fmax(std::fmin(x, 448.0f), -448.0f);
    uint32_t want = brute_encode(clamped, 256, dec, e4m3_valid);
    uint8_t got = f32_to_e4m3(x);
    if (dec(got) != dec(want) || std::signbit(dec(got)) != std::signbit(dec(want))) {
      if (++bad < 10) ADD_FAILURE() << "x=" << x << " got " << dec(got) << " want " << dec(want);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Numeric, E4m3SaturationAndNan) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(463.9f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e9f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_TRUE(std::isnan(round_e4m3(std::nanf(""))));
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  // Ties to even: 1 + 1/16 lies halfway between 1 (0x38) and 1.125 (0x39) -> 1.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);  // between 1.125 and 1.25 -> 1.25 (even)
  // Subnormal tie: 1.5 * 2^-9 -> 2 * 2^-9 (even code 2).
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.5f, -9)), 0x02);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(0.5f, -9)), 0x00);
}

TEST(Numeric, Bf16RoundingNanInf) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  uint16_t n = f32_to_bf16(-std::nanf(""));
  EXPECT_TRUE(std::isnan(bf16_to_f32(n)));
  EXPECT_TRUE(n & 0x8000);
  // A NaN whose payload lives only in the low 16 bits must stay NaN.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_f32(0x7f800001u)))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  // Subnormals keep working (bf16 has the f32 exponent range).
  EXPECT_EQ(f32_to_bf16(bits_f32(0x00018000u)), 0x0002);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_f32(0x00008000u)), 0x0000);
  std::mt19937 rng(2);
  for (int i = 0; i < 100000; ++i) {
    float x = bits_f32((rng() & 0x7effffffu) | (rng() & 0x80000000u));
    float r = round_bf16(x);
    // Nearest: no other bf16 is closer.
    uint32_t lo = f32_bits(x) & 0xffff0000u;
    double a = bits_f32(lo), b = bits_f32(lo + 0x10000u);
    double d = std::fabs(static_cast<double>(r) - x);
    ASSERT_LE(d, std::fabs(a - x));
    if (std::isfinite(b)) {
      ASSERT_LE(d, std::fabs(b - x));
    }
  }
}

TEST(Numeric, F16MatchesBruteForce) {
  auto dec = [](uint32_t c) { return static_cast<double>(f16_to_f32(static_cast<uint16_t>(c))); };
  auto finite = [](uint32_t c) { return ((c >> 10) & 0x1f) != 0x1f; };
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie at the top rounds to inf (even)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -24)), 0x0002);
  EXPECT_EQ(f32_to_f16(-std::ldexp(3.0f, -25)), 0x8002);
  EXPECT_EQ(f32_to_f16(std::nanf("")) & 0x7e00, 0x7e00);
  // All codes round trip.
  for (uint32_t c = 0; c < 65536; ++c) {
    if (!finite(c)) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(c))), c) << c;
  }
  // Random values: compare with neighbours in code space.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ue(-26.0f, 15.9f);
  for (int i = 0; i < 50000; ++i) {
    float x = std::exp2(ue(rng));
    uint16_t c = f32_to_f16(x);
    double v = dec(c), d = std::fabs(v - x);
    if (c > 0) {
      ASSERT_LE(d, std::fabs(dec(c - 1) - x)) << x;
    }
    if (finite(c + 1)) {
      double dn = std::fabs(dec(c + 1) - x);
      ASSERT_LE(d, dn) << x;
      if (d == dn) {
        ASSERT_EQ(c & 1, 0) << x;
      }
    }
  }
}

TEST(Numeric, E8m0Decode) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(120), std::ldexp(1.0f, -7));
  EXPECT_EQ(e8m0_to_f32(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  for (int e = -126; e <= 127; ++e) EXPECT_EQ(e8m0_to_f32(e8m0_from_exponent(e)), pow2_int(e));
}

TEST(Numeric, Ue8m0ScaleMatchesReferenceFormula) {
  // 2^ceil(log2(amax * fl32(1/448))).
  EXPECT_EQ(ue8m0_scale_exponent(448.0f, 448.0f, 1e-4f), log2_ceil_bits(448.0f * (1.0f / 448.0f)));
  EXPECT_EQ(ue8m0_scale_exponent(1.0f, 448.0f, 1e-4f), -8);   // 1/448 in (2^-9, 2^-8]
  EXPECT_EQ(ue8m0_scale_exponent(0.0f, 448.0f, 1e-4f), -22);  // floor 1e-4: 1e-4/448 ~ 2.23e-7
  EXPECT_EQ(ue8m0_scale_exponent(6.0f, 6.0f, kFp4ActAmaxFloor), log2_ceil_bits(6.0f * (1.0f / 6.0f)));
  EXPECT_EQ(ue8m0_scale_exponent(0.0f, 6.0f, kFp4ActAmaxFloor), -126);
  EXPECT_EQ(ue8m0_scale_exponent(12.0f, 6.0f, kFp4ActAmaxFloor), log2_ceil_bits(12.0f * (1.0f / 6.0f)));
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> ue(-10.0f, 20.0f);
  for (int i = 0; i < 10000; ++i) {
    float amax = std::exp2(ue(rng));
    int e = ue8m0_scale_exponent(amax, 448.0f, 1e-4f);
    double q = static_cast<double>(amax * (1.0f / 448.0f));
    ASSERT_GE(std::ldexp(1.0, e), q);
    ASSERT_LT(std::ldexp(1.0, e - 1), q);
  }
}

TEST(Numeric, E2m1EncodeTiesToEven) {
  const float vals[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(c), vals[c]);
    EXPECT_EQ(e2m1_to_f32(c | 8), -vals[c]);
    EXPECT_EQ(f32_to_e2m1(vals[c]), c);
    if (c) {
      EXPECT_EQ(f32_to_e2m1(-vals[c]), c | 8);
    }
  }
  // Midpoints: ties to the even code.
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);   // 0 | 0.5 -> 0
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);   // 0.5 | 1 -> 1
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);   // 1 | 1.5 -> 1
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);   // 1.5 | 2 -> 2
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);    // 2 | 3 -> 2
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);    // 3 | 4 -> 4
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);    // 4 | 6 -> 4
  EXPECT_EQ(f32_to_e2m1(-5.0f), 14);
  EXPECT_EQ(f32_to_e2m1(5.01f), 7);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);  // saturate
  EXPECT_EQ(f32_to_e2m1(-std::numeric_limits<float>::infinity()), 15);
  EXPECT_EQ(f32_to_e2m1(std::nanf("")), 0);
  EXPECT_EQ(f32_to_e2m1(1e-30f), 0);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-7.0f, 7.0f);
  auto dec = [](uint32_t c) { return static_cast<double>(e2m1_to_f32(static_cast<uint8_t>(c))); };
  for (int i = 0; i < 20000; ++i) {
    float x = u(rng);
    float cl = std::fmax(std::fmin(x, 6.0f), -6.0f);
    uint32_t want = brute_encode(cl, 16, dec, all_valid);
    ASSERT_EQ(dec(f32_to_e2m1(x)), dec(want)) << x;
  }
}

TEST(Numeric, Fp4Packing) {
  uint8_t buf[2] = {0, 0};
  fp4_set(buf, 0, 0x3);
  fp4_set(buf, 1, 0xa);
  fp4_set(buf, 2, 0x7);
  EXPECT_EQ(buf[0], 0xa3);
  EXPECT_EQ(buf[1], 0x07);
  EXPECT_EQ(fp4_get(buf, 0), 0x3);
  EXPECT_EQ(fp4_get(buf, 1), 0xa);
  EXPECT_EQ(fp4_get(buf, 2), 0x7);
  EXPECT_EQ(fp4_get(buf, 3), 0x0);
  EXPECT_EQ(fp4_pack(0x3, 0xa), 0xa3);
}

TEST(Numeric, QuantizeFp8BlockRaggedAndZeroBlocks) {
  const size_t out = 200, in = 300;  // ragged tiles on both axes
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(out * in);
  for (auto& v : w) v = nd(rng);
  // Tile (1,2) all zero; tile (0,1) with a huge outlier.
  for (size_t n = 128; n < 200; ++n)
    for (size_t k = 256; k < 300; ++k) w[n * in + k] = 0.0f;
  w[5 * in + 130] = 1000.0f;
  auto q = quantize_fp8_block(w.data(), out, in);
  ASSERT_EQ(q.scale.size(), 2u * 3u);
  ASSERT_EQ(q.data.size(), out * in);
  EXPECT_EQ(q.scale[1 * 3 + 2], e8m0_from_exponent(-22));
  auto d = dequantize_fp8_block(q.data.data(), q.scale.data(), out, in);
  for (size_t tb = 0; tb < 2; ++tb)
    for (size_t kb = 0; kb < 3; ++kb) {
      float amax = 0;
      for (size_t n = tb * 128; n < std::min(out, tb * 128 + 128); ++n)
        for (size_t k = kb * 128; k < std::min(in, kb * 128 + 128); ++k) amax = std::max(amax, std::fabs(w[n * in + k]));
      float s = e8m0_to_f32(q.scale[tb * 3 + kb]);
      if (amax > 0) {
        EXPECT_LE(amax / s, 448.0f);
        EXPECT_GT(amax / s, 224.0f);  // power-of-two scale uses the top binade
      }
      for (size_t n = tb * 128; n < std::min(out, tb * 128 + 128); ++n)
        for (size_t k = kb * 128; k < std::min(in, kb * 128 + 128); ++k) {
          float x = w[n * in + k];
          // Each element is the e4m3 RNE of x/s, times s.
          ASSERT_EQ(d[n * in + k], round_e4m3(x / s) * s) << n << "," << k;
          ASSERT_LE(std::fabs(d[n * in + k] - x), std::max(std::fabs(x) / 16.0f, std::ldexp(1.0f, -10) * s));
        }
    }
}

TEST(Numeric, QuantizeMxfp4) {
  const size_t out = 3, in = 96;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(out * in);
  for (auto& v : w) v = nd(rng);
  for (size_t k = 32; k < 64; ++k) w[1 * in + k] = 0.0f;  // one zero group
  w[2 * in + 10] = 6.0f;                                  // exact max: 6 * fl(1/6) -> scale 1
  for (size_t k = 0; k < 32; ++k) if (k != 10) w[2 * in + k] = 0.1f * static_cast<float>(k % 7) - 0.3f;
  auto q = quantize_mxfp4(w.data(), out, in);
  ASSERT_EQ(q.data.size(), out * in / 2);
  ASSERT_EQ(q.scale.size(), out * 3);
  EXPECT_EQ(q.scale[1 * 3 + 1], e8m0_from_exponent(-126));
  EXPECT_EQ(q.scale[2 * 3 + 0], e8m0_from_exponent(log2_ceil_bits(6.0f * (1.0f / 6.0f))));
  auto d = dequantize_mxfp4(q.data.data(), q.scale.data(), out, in);
  for (size_t n = 0; n < out; ++n)
    for (size_t k = 0; k < in; ++k) {
      float s = e8m0_to_f32(q.scale[n * 3 + k / 32]);
      ASSERT_EQ(d[n * in + k], round_e2m1(std::fmax(std::fmin(w[n * in + k] / s, 6.0f), -6.0f)) * s);
    }
  for (size_t k = 32; k < 64; ++k) EXPECT_EQ(d[1 * in + k], 0.0f);
}

}  // namespace
}  // namespace tandem::num
