// The bit-exact scalar conversions shared by the CPU reference and the CUDA kernels: one
// implementation, compiled for the host and (under nvcc) for the device, so a GPU kernel rounds
// exactly as the CPU oracle does. Integer arithmetic only: no dependence on the FPU rounding mode.
// numeric.h builds the CPU-side API (tables, quantizers) on top of these.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

namespace tandem::num {

TANDEM_HD uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
TANDEM_HD float bits_f32(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
TANDEM_HD bool is_nan_bits(float x) { return (f32_bits(x) & 0x7fffffffu) > 0x7f800000u; }

// f32 -> bf16, round to nearest even. NaN stays NaN (quiet bit forced, sign kept); inf stays inf;
// values that round past the largest bf16 become inf (as torch's .to(bfloat16) does).
TANDEM_HD uint16_t f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
TANDEM_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
// The value x takes after a round trip through bf16 (what "tensor.to(bfloat16).float()" gives).
TANDEM_HD float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Rounds a finite positive value (given by its f32 bits, sign cleared) to a binary format with
// `mbits` stored mantissa bits and smallest normal exponent `emin`, round to nearest even.
// Returns r, te with value = r * 2^(te - mbits), r < 2^(mbits+1) (r >= 2^mbits unless subnormal).
struct Rounded {
  uint32_t r;
  int te;
};
TANDEM_HD Rounded round_mini(uint32_t u, int mbits, int emin) {
  const int ef = static_cast<int>(u >> 23);
  uint32_t mant = u & 0x7fffffu;
  const int e = ef ? ef - 127 : -126;
  if (ef) mant |= 0x800000u;
  int te = e > emin ? e : emin;
  const int s = 23 - mbits + (te - e);  // >= 1
  uint32_t r;
  if (s >= 32) {
    r = 0;
  } else {
    r = mant >> s;
    const uint32_t rem = mant & ((1u << s) - 1u);
    const uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
  }
  if (r >= (2u << mbits)) {  // carry into the next binade
    r >>= 1;
    ++te;
  }
  return {r, te};
}

// ---- FP8 e4m3fn (bias 7, no inf, 0x7f/0xff = NaN, max 448, min subnormal 2^-9) ----
// f32 -> e4m3fn: round to nearest even, saturate to +-448 (incl. +-inf), NaN -> 0x7f (sign kept).
TANDEM_HD uint8_t f32_to_e4m3(float x) {
  uint32_t u = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7f);
  if (u == 0x7f800000u) return static_cast<uint8_t>(sign | 0x7e);
  const Rounded q = round_mini(u, 3, -6);
  if (q.r < 8u) return static_cast<uint8_t>(sign | q.r);
  const int ef = q.te + 7;
  if (ef > 15) return static_cast<uint8_t>(sign | 0x7e);
  uint32_t code = (static_cast<uint32_t>(ef) << 3) | (q.r - 8u);
  if (code > 0x7eu) code = 0x7e;
  return static_cast<uint8_t>(sign | code);
}
// f32_to_e4m3 of a value already clamped to [-448, 448] (not NaN), without branches, for the
// GPU's per-element loops (the quantizers of prefill activations): the same code for every such
// float (NumericCore.E4m3FromClampedMatchesTheEncoderOnEveryFloat checks every float of [-448, 448]). Normal
// codes (|x| >= 2^-6): the f32 bits rounded to 3 mantissa bits, to nearest even (a carry moves into
// the exponent); subnormal codes: |x| + 2^14 rounds |x| to a multiple of 2^-9 (2^14's ulp), to
// nearest even by the fp32 add, and the code is that multiple (8 = 2^-6, the smallest normal code).
TANDEM_HD uint8_t e4m3_from_clamped(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  const uint32_t sub = f32_bits(bits_f32(a) + 16384.0f) - 0x46800000u;  // 16384 = 2^14
  return static_cast<uint8_t>(sign | (a >= 0x3c800000u ? normal : sub));  // 0x3c800000 = 2^-6
}
// e4m3fn -> f32 by arithmetic (the CPU keeps a table built from this: kE4m3Table).
TANDEM_HD float e4m3_decode(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  if ((b & 0x7f) == 0x7f) return bits_f32(sign | 0x7fc00000u);
  const int ef = (b >> 3) & 0xf, m = b & 7;
  if (ef == 0) {  // subnormal: m * 2^-9, exact in f32
    const float v = static_cast<float>(m) * bits_f32(0x3b000000u);  // 2^-9
    return bits_f32(f32_bits(v) | sign);
  }
  return bits_f32(sign | (static_cast<uint32_t>(ef - 7 + 127) << 23) | (static_cast<uint32_t>(m) << 20));
}

// ---- E8M0 scale (unsigned power of two, bias 127, 255 = NaN) ----
TANDEM_HD float e8m0_to_f32(uint8_t b) {
  if (b == 255) return bits_f32(0x7fc00000u);
  if (b == 0) return bits_f32(0x00400000u);  // 2^-127 is an f32 subnormal
  return bits_f32(static_cast<uint32_t>(b) << 23);
}
// Exponent e of a power of two 2^e, e in [-127, 127] -> E8M0 byte e + 127.
TANDEM_HD uint8_t e8m0_from_exponent(int e) { return static_cast<uint8_t>(e + 127); }
// ceil(log2(x)) for a positive normal float, exactly as the reference kernels' fast_log2_ceil.
TANDEM_HD int log2_ceil_bits(float x) {
  const uint32_t u = f32_bits(x);
  const int e = static_cast<int>((u >> 23) & 0xffu) - 127;
  return e + ((u & 0x7fffffu) != 0 ? 1 : 0);
}
// 2^e for an integer e in [-126, 127] (fast_pow2 in the reference).
TANDEM_HD float pow2_int(int e) { return bits_f32(static_cast<uint32_t>(e + 127) << 23); }
// Power-of-two (UE8M0) block scale exactly as the reference: 2^ceil(log2(amax * fl32(1/qmax)))
// with amax floored at `amax_floor` (NaN maps to the floor).
TANDEM_HD int ue8m0_scale_exponent(float amax, float qmax, float amax_floor) {
  if (!(amax >= amax_floor)) amax = amax_floor;
  const float inv = 1.0f / qmax;
  const int e = log2_ceil_bits(amax * inv);
  return e > 127 ? 127 : e;  // amax = inf
}
constexpr float kFp8ActAmaxFloor = 1e-4f;
constexpr float kFp4ActAmaxFloor = 6.0f * 1.1754943508222875e-38f;  // 6 * 2^-126
constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;

// ---- FP4 e2m1 (values {0,.5,1,1.5,2,3,4,6}, bit 3 = sign, no NaN/inf) ----
// f32 -> e2m1 nibble: round to nearest, ties to even, saturate to +-6; NaN -> +0.
TANDEM_HD uint8_t f32_to_e2m1(float x) {
  uint32_t u = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return 0;
  if (u == 0x7f800000u) return static_cast<uint8_t>(sign | 0x7);
  const Rounded q = round_mini(u, 1, 0);
  if (q.r < 2u) return static_cast<uint8_t>(sign | q.r);
  const int ef = q.te + 1;
  if (ef > 3) return static_cast<uint8_t>(sign | 0x7);
  return static_cast<uint8_t>(sign | (ef << 1) | (q.r - 2u));
}
TANDEM_HD float e2m1_decode(uint8_t nibble) {
  const int m = nibble & 7;
  // 0, .5, 1, 1.5, 2, 3, 4, 6
  const float mag = m < 4 ? 0.5f * static_cast<float>(m) : (m < 6 ? static_cast<float>(m - 2) : static_cast<float>(2 * m - 8));
  return (nibble & 8) ? -mag : mag;
}

// NVFP4 group scale byte for a group's absolute maximum (see numeric.h): e4m3_rne(amax * fl32(1/6)).
TANDEM_HD uint8_t nvfp4_scale(float amax) {
  if (is_nan_bits(amax)) return f32_to_e4m3(kE4m3Max);
  return f32_to_e4m3(bits_f32(f32_bits(amax) & 0x7fffffffu) * (1.0f / kE2m1Max));
}

}  // namespace tandem::num
