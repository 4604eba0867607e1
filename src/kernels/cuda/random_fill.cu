// random_fill (see random_fill.h): splitmix64 of (seed, index), one element per thread-iteration.
#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/random_fill.h"

namespace tandem::kernels::cuda {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_kernel(void* p, size_t count, RandomFill kind, uint64_t seed, float scale, int lo, int hi) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const uint64_t r = mix(seed * 0x100000001b3ull + i);
    switch (kind) {
      case RandomFill::kBytes: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(r); break;
      case RandomFill::kE4m3: {
        uint8_t b = static_cast<uint8_t>(r);
        if ((b & 0x7f) == 0x7f) b ^= 1;
        static_cast<uint8_t*>(p)[i] = b;
        break;
      }
      case RandomFill::kE8m0: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(lo + (r >> 8) % (hi - lo + 1)); break;
      case RandomFill::kBf16:
      case RandomFill::kF32Bf16: {
        float v = scale * (static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)) / (1 << 23));
        if (v == 0.0f) v = 0.5f * scale;
        if (kind == RandomFill::kBf16) static_cast<uint16_t*>(p)[i] = num::f32_to_bf16(v);
        else static_cast<float*>(p)[i] = num::round_bf16(v);
        break;
      }
    }
  }
}

}  // namespace

void random_fill(void* p, size_t count, RandomFill kind, uint64_t seed, cudaStream_t s, float scale, int lo, int hi) {
  if (count == 0) return;
  TANDEM_CHECK(lo <= hi);
  fill_kernel<<<grid_for(static_cast<int64_t>(count), 256 * 16), 256, 0, s>>>(p, count, kind, seed, scale, lo, hi);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
