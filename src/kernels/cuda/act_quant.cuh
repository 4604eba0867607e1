// Launchers shared between act_quant.cu and gemm.cu: the FP8 activation round trip from a (possibly
// batched, strided) source into a separate destination, which gemm uses for its private quantized
// copy of x (quantize_x_block).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::kernels::cuda {

// dst[r][0..cols) = act_quant_fp8(src row r) with src row r at
// src + (r / rows_per_batch) * src_batch_stride + (r % rows_per_batch) * lds. dst may equal src
// (in place) when rows_per_batch == rows.
struct QuantRowsArgs {
  const float* src = nullptr;   // [batches][rows_per_batch, lds], batch stride src_batch_stride
  int64_t lds = 0;
  int64_t rows_per_batch = 0;
  int64_t src_batch_stride = 0;
  float* dst = nullptr;         // [rows, ldd]
  int64_t ldd = 0;
  int64_t rows = 0;
  int64_t cols = 0;             // multiple of block
  int block = 128;
  uint8_t* codes = nullptr;     // optional [rows, cols] e4m3fn
  uint8_t* scales = nullptr;    // optional [rows, cols/block] E8M0
};
void act_quant_fp8_rows(const QuantRowsArgs& a, cudaStream_t s);

}  // namespace tandem::kernels::cuda
