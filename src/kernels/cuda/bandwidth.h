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

// The weight-stream pattern of the decode GEMV's warps (decode_gemm_body.cuh: a warp reads a tile of
// 16 rows, 128 bytes of each per 2 KB stage, walking along the rows): a warp reads tiles of
// `tile_rows` rows, `span` contiguous bytes of each per 2 KB step (tile_rows * span == 2048: 16 x
// 128, 8 x 256, 4 x 512, 2 x 1024, 1 x 2048), four steps in flight per warp, two 256-thread CTAs
// per SM, tiles dealt round-robin. Reads rows x row_bytes bytes of src (rows a multiple of
// tile_rows, row_bytes a multiple of 4 * span) and folds them into sink[0]: the DRAM cost of the
// access pattern alone, against stream_read.
void stream_read_tiles(const void* src, int64_t rows, int64_t row_bytes, int tile_rows, uint64_t* sink,
                       cudaStream_t s);

}  // namespace tandem::kernels::cuda
