// The memory ceilings the benchmarks divide by (tandem bench-kernels): a streaming copy and a
// streaming read over device buffers, 16 bytes per thread access, 8 accesses in flight per thread,
// one grid-stride pass with every SM busy.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tandem::kernels::cuda {

// dst[0, bytes) = src[0, bytes); bytes a multiple of 128, both 16-byte aligned.
void stream_copy(const void* src, void* dst, size_t bytes, cudaStream_t s);
// Reads src[0, bytes) and folds it into sink[0] (so the loads cannot be dropped); same rules.
void stream_read(const void* src, size_t bytes, uint64_t* sink, cudaStream_t s);

}  // namespace tandem::kernels::cuda
