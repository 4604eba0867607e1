// Tensor maps for the Hopper bulk tensor copy engine (TMA, cp.async.bulk.tensor): 2-D row-major
// tiles of a global matrix, encoded on the host through the driver's cuTensorMapEncodeTiled (fetched
// with cudaGetDriverEntryPointByVersion, so nothing links libcuda). Encoding is host arithmetic
// only: a launcher may encode per call, also while a CUDA graph is being captured (the map travels
// by value as a __grid_constant__ kernel parameter).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace tandem::kernels::cuda {

struct TmaTile2d {
  const void* base = nullptr;      // 16-byte aligned
  CUtensorMapDataType dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  int elem_bytes = 1;
  uint64_t cols = 0;               // elements per row (the inner dimension)
  uint64_t rows = 0;
  uint64_t row_stride_bytes = 0;   // multiple of 16
  uint32_t box_cols = 0;           // box_cols * elem_bytes a multiple of 16 (<= 128 with the swizzle)
  uint32_t box_rows = 0;           // <= 256
  bool swizzle128 = false;         // 16-byte chunk c of box row r lands at chunk c ^ (r % 8)
};

// True when the driver offers cuTensorMapEncodeTiled (any CUDA 12+ driver).
bool tma_available();
// Why `t` cannot be encoded (null when it can): the encoder's documented requirements, checked on
// the host so a caller can refuse a shape before launching anything.
const char* tma_tile_problem(const TmaTile2d& t);
// The encoded map; out-of-bounds elements of a box read as zeros. CHECK-fails when tma_tile_problem
// says no (callers check first) or the driver refuses.
CUtensorMap tma_encode(const TmaTile2d& t);

}  // namespace tandem::kernels::cuda
