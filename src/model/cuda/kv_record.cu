// The KV record encoders (kv_record.h): one block per row, the row bodies in kv_record.cuh.
#include "model/cuda/kv_record.h"
#include "model/cuda/kv_record.cuh"

#include <cuda_runtime.h>

#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda_model {
namespace {

// One block (128 threads) per row.
__global__ void kv_quantize_kernel(KvQuantizeArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t r = blockIdx.x;
  if (r >= a.rows) return;
  __shared__ rec::RecSmem sm;
  rec::kv_quantize_row(a.x + r * a.ldx, a.out + r * a.rec.bytes, a.rec, sm);
}

__global__ void index_key_quantize_kernel(IndexKeyQuantizeArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t r = blockIdx.x;
  if (r >= a.rows) return;
  __shared__ rec::RecSmem sm;
  rec::index_key_quantize_row(a.x + r * a.key.dim, a.out + r * a.key.bytes, a.key, sm);
}

}  // namespace

void kv_quantize(const KvQuantizeArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(kv_quantize_kernel, static_cast<unsigned>(a.rows), 128, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void index_key_quantize(const IndexKeyQuantizeArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(index_key_quantize_kernel, static_cast<unsigned>(a.rows), 64, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
