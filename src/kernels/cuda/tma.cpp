// Tensor-map encoding for TMA (tma.h) through the driver entry point.
#include "kernels/cuda/tma.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <mutex>

#include "common/check.h"

namespace tandem::kernels::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 g_encode = nullptr;
std::once_flag g_once;

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  std::call_once(g_once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      g_encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    cudaGetLastError();  // a missing symbol must not leave a sticky error behind
  });
  return g_encode;
}

}  // namespace

bool tma_available() { return encoder() != nullptr; }

const char* tma_tile_problem(const TmaTile2d& t) {
  if (!t.base || (reinterpret_cast<uintptr_t>(t.base) & 15)) return "base address not 16-byte aligned";
  if (t.elem_bytes != 1 && t.elem_bytes != 2 && t.elem_bytes != 4) return "element size";
  if (t.cols == 0 || t.rows == 0 || t.cols > (uint64_t{1} << 32) || t.rows > (uint64_t{1} << 32)) return "dimensions";
  if (t.row_stride_bytes % 16 || t.row_stride_bytes >= (uint64_t{1} << 40) ||
      t.row_stride_bytes < t.cols * static_cast<uint64_t>(t.elem_bytes))
    return "row stride not a multiple of 16 bytes covering the row";
  if (t.box_cols == 0 || t.box_rows == 0 || t.box_cols > 256 || t.box_rows > 256) return "box size";
  if ((t.box_cols * t.elem_bytes) % 16) return "box row not a multiple of 16 bytes";
  if (t.swizzle128 && t.box_cols * t.elem_bytes > 128) return "box row wider than the 128-byte swizzle";
  return nullptr;
}

CUtensorMap tma_encode(const TmaTile2d& t) {
  const char* why = tma_tile_problem(t);
  TANDEM_CHECK_MSG(why == nullptr, why ? why : "");
  PFN_cuTensorMapEncodeTiled_v12000 enc = encoder();
  TANDEM_CHECK_MSG(enc != nullptr, "cuTensorMapEncodeTiled unavailable (driver too old)");
  CUtensorMap m;
  const cuuint64_t dims[2] = {t.cols, t.rows};
  const cuuint64_t strides[1] = {t.row_stride_bytes};
  const cuuint32_t box[2] = {t.box_cols, t.box_rows};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = enc(&m, t.dtype, 2, const_cast<void*>(t.base), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE,
                         t.swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TANDEM_CHECK_MSG(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled refused a tile the host checks accepted");
  return m;
}

}  // namespace tandem::kernels::cuda
