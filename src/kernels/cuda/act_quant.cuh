// Launchers shared between act_quant.cu and gemm.cu: the FP8 activation round trip from a (possibly
// batched, strided) source into a separate destination, which gemm uses for its private quantized
// copy of x (quantize_x_block).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::kernels::cuda {

// dst[r][0..cols) = act_quant_fp8(src row r) with src row r at
// src + (r / rows_per_batch) * src_batch_stride + (r % rows_per_batch) * lds. dst may equal src
// (in place) when rows_per_batch == rows. codes [rows, cols] / scales [rows, cols/block] optional.
void act_quant_fp8_rows(const float* src, int64_t lds, int64_t rows_per_batch, int64_t src_batch_stride, float* dst,
                        int64_t ldd, int64_t rows, int64_t cols, int block, uint8_t* codes, uint8_t* scales,
                        cudaStream_t s);

}  // namespace tandem::kernels::cuda
