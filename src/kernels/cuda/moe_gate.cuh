// The MoE gate's per-token routing as a warp-level device routine, shared by the moe_gate op
// (moe_gate.cu) and the fused decode routing (model/cuda/moe_decode.cu) so both give the same
// expert ids and weights bit for bit. Score layers: s + bias is computed once into the warp's
// scratch (each lane owns experts lane, lane + 32, ...), then topk passes of a warp-wide max over
// the selection key (device.cuh's order: NaN first, then larger, then the lower expert id, as the
// CPU's argmax passes); a per-lane bitmask remembers the taken experts. Hash layers read tid2eid.
// The routing weights are summed in slot order (shuffles), as the CPU op. The logits are read
// from L2 (__ldcg): the fused decode routing reads logits other CTAs of its launch wrote.
#pragma once

#include "kernels/cuda/device.cuh"
#include "kernels/ops.h"

namespace tandem::kernels::cuda {

constexpr int kMoeGateMaxExperts = 32 * kWarp;  // one taken-bit per expert in a lane's 32-bit mask
constexpr int kMoeGateMaxTopk = 32;

__device__ __forceinline__ float moe_gate_score(float z) {
  const float sp = z > 20.0f ? z : log1pf(expf(z));  // torch softplus, threshold 20
  return sqrtf(sp);
}

// Token t of p (called by all 32 lanes of a warp). sel: warp-private scratch of n_experts floats.
__device__ __forceinline__ void moe_gate_token(const MoeGateParams& p, int64_t t, float* sel, int lane) {
  const int E = p.n_experts, K = p.topk;
  const float* z = p.logits + t * E;
  int32_t* ids = p.expert_ids + t * K;
  float* w = p.weights + t * K;
  int32_t chosen = -1;  // lane i < K holds slot i's expert
  if (p.tid2eid) {
    if (lane < K) chosen = p.tid2eid[static_cast<int64_t>(p.token_ids[t]) * K + lane];
  } else {
    for (int e = lane; e < E; e += kWarp) {
      const float ze = __ldcg(z + e);
      sel[e] = p.bias ? add_rn(moe_gate_score(ze), p.bias[e]) : moe_gate_score(ze);
    }
    __syncwarp();
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
  const float sv = lane < K ? (ok ? moe_gate_score(__ldcg(z + chosen)) : NAN) : 0.0f;
  float sum = 0.0f;
  for (int i = 0; i < K; ++i) sum = add_rn(sum, __shfl_sync(0xffffffffu, sv, i));
  if (lane < K) {
    ids[lane] = chosen;
    w[lane] = mul_rn(div_rn(sv, sum), p.route_scale);
  }
  __syncwarp();  // sel is reused by the warp's next token
}

}  // namespace tandem::kernels::cuda
