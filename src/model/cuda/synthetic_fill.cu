// Kernels of the synthetic fills (synthetic_fill.h): one thread per element (weights) or per byte
// (records), grid-stride, so any size fills in one launch; the values are the header's functions.
#include "model/cuda/synthetic_fill.h"

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/cuda_util.h"

namespace tandem::cuda_model::synth {
namespace {

__global__ void fill_kernel(FillArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int bytes = fill_element_bytes(a.kind);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n; i += stride) {
    const uint32_t v = fill_element(a, i);
    if (bytes == 1)
      static_cast<uint8_t*>(a.out)[i] = static_cast<uint8_t>(v);
    else if (bytes == 2)
      static_cast<uint16_t*>(a.out)[i] = static_cast<uint16_t>(v);
    else
      static_cast<uint32_t*>(a.out)[i] = v;
  }
}

__global__ void fill_records_kernel(RecordFillArgs a) {
  const int64_t per_region = a.count * a.rec_bytes;
  const int64_t total = a.regions * per_region;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / per_region, in_region = i % per_region;
    const int64_t j = in_region / a.rec_bytes, b = in_region % a.rec_bytes;
    const int64_t blk = a.blocks ? a.blocks[r] : r;
    a.base[blk * a.region_stride + a.offset + in_region] = record_byte(a, blk, j, b);
  }
}

unsigned grid_for(int64_t n) {
  // Enough blocks to fill the GPU several times over; the loops stride over the rest.
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 132 * 64)));
}

}  // namespace

void fill(const FillArgs& a, cudaStream_t s) {
  if (a.n == 0) return;
  TANDEM_CHECK(a.out != nullptr);
  fill_kernel<<<grid_for(a.n), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void fill_records(const RecordFillArgs& a, cudaStream_t s) {
  const int64_t total = a.regions * a.count * a.rec_bytes;
  if (total == 0) return;
  TANDEM_CHECK(a.base != nullptr && a.rec_bytes > 0);
  fill_records_kernel<<<grid_for(total), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model::synth
