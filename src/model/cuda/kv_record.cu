// The KV record encoders (kv_record.h): one block per row; group maxima first, then every element's
// code, in the numeric_core.h conversions the CPU oracle's quantizers use.
#include "model/cuda/kv_record.h"

#include <cuda_runtime.h>

#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda_model {
namespace {

// One block (128 threads) per row.
__global__ void kv_quantize_kernel(KvQuantizeArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t r = blockIdx.x;
  if (r >= a.rows) return;
  const KvRecordLayout& l = a.rec;
  float* xr = a.x + r * a.ldx;
  uint8_t* out = a.out + r * l.bytes;
  __shared__ float s_amax[64];
  if (l.kind == KvRecordKind::kBf16) {
    for (int d = threadIdx.x; d < l.head_dim; d += blockDim.x) {
      const uint16_t h = num::f32_to_bf16(xr[d]);
      out[2 * d] = static_cast<uint8_t>(h & 0xff);
      out[2 * d + 1] = static_cast<uint8_t>(h >> 8);
    }
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
}

__global__ void index_key_quantize_kernel(IndexKeyQuantizeArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t r = blockIdx.x;
  if (r >= a.rows) return;
  const IndexKeyLayout& l = a.key;
  float* xr = a.x + r * l.dim;
  uint8_t* out = a.out + r * l.bytes;
  __shared__ int s_e[64];
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
}

}  // namespace

void kv_quantize(const KvQuantizeArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(kv_quantize_kernel, static_cast<unsigned>(a.rows), 128, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void index_key_quantize(const IndexKeyQuantizeArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(index_key_quantize_kernel, static_cast<unsigned>(a.rows), 64, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
