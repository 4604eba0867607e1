// SwiGLU with the V4 clamp, elementwise. std::clamp / std::min semantics (NaN passes through) and
// the CPU's operation order; expf differs from the CPU's by at most 2 ulp.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

namespace tandem::kernels::cuda {
namespace {

__global__ void swiglu_kernel(SwigluParams p, int64_t ldg, int64_t ldu, int64_t ldo) {
  pdl_enter();
  const int64_t total = p.rows * p.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const bool clamp = p.limit > 0.0f;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t r = g / p.cols, i = g % p.cols;
    float gv = p.gate[r * ldg + i], uv = p.up[r * ldu + i];
    if (clamp) {
      uv = clamp_std(uv, -p.limit, p.limit);
      gv = min_std(gv, p.limit);
    }
    float v = mul_rn(div_rn(gv, add_rn(1.0f, expf(-gv))), uv);
    if (p.row_weight) v = mul_rn(p.row_weight[r], v);
    p.out[r * ldo + i] = p.round_bf16 ? round_bf16(v) : v;
  }
}

}  // namespace

void swiglu(const SwigluParams& p, cudaStream_t s) {
  validate(p);
  if (p.rows == 0 || p.cols == 0) return;
  const int64_t ldg = p.ldg > 0 ? p.ldg : p.cols, ldu = p.ldu > 0 ? p.ldu : p.cols, ldo = p.ldo > 0 ? p.ldo : p.cols;
  launch_pdl(swiglu_kernel, grid_for(p.rows * p.cols, 256), 256, 0, s, p, ldg, ldu, ldo);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
