// The KV record encoders' per-row bodies (kv_record.h), shared by kv_record.cu's kernels and the
// fused kernels that end with a record write (norm_rope.cu): one copy of the encoding, so a fused
// kernel writes the records and round trip of the encoder bit for bit.
#pragma once

#include "kernels/cuda/device.cuh"
#include "model/cuda/kv_record.h"

namespace tandem::cuda_model::rec {

// Shared memory of the row encoders.
union RecSmem {
  float amax[64];  // kv_quantize_row: NoPE group maxima (fp8: nope/64 groups, nvfp4: nope/16)
  int e[64];       // index_key_quantize_row: E8M0 exponents (dim/32 groups)
};

// Row xr[0, l.head_dim): group maxima first, then every element's code, in the numeric_core.h
// conversions the CPU oracle's quantizers use; the NoPE dims are rewritten with their round trip,
// the record goes to out[0, l.bytes). Called by every thread of the block (any size); ends with a
// barrier.
__device__ __forceinline__ void kv_quantize_row(float* xr, uint8_t* out, const KvRecordLayout& l, RecSmem& sm) {
  float* s_amax = sm.amax;
  if (l.kind == KvRecordKind::kBf16) {
    for (int d = threadIdx.x; d < l.head_dim; d += blockDim.x) {
      const uint16_t h = num::f32_to_bf16(xr[d]);
      out[2 * d] = static_cast<uint8_t>(h & 0xff);
      out[2 * d + 1] = static_cast<uint8_t>(h >> 8);
    }
    __syncthreads();  // uniform: the kind is the block's
    return;
  }
  // RoPE dims: bf16 (the values are bf16 already).
  for (int d = l.nope + threadIdx.x; d < l.head_dim; d += blockDim.x) {
    const uint16_t h = num::f32_to_bf16(xr[d]);
    const int off = l.rope_off + 2 * (d - l.nope);
    out[off] = static_cast<uint8_t>(h & 0xff);
    out[off + 1] = static_cast<uint8_t>(h >> 8);
  }
  const int group = l.kind == KvRecordKind::kFp8 ? 64 : 16;
  const int ngroups = l.nope / group;
  // Group maxima (NaN ignored, as the CPU's comparisons do).
  for (int g = threadIdx.x; g < ngroups; g += blockDim.x) {
    float amax = 0.0f;
    for (int i = 0; i < group; ++i) {
      const float v = fabsf(xr[g * group + i]);
      amax = v > amax ? v : amax;
    }
    s_amax[g] = amax;
  }
  // pad bytes between the scales and the RoPE dims
  for (int b = l.scale_off + ngroups + threadIdx.x; b < l.rope_off; b += blockDim.x) out[b] = 0;
  __syncthreads();
  for (int d = threadIdx.x; d < l.nope; d += blockDim.x) {
    const int g = d / group;
    const float xv = xr[d];
    const bool nan = num::is_nan_bits(xv);
    if (l.kind == KvRecordKind::kFp8) {
      const int e = num::ue8m0_scale_exponent(s_amax[g], num::kE4m3Max, num::kFp8ActAmaxFloor);
      const float sc = num::pow2_int(e);
      float v = xv / sc;
      v = fminf(fmaxf(v, -num::kE4m3Max), num::kE4m3Max);
      const uint8_t c = num::f32_to_e4m3(nan ? xv : v);
      out[d] = c;
      if (d % 64 == 0) out[l.scale_off + g] = num::e8m0_from_exponent(e);
      xr[d] = num::e4m3_decode(c) * sc;
    } else {
      const uint8_t sb = num::nvfp4_scale(s_amax[g]);
      const float sc = num::e4m3_decode(sb);
      const float inv = sc != 0.0f ? 1.0f / sc : 0.0f;
      const uint8_t c = num::f32_to_e2m1(xv * inv);
      if (d % 16 == 0) out[l.scale_off + g] = sb;
      xr[d] = nan ? xv : num::e2m1_decode(c) * sc;
    }
  }
  if (l.kind == KvRecordKind::kNvfp4) {
    // Two codes per byte: packed after every element is rewritten. The decoded values are
    // e2m1 * scale exactly, so dividing by the scale gives each code back. A group whose scale is
    // zero (amax / 6 below e4m3's smallest subnormal) decoded to signed zeros: x * 0 in the CPU's
    // encoder gives -0 (code 8) for a negative element, and v = -0 keeps that sign, so the code of
    // v itself is the CPU's (forcing 0 there lost the sign byte for byte). NaN encodes as +0
    // (f32_to_e2m1), as the CPU's NaN * inv does.
    __syncthreads();
    for (int b = threadIdx.x; b < l.nope / 2; b += blockDim.x) {
      uint8_t nib[2];
      for (int i = 0; i < 2; ++i) {
        const int d = 2 * b + i;
        const float sc = num::e4m3_decode(out[l.scale_off + d / 16]);
        const float v = xr[d];
        nib[i] = num::f32_to_e2m1(sc != 0.0f ? v / sc : v);
      }
      out[b] = static_cast<uint8_t>(nib[0] | (nib[1] << 4));
    }
  }
  __syncthreads();
}

// Row xr[0, l.dim): fp4_act_quant(x, 32)'s round trip in place, its key record to out[0, l.bytes).
// Called by every thread of the block (any size); ends with a barrier.
__device__ __forceinline__ void index_key_quantize_row(float* xr, uint8_t* out, const IndexKeyLayout& l, RecSmem& sm) {
  int* s_e = sm.e;
  const int ng = l.dim / 32;
  for (int g = threadIdx.x; g < ng; g += blockDim.x) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float v = fabsf(xr[g * 32 + i]);
      amax = v > amax ? v : amax;
    }
    s_e[g] = num::ue8m0_scale_exponent(amax, num::kE2m1Max, num::kFp4ActAmaxFloor);
    out[l.dim / 2 + g] = num::e8m0_from_exponent(s_e[g]);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < l.dim / 2; b += blockDim.x) {
    uint8_t nib[2];
    float dec[2];
    for (int i = 0; i < 2; ++i) {
      const int d = 2 * b + i;
      const float sc = num::pow2_int(s_e[d / 32]);
      const float xv = xr[d];
      // std::clamp semantics (NaN passes through and encodes as +0), as the CPU's fp4_act_quant.
      nib[i] = num::f32_to_e2m1(kernels::cuda::clamp_std(xv / sc, -num::kE2m1Max, num::kE2m1Max));
      dec[i] = num::is_nan_bits(xv) ? xv : num::e2m1_decode(nib[i]) * sc;
    }
    out[b] = static_cast<uint8_t>(nib[0] | (nib[1] << 4));
    xr[2 * b] = dec[0];
    xr[2 * b + 1] = dec[1];
  }
  __syncthreads();
}

}  // namespace tandem::cuda_model::rec
