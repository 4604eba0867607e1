// Token embedding (embed.h): one block per row, the row's stored weight copied into every stream.
#include "model/cuda/embed.h"

#include "kernels/cuda/cuda_util.h"
#include "model/cuda/model_device.cuh"

namespace tandem::cuda_model {
namespace {

__global__ void embed_kernel(EmbedArgs a) {
  const int64_t r = blockIdx.x;
  if (r >= a.rows) return;
  const int32_t id = a.ids[r];
  for (int64_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
    const float v = w_at(a.embed, id, d);
    for (int k = 0; k < a.hc; ++k) a.h[(r * a.hc + k) * a.dim + d] = v;
  }
}

}  // namespace

void embed_rows(const EmbedArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  embed_kernel<<<static_cast<unsigned>(a.rows), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
