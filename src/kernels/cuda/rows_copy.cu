// Row gather (dst[i] = src[rows[i]]) and deterministic scatter-add (dst[rows[i]] += src[i]).
// Scatter-add: rows may repeat, so every column is one thread that applies the updates in index
// order (bit-exact with the CPU's sequential loop, no atomics). Updates are taken 8 at a time: when
// the 8 target rows are distinct (the MoE case) their loads are issued together.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

__global__ void gather_kernel(RowsCopyParams p, int64_t lds, int64_t ldd) {
  pdl_enter();
  const int64_t total = p.count * p.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t i = g / p.cols, c = g % p.cols;
    p.dst[i * ldd + c] = p.src[static_cast<int64_t>(p.rows[i]) * lds + c];
  }
}

constexpr int kBatch = 8;

__global__ void scatter_add_kernel(RowsCopyParams p, int64_t lds, int64_t ldd) {
  pdl_enter();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < p.cols; c += stride) {
    int64_t i = 0;
    for (; i + kBatch <= p.count; i += kBatch) {
      int64_t row[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) row[j] = p.rows[i + j];
      bool distinct = true;
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
#pragma unroll
        for (int l = j + 1; l < kBatch; ++l) distinct &= row[j] != row[l];
      if (distinct) {
        float d[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) d[j] = p.dst[row[j] * ldd + c];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) p.dst[row[j] * ldd + c] = add_rn(d[j], p.src[(i + j) * lds + c]);
      } else {
        for (int j = 0; j < kBatch; ++j) {
          float* d = p.dst + row[j] * ldd + c;
          *d = add_rn(*d, p.src[(i + j) * lds + c]);
        }
      }
    }
    for (; i < p.count; ++i) {
      float* d = p.dst + static_cast<int64_t>(p.rows[i]) * ldd + c;
      *d = add_rn(*d, p.src[i * lds + c]);
    }
  }
}

}  // namespace

void rows_copy(const RowsCopyParams& p, cudaStream_t s) {
  validate(p);
  if (p.count == 0 || p.cols == 0) return;
  const int64_t lds = p.lds > 0 ? p.lds : p.cols, ldd = p.ldd > 0 ? p.ldd : p.cols;
  if (p.gather) {
    launch_pdl(gather_kernel, grid_for(p.count * p.cols, 256), 256, 0, s, p, lds, ldd);
  } else {
    launch_pdl(scatter_add_kernel, grid_for(p.cols, 128), 128, 0, s, p, lds, ldd);
  }
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
