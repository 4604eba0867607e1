// Device-side random fills for benchmarks (tandem bench-kernels): stored weight bytes, scales and
// activations generated from a hash of (seed, index) on the GPU, so multi-GB weight sets need no
// host copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tandem::kernels::cuda {

enum class RandomFill : uint8_t {
  kBytes,       // any byte (packed e2m1 pairs)
  kE4m3,        // e4m3fn codes, never NaN
  kE8m0,        // E8M0 exponents in [lo, hi]
  kBf16,        // uint16 bf16 bits, uniform in [-scale, scale)
  kF32Bf16,     // fp32 holding bf16 values, uniform in [-scale, scale), never 0
};

// `count` elements of the kind at p.
void random_fill(void* p, size_t count, RandomFill kind, uint64_t seed, cudaStream_t s, float scale = 1.0f,
                 int lo = 118, int hi = 122);

}  // namespace tandem::kernels::cuda
