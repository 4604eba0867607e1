// Device helpers shared by the runner's kernels (src/model/cuda/*.cu): one element of a stored
// weight in any format, a warp's dot product with a weight row, and a slot's state base.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/numeric_core.h"
#include "kernels/cuda/device.cuh"
#include "kernels/ops.h"

namespace tandem::cuda_model {

// Element (n, k) of a stored weight (any format).
__device__ __forceinline__ float w_at(const kernels::WeightRef& w, int64_t n, int64_t k) {
  switch (w.format) {
    case kernels::WeightFormat::kF32:
      return static_cast<const float*>(w.data)[n * w.k + k];
    case kernels::WeightFormat::kBf16:
      return num::bf16_to_f32(static_cast<const uint16_t*>(w.data)[n * w.k + k]);
    case kernels::WeightFormat::kFp8Block: {
      const int64_t sld = w.scale_ld ? w.scale_ld : (w.k + 127) / 128;
      return num::e4m3_decode(static_cast<const uint8_t*>(w.data)[n * w.k + k]) *
             num::e8m0_to_f32(w.scale[(n / 128) * sld + k / 128]);
    }
    case kernels::WeightFormat::kMxfp4: {
      const uint8_t b = static_cast<const uint8_t*>(w.data)[n * (w.k / 2) + k / 2];
      const uint8_t nib = (k & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
      return num::e2m1_decode(nib) * num::e8m0_to_f32(w.scale[n * (w.k / 32) + k / 32]);
    }
  }
  return 0.0f;
}

// Warp dot product of x[0..k) (shared or global fp32) with weight row n, fp32 accumulation.
__device__ __forceinline__ float warp_row_dot(const kernels::WeightRef& w, int64_t n, const float* x, int64_t k) {
  const int lane = threadIdx.x & 31;
  float acc = 0.0f;
  if (w.format == kernels::WeightFormat::kMxfp4) {
    // 32 consecutive values share a scale: lane handles pairs (2 values per byte).
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + n * (k / 2);
    const uint8_t* sc = w.scale + n * (k / 32);
    for (int64_t b = lane; b < k / 2; b += 32) {
      const uint8_t v = row[b];
      const float s = num::e8m0_to_f32(sc[(2 * b) / 32]);
      acc += x[2 * b] * (num::e2m1_decode(static_cast<uint8_t>(v & 0xf)) * s);
      acc += x[2 * b + 1] * (num::e2m1_decode(static_cast<uint8_t>(v >> 4)) * s);
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) acc += x[i] * w_at(w, n, i);
  }
  return kernels::cuda::warp_sum(acc);
}

__device__ __forceinline__ uint8_t* slot_base(uint8_t* state, int64_t slot_bytes, int slot) {
  return state + static_cast<int64_t>(slot) * slot_bytes;
}

}  // namespace tandem::cuda_model
