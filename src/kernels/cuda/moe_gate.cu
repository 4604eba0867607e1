// MoE gate, one warp per token. Score layers: s + bias is computed once into shared memory (each
// lane owns experts lane, lane + 32, ...), then topk passes of a warp-wide max over the selection
// key (device.cuh's order: NaN first, then larger, then the lower expert id, as the CPU's argmax
// passes); a per-lane bitmask remembers the taken experts. Hash layers read tid2eid. The
// routing weights are summed in slot order (shuffles), as the CPU op.
#include "common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kMaxExperts = 32 * kWarp;  // one taken-bit per expert in a lane's 32-bit mask
constexpr int kMaxTopk = 32;

__device__ __forceinline__ float gate_score(float z) {
  const float sp = z > 20.0f ? z : log1pf(expf(z));  // torch softplus, threshold 20
  return sqrtf(sp);
}

__global__ void __launch_bounds__(kWarpsPerCta * kWarp) moe_gate_kernel(MoeGateParams p) {
  __shared__ float sel_s[kWarpsPerCta][kMaxExperts];  // s + bias of the warp's token
  const int lane = threadIdx.x & 31;
  float* sel = sel_s[threadIdx.x >> 5];
  const int E = p.n_experts, K = p.topk;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerCta;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + (threadIdx.x >> 5); t < p.tokens; t += warps) {
    const float* z = p.logits + t * E;
    int32_t* ids = p.expert_ids + t * K;
    float* w = p.weights + t * K;
    int32_t chosen = -1;  // lane i < K holds slot i's expert
    if (p.tid2eid) {
      if (lane < K) chosen = p.tid2eid[static_cast<int64_t>(p.token_ids[t]) * K + lane];
    } else {
      for (int e = lane; e < E; e += kWarp) sel[e] = p.bias ? add_rn(gate_score(z[e]), p.bias[e]) : gate_score(z[e]);
      uint32_t taken = 0;  // bit j: expert lane + 32 j
      for (int i = 0; i < K; ++i) {
        uint64_t best = 0;
        for (int j = 0, e = lane; e < E; ++j, e += kWarp) {
          if (taken & (1u << j)) continue;
          const uint64_t key = select_key(sel[e], static_cast<uint32_t>(e));
          best = key > best ? key : best;
        }
        best = warp_max_u64(best);
        const int e = static_cast<int>(select_key_index(best));
        if (e % kWarp == lane) taken |= 1u << (e / kWarp);
        if (lane == i) chosen = e;
      }
    }
    // Valid ids were checked by the caller; a bad one reads no memory and gives a NaN weight.
    const bool ok = chosen >= 0 && chosen < E;
    const float sv = lane < K ? (ok ? gate_score(z[chosen]) : NAN) : 0.0f;
    float sum = 0.0f;
    for (int i = 0; i < K; ++i) sum = add_rn(sum, __shfl_sync(0xffffffffu, sv, i));
    if (lane < K) {
      ids[lane] = chosen;
      w[lane] = mul_rn(div_rn(sv, sum), p.route_scale);
    }
  }
}

}  // namespace

void moe_gate(const MoeGateParams& p, cudaStream_t s) {
  validate(p);
  if (p.tokens == 0) return;
  TANDEM_CHECK_MSG(p.n_experts <= kMaxExperts && p.topk <= kMaxTopk, "moe_gate: at most 1024 experts, top-32");
  moe_gate_kernel<<<grid_for(p.tokens, kWarpsPerCta), kWarpsPerCta * kWarp, 0, s>>>(p);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::kernels::cuda
