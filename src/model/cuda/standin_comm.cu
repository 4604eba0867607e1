// StandinComm's device work (standin_comm.h): one grid-stride kernel per collective.
#include "model/cuda/standin_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/numeric_core.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda_model {
namespace {

__global__ void scale_f32_kernel(float* x, int64_t n, float f) {
  kernels::cuda::pdl_enter();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) x[i] *= f;
}

// The sum of `f` equal bf16 values, widened to fp32 and rounded once (the contract's bf16 sum).
__global__ void scale_bf16_kernel(uint16_t* x, int64_t n, float f) {
  kernels::cuda::pdl_enter();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    x[i] = num::f32_to_bf16(num::bf16_to_f32(x[i]) * f);
}

// out[r * n + i] = in[i] for every rank slot r (n elements of T).
template <typename T>
__global__ void gather_kernel(const T* in, int64_t n, int size, T* out) {
  kernels::cuda::pdl_enter();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const T v = in[i];
    for (int r = 0; r < size; ++r) out[r * n + i] = v;
  }
}

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 132 * 8))); }

}  // namespace

void standin_scale(void* x, int64_t n, bool bf16, float f, cudaStream_t s) {
  if (n == 0) return;
  if (bf16)
    kernels::cuda::launch_pdl(scale_bf16_kernel, grid_for(n), 256, 0, s, static_cast<uint16_t*>(x), n, f);
  else
    kernels::cuda::launch_pdl(scale_f32_kernel, grid_for(n), 256, 0, s, static_cast<float*>(x), n, f);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void standin_gather(const void* in, size_t bytes, int size, void* out, cudaStream_t s) {
  if (bytes == 0) return;
  const bool words = bytes % 4 == 0 && reinterpret_cast<uintptr_t>(in) % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  if (words) {
    const int64_t n = static_cast<int64_t>(bytes / 4);
    kernels::cuda::launch_pdl(gather_kernel<uint32_t>, grid_for(n), 256, 0, s, static_cast<const uint32_t*>(in), n, size,
                              static_cast<uint32_t*>(out));
  } else {
    const int64_t n = static_cast<int64_t>(bytes);
    kernels::cuda::launch_pdl(gather_kernel<uint8_t>, grid_for(n), 256, 0, s, static_cast<const uint8_t*>(in), n, size,
                              static_cast<uint8_t*>(out));
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
