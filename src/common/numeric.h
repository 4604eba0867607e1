// Exact scalar number formats used by DeepSeek-V4 checkpoints and its quantization-aware forward:
// bf16, f16, FP8 e4m3fn, E8M0 scales, FP4 e2m1 (packed two per byte), plus the weight quantizers
// that make-tiny / export use to write official-format tensors. Everything here is bit-exact and
// deterministic (no dependence on the FPU rounding mode: we round with integer arithmetic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <array>
#include <cstring>
#include <vector>

#include "common/numeric_core.h"

namespace tandem::num {

// Bit casts, bf16, e4m3/e2m1/E8M0 scalar conversions: numeric_core.h (shared with CUDA).

// ---- f16 (IEEE binary16) ----
// f32 -> f16, round to nearest even incl. subnormals; overflow -> inf; NaN -> quiet NaN, sign kept.
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);

// ---- FP8 e4m3fn (bias 7, no inf, 0x7f/0xff = NaN, max 448, min subnormal 2^-9) ----
extern const std::array<float, 256> kE4m3Table;
inline float e4m3_to_f32(uint8_t b) { return kE4m3Table[b]; }
// Value after a round trip (saturating); NaN stays NaN.
float round_e4m3(float x);


// ---- FP4 e2m1 (values {0,.5,1,1.5,2,3,4,6}, bit 3 = sign, no NaN/inf) ----
extern const std::array<float, 16> kE2m1Table;
inline float e2m1_to_f32(uint8_t nibble) { return kE2m1Table[nibble & 0xf]; }
float round_e2m1(float x);

// Packed FP4: element k of a row lives in byte k/2; even k = low nibble, odd k = high nibble.
inline uint8_t fp4_get(const uint8_t* packed, size_t k) {
  uint8_t b = packed[k >> 1];
  return (k & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
}
inline void fp4_set(uint8_t* packed, size_t k, uint8_t nibble) {
  uint8_t& b = packed[k >> 1];
  if (k & 1)
    b = static_cast<uint8_t>((b & 0x0f) | ((nibble & 0xf) << 4));
  else
    b = static_cast<uint8_t>((b & 0xf0) | (nibble & 0xf));
}
inline uint8_t fp4_pack(uint8_t lo, uint8_t hi) { return static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4)); }

// ---- NVFP4 (NVIDIA's 4-bit block format: e2m1 elements, one FP8 e4m3 scale per 16 elements) ----
// Single-level form, i.e. the per-tensor (second-level) scale fixed at 1.0, as the DeepSeek-V4
// `nvfp4_ds_mla` KV caches use it (local-inference-lab/vllm #82: "implicit global scale 1.0";
// FlashInfer #4955: 448 NoPE dims in groups of 16, packed e2m1 + one e4m3 scale per group).
// For a group of up to 16 values with absolute maximum amax, the scale is
//   s = e4m3_rne(amax * fl32(1/6))          (always >= 0; saturates at 448)
// and element x becomes code = e2m1_rne(x * fl32(1/s)) (saturating to +-6), decoded as
// e2m1(code) * s: the order of operations of NVIDIA's convert kernels (scale from amax times the
// reciprocal of 6, rounded to nearest, as vLLM's FlashMLA NVFP4 writer also settled on (#21);
// elements multiplied by the reciprocal of the decoded scale).
// A group whose scale rounds to 0 (amax < 6 * 2^-10) encodes as zeros (the kernels' `s ? 1/s : 0`).
// Every decoded value has at most 6 significant bits, so it is also an exact bf16 value.
constexpr size_t kNvfp4Group = 16;
// x[n] -> packed e2m1 [(n+1)/2] (even k = low nibble) + e4m3 scales [ceil(n/16)]; the last group
// may be short. NaN inputs have no e2m1 encoding: a NaN element encodes as +0 (as f32_to_e2m1).
void quantize_nvfp4(const float* x, size_t n, uint8_t* packed, uint8_t* scales);
void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, size_t n, float* y);
// In-place round trip through quantize + dequantize (no buffers); NaN elements stay NaN.
void round_nvfp4(float* x, size_t n);

// ---- weight quantizers (make-tiny / export) ----
// FP8 block-scaled weight as in the official checkpoints: W[out,in] row-major f32 ->
// e4m3 bytes [out*in] + E8M0 scales [ceil(out/block), ceil(in/block)] row-major, one per
// block x block tile (ragged edge tiles allowed). scale = 2^ceil(log2(amax/448)) computed as
// ue8m0_scale_exponent(amax, 448, 1e-4): an all-zero tile gets the floor scale 2^-22 and zero codes.
// Decode: W[n][k] = e4m3(q[n*in+k]) * e8m0(scale[(n/block)*ceil(in/block) + k/block]).
struct Fp8BlockWeight {
  std::vector<uint8_t> data;    // [out, in] e4m3fn
  std::vector<uint8_t> scale;   // [ceil(out/block), ceil(in/block)] E8M0
};
Fp8BlockWeight quantize_fp8_block(const float* w, size_t out, size_t in, size_t block = 128);
// Dequantize back to f32 [out, in] (test/debug helper).
std::vector<float> dequantize_fp8_block(const uint8_t* data, const uint8_t* scale, size_t out, size_t in,
                                        size_t block = 128);

// MXFP4 weight (routed experts): W[out,in] f32, in % 32 == 0 -> packed bytes [out, in/2] +
// E8M0 scales [out, in/32]. scale = 2^ceil(log2(amax/6)) (amax floored at 6*2^-126, so an all-zero
// group gets scale 2^-126 and zero codes); element = e2m1 RNE of clamp(w/scale, +-6).
struct Mxfp4Weight {
  std::vector<uint8_t> data;    // [out, in/2] packed e2m1, even k = low nibble
  std::vector<uint8_t> scale;   // [out, in/32] E8M0
};
Mxfp4Weight quantize_mxfp4(const float* w, size_t out, size_t in);
std::vector<float> dequantize_mxfp4(const uint8_t* data, const uint8_t* scale, size_t out, size_t in);

constexpr size_t kMxfp4Group = 32;

}  // namespace tandem::num
