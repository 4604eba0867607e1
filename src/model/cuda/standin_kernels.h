// The device work of StandinComm (standin_comm.h), apart so the .cu needs no Status/fmt headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda_model {

// x[i] *= f for n fp32 values (bf16: widened, multiplied, rounded once).
void standin_scale(void* x, int64_t n, bool bf16, float f, cudaStream_t s);
// out[r * bytes + i] = in[i] for every rank slot r < size.
void standin_gather(const void* in, size_t bytes, int size, void* out, cudaStream_t s);

}  // namespace tandem::cuda_model
