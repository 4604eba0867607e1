// A three-kernel PDL chain that proves launch_pdl's ordering on the device at hand (used by
// tests/cuda/launch_test.cpp): a slow producer that lets its dependent start at once, then two
// consumers that each prefetch nothing, trigger early and wait. If pdl_wait did not wait, the
// consumers would read the poisoned buffers the producer has not written yet.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/launch_check.h"

namespace tandem::kernels::cuda {
namespace {

__global__ void slow_fill_kernel(int* a, int n, int value, int sleep_us) {
  pdl_trigger();  // the dependent grid may start now: it must block in pdl_wait
  pdl_wait();
  if (threadIdx.x == 0)
    for (int i = 0; i < sleep_us; ++i) __nanosleep(1000);
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) a[i] = value;
}

__global__ void chain_step_kernel(const int* in, int* out, int n) {
  pdl_trigger();
  pdl_wait();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] + 1;
}

}  // namespace

void pdl_check_chain(int* a, int* b, int* c, int n, int value, int sleep_us, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((n + 255) / 256)), block(256);
  launch_pdl(slow_fill_kernel, grid, block, 0, s, a, n, value, sleep_us);
  launch_pdl(chain_step_kernel, grid, block, 0, s, static_cast<const int*>(a), b, n);
  launch_pdl(chain_step_kernel, grid, block, 0, s, static_cast<const int*>(b), c, n);
}

}  // namespace tandem::kernels::cuda
