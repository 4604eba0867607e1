// Bit-exact conversions for the small float formats (see numeric.h). Rounding is done on the
// integer mantissa so results never depend on the FPU rounding mode.
#include "common/numeric.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace tandem::num {
namespace {

constexpr float pow2f(int e) {
  float r = 1.0f;
  if (e >= 0) {
    for (int i = 0; i < e; ++i) r *= 2.0f;
  } else {
    for (int i = 0; i < -e; ++i) r *= 0.5f;
  }
  return r;
}

constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    int ef = (b >> 3) & 0xf, m = b & 7;
    float v = ef == 0 ? m * pow2f(-9) : (8 + m) * pow2f(ef - 7 - 3);
    if ((b & 0x7f) == 0x7f) v = __builtin_nanf("");
    t[b] = (b & 0x80) ? -v : v;
  }
  return t;
}

}  // namespace

const std::array<float, 256> kE4m3Table = make_e4m3_table();
const std::array<float, 16> kE2m1Table = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint16_t f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (u == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  Rounded q = round_mini(u, 10, -14);
  if (q.r < (1u << 10)) return static_cast<uint16_t>(sign | q.r);  // subnormal or zero
  int ef = q.te + 15;
  if (ef > 30) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (ef << 10) | (q.r - (1u << 10)));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  int ef = (h >> 10) & 0x1f;
  uint32_t m = h & 0x3ffu;
  if (ef == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
  if (ef == 0) {
    float v = static_cast<float>(m) * pow2f(-24);
    return sign ? -v : v;
  }
  return bits_f32(sign | (static_cast<uint32_t>(ef - 15 + 127) << 23) | (m << 13));
}

float round_e4m3(float x) { return e4m3_to_f32(f32_to_e4m3(x)); }

float round_e2m1(float x) { return e2m1_to_f32(f32_to_e2m1(x)); }

namespace {
// Encodes one group; returns its scale byte and writes the element codes through `put`.
template <typename Put>
uint8_t nvfp4_group(const float* x, size_t n, Put put) {
  float amax = 0.0f;
  for (size_t k = 0; k < n; ++k)
    if (!std::isnan(x[k])) amax = std::max(amax, std::fabs(x[k]));
  const uint8_t sb = nvfp4_scale(amax);
  const float s = e4m3_to_f32(sb);
  const float inv = s != 0.0f ? 1.0f / s : 0.0f;
  for (size_t k = 0; k < n; ++k) put(k, f32_to_e2m1(x[k] * inv));
  return sb;
}
}  // namespace

void quantize_nvfp4(const float* x, size_t n, uint8_t* packed, uint8_t* scales) {
  for (size_t g0 = 0; g0 < n; g0 += kNvfp4Group) {
    const size_t gn = std::min(kNvfp4Group, n - g0);
    scales[g0 / kNvfp4Group] =
        nvfp4_group(x + g0, gn, [&](size_t k, uint8_t code) { fp4_set(packed, g0 + k, code); });
  }
}

void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, size_t n, float* y) {
  for (size_t k = 0; k < n; ++k) y[k] = e2m1_to_f32(fp4_get(packed, k)) * e4m3_to_f32(scales[k / kNvfp4Group]);
}

void round_nvfp4(float* x, size_t n) {
  for (size_t g0 = 0; g0 < n; g0 += kNvfp4Group) {
    const size_t gn = std::min(kNvfp4Group, n - g0);
    float* g = x + g0;
    uint8_t codes[kNvfp4Group];
    const float s = e4m3_to_f32(nvfp4_group(g, gn, [&](size_t k, uint8_t code) { codes[k] = code; }));
    for (size_t k = 0; k < gn; ++k)
      if (!std::isnan(g[k])) g[k] = e2m1_to_f32(codes[k]) * s;
  }
}

Fp8BlockWeight quantize_fp8_block(const float* w, size_t out, size_t in, size_t block) {
  TANDEM_CHECK(block > 0);
  const size_t bo = (out + block - 1) / block, bi = (in + block - 1) / block;
  Fp8BlockWeight r;
  r.data.resize(out * in);
  r.scale.resize(bo * bi);
  for (size_t tb = 0; tb < bo; ++tb) {
    for (size_t kb = 0; kb < bi; ++kb) {
      const size_t n0 = tb * block, n1 = std::min(out, n0 + block);
      const size_t k0 = kb * block, k1 = std::min(in, k0 + block);
      float amax = 0.0f;
      for (size_t n = n0; n < n1; ++n)
        for (size_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(w[n * in + k]));
      const int e = ue8m0_scale_exponent(amax, kE4m3Max, kFp8ActAmaxFloor);
      const float s = pow2_int(e);
      r.scale[tb * bi + kb] = e8m0_from_exponent(e);
      for (size_t n = n0; n < n1; ++n)
        for (size_t k = k0; k < k1; ++k) {
          float v = std::clamp(w[n * in + k] / s, -kE4m3Max, kE4m3Max);
          r.data[n * in + k] = f32_to_e4m3(v);
        }
    }
  }
  return r;
}

std::vector<float> dequantize_fp8_block(const uint8_t* data, const uint8_t* scale, size_t out, size_t in,
                                        size_t block) {
  const size_t bi = (in + block - 1) / block;
  std::vector<float> w(out * in);
  for (size_t n = 0; n < out; ++n)
    for (size_t k = 0; k < in; ++k)
      w[n * in + k] = e4m3_to_f32(data[n * in + k]) * e8m0_to_f32(scale[(n / block) * bi + k / block]);
  return w;
}

Mxfp4Weight quantize_mxfp4(const float* w, size_t out, size_t in) {
  TANDEM_CHECK(in % kMxfp4Group == 0);
  const size_t groups = in / kMxfp4Group;
  Mxfp4Weight r;
  r.data.assign(out * in / 2, 0);
  r.scale.resize(out * groups);
  for (size_t n = 0; n < out; ++n) {
    const float* row = w + n * in;
    uint8_t* prow = r.data.data() + n * in / 2;
    for (size_t g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (size_t k = g * kMxfp4Group; k < (g + 1) * kMxfp4Group; ++k) amax = std::max(amax, std::fabs(row[k]));
      const int e = ue8m0_scale_exponent(amax, kE2m1Max, kFp4ActAmaxFloor);
      const float s = pow2_int(e);
      r.scale[n * groups + g] = e8m0_from_exponent(e);
      for (size_t k = g * kMxfp4Group; k < (g + 1) * kMxfp4Group; ++k)
        fp4_set(prow, k, f32_to_e2m1(std::clamp(row[k] / s, -kE2m1Max, kE2m1Max)));
    }
  }
  return r;
}

std::vector<float> dequantize_mxfp4(const uint8_t* data, const uint8_t* scale, size_t out, size_t in) {
  const size_t groups = in / kMxfp4Group;
  std::vector<float> w(out * in);
  for (size_t n = 0; n < out; ++n)
    for (size_t k = 0; k < in; ++k)
      w[n * in + k] = e2m1_to_f32(fp4_get(data + n * in / 2, k)) * e8m0_to_f32(scale[n * groups + k / kMxfp4Group]);
  return w;
}

}  // namespace tandem::num
