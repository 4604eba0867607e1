// MoE gate, one warp per token; the per-token routine is moe_gate.cuh's (shared with the fused
// decode routing of model/cuda/moe_decode_route.cu).
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/moe_gate.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpsPerCta = 4;

__global__ void __launch_bounds__(kWarpsPerCta * kWarp) moe_gate_kernel(MoeGateParams p) {
  __shared__ float sel_s[kWarpsPerCta][kMoeGateMaxExperts];  // s + bias of the warp's token
  const int lane = threadIdx.x & 31;
  float* sel = sel_s[threadIdx.x >> 5];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5); t < p.tokens; t += warps)
    moe_gate_token(p, t, sel, lane);
}

}  // namespace

void moe_gate(const MoeGateParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK_MSG(p.n_experts <= kMoeGateMaxExperts && p.topk <= kMoeGateMaxTopk, "moe_gate: at most 1024 experts, top-32");
  moe_gate_kernel<<<grid_for(p.tokens, kWarpsPerCta), kWarpsPerCta * kWarp, 0, s>>>(p);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
