// Token embedding (embed.h): one block per row, the row's stored weight (or zeros for an id another
// rank holds) copied into every stream; replicate_hc the same copy from an fp32 row.
#include "model/cuda/embed.h"

#include "kernels/cuda/cuda_util.h"
#include "model/cuda/model_device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::cuda_model {
namespace {

__global__ void embed_kernel(EmbedArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t r = blockIdx.x;
  if (r >= a.rows) return;
  const int64_t id = a.ids[r];
  const bool held = id >= a.vocab_begin && id < a.vocab_end;
  for (int64_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
    const float v = held ? w_at(a.embed, id - a.vocab_begin, d) : 0.0f;
    for (int k = 0; k < a.hc; ++k) a.h[(r * a.hc + k) * a.dim + d] = v;
  }
}

__global__ void replicate_hc_kernel(ReplicateHcArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t r = blockIdx.x;
  if (r >= a.rows) return;
  for (int64_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
    const float v = a.x[r * a.dim + d];
    for (int k = 0; k < a.hc; ++k) a.h[(r * a.hc + k) * a.dim + d] = v;
  }
}

}  // namespace

void embed_rows(const EmbedArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(embed_kernel, static_cast<unsigned>(a.rows), 256, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void replicate_hc(const ReplicateHcArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(replicate_hc_kernel, static_cast<unsigned>(a.rows), 256, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
