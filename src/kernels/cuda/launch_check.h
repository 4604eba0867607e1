// Host entry of the PDL ordering check (launch_check.cu): enqueues a slow producer writing `value`
// into a[0..n), then b = a + 1 and c = b + 1, all three launched with launch_pdl.
#pragma once

#include <cuda_runtime_api.h>

namespace tandem::kernels::cuda {

void pdl_check_chain(int* a, int* b, int* c, int n, int value, int sleep_us, cudaStream_t s);

}  // namespace tandem::kernels::cuda
