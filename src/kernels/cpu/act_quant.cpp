// Activation quantization round trips (FP8 e4m3 / FP4 e2m1 with power-of-two block scales) and the
// plain bf16 rounding op. Bit-exact with the reference kernels act_quant / fp4_act_quant.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_common.h"
#include "kernels/ops.h"

namespace tandem::kernels::cpu {
namespace {

float block_amax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;  // NaN compares false: ignored
  }
  return amax;
}

// Vector round trip of one block (block % 16 == 0, no codes wanted): same arithmetic as the scalar
// path. x/s == x * 2^-e exactly (power of two, one rounding either way). Normal e4m3 values: round
// the fp32 mantissa to 3 bits (RNE on the bit pattern); below 2^-6 the grid step is 2^-9, rounded by
// adding and subtracting 1.5 * 2^14 (RNE under the default rounding mode).
void fp8_block_vec(float* x, int64_t n) {
  vf16 vmax = {};
  for (int64_t i = 0; i < n; i += 16) {
    const vf16 a = (vf16)((vu16)load16(x + i) & 0x7fffffffu);
    const vu16 gt = (vu16)(a > vmax);  // NaN compares false: ignored
    vmax = (vf16)(((vu16)a & gt) | ((vu16)vmax & ~gt));
  }
  float amax = 0.0f;
  for (int l = 0; l < 16; ++l) amax = vmax[l] > amax ? vmax[l] : amax;
  const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
  const float s = num::pow2_int(e);
  const float inv = e >= -126 && e <= 126 ? num::pow2_int(-e) : std::ldexp(1.0f, -e);
  const float magic = 24576.0f;  // 1.5 * 2^14: its ulp is 2^-9
  for (int64_t i = 0; i < n; i += 16) {
    const vf16 xv = load16(x + i);
    vf16 v = xv * inv;
    v = v > 448.0f ? (vf16){} + 448.0f : v;
    v = v < -448.0f ? (vf16){} - 448.0f : v;
    const vu16 u = (vu16)v;
    const vu16 sign = u & 0x80000000u;
    const vu16 mag = u & 0x7fffffffu;
    const vu16 normal = (mag + 0x7ffffu + ((mag >> 20) & 1u)) & 0xfff00000u;
    const vf16 sub = ((vf16)mag + magic) - magic;
    const vu16 is_sub = (vu16)((vf16)mag < 0.015625f);  // 2^-6
    const vu16 r = ((vu16)sub & is_sub) | (normal & ~is_sub);
    vf16 out = (vf16)(r | sign) * s;
    const vu16 nan = (vu16)(xv != xv);
    out = (vf16)(((vu16)xv & nan) | ((vu16)out & ~nan));
    store16(x + i, out);
  }
}

}  // namespace

void act_quant_fp8(const ActQuantFp8Params& p) {
  validate(p);
  const int64_t ldx = ld_or(p.ldx, p.cols);
  const int64_t nb = p.cols / p.block;
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 4.0 * p.cols))
  for (int64_t r = 0; r < p.rows; ++r) {
    float* row = p.x + r * ldx;
    for (int64_t b = 0; b < nb; ++b) {
      float* x = row + b * p.block;
      if (!p.codes && !p.scales && p.block % 16 == 0) {
        fp8_block_vec(x, p.block);
        continue;
      }
      const int e = num::ue8m0_scale_exponent(block_amax(x, p.block), num::kE4m3Max, num::kFp8ActAmaxFloor);
      const float s = num::pow2_int(e);
      if (p.scales) p.scales[r * nb + b] = num::e8m0_from_exponent(e);
      uint8_t* codes = p.codes ? p.codes + r * p.cols + b * p.block : nullptr;
      for (int64_t i = 0; i < p.block; ++i) {
        const float v = std::clamp(x[i] / s, -num::kE4m3Max, num::kE4m3Max);
        const uint8_t c = num::f32_to_e4m3(std::isnan(x[i]) ? x[i] : v);
        if (codes) codes[i] = c;
        x[i] = num::e4m3_to_f32(c) * s;
      }
    }
  }
}

void fp4_act_quant(const Fp4ActQuantParams& p) {
  validate(p);
  const int64_t ldx = ld_or(p.ldx, p.cols);
  const int64_t nb = p.cols / p.block;
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 4.0 * p.cols))
  for (int64_t r = 0; r < p.rows; ++r) {
    float* row = p.x + r * ldx;
    for (int64_t b = 0; b < nb; ++b) {
      float* x = row + b * p.block;
      const int e = num::ue8m0_scale_exponent(block_amax(x, p.block), num::kE2m1Max, num::kFp4ActAmaxFloor);
      const float s = num::pow2_int(e);
      if (p.scales) p.scales[r * nb + b] = num::e8m0_from_exponent(e);
      uint8_t* codes = p.codes ? p.codes + r * (p.cols / 2) + b * (p.block / 2) : nullptr;
      for (int64_t i = 0; i < p.block; ++i) {
        const bool nan = std::isnan(x[i]);
        const uint8_t c = num::f32_to_e2m1(std::clamp(x[i] / s, -num::kE2m1Max, num::kE2m1Max));
        if (codes) num::fp4_set(codes, static_cast<size_t>(i), c);
        x[i] = nan ? x[i] : num::e2m1_to_f32(c) * s;
      }
    }
  }
}

void round_bf16(const RoundBf16Params& p) {
  validate(p);
  const int64_t ldx = ld_or(p.ldx, p.cols);
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows, 2.0 * p.cols))
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * ldx;
    for (int64_t i = 0; i < p.cols; ++i) x[i] = num::round_bf16(x[i]);
  }
}

}  // namespace tandem::kernels::cpu
