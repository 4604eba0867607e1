// The MoE gate's per-token routing as device routines, shared by the moe_gate op (moe_gate.cu) and
// the fused decode routing (model/cuda/moe_decode_route.cu) so both give the same expert ids and
// weights bit for bit. Score layers: s + bias of every expert (moe_gate_sel) is computed once into
// scratch, then a warp (moe_gate_pick; each lane owns experts lane, lane + 32, ...) makes topk
// passes of a warp-wide max over the selection key (device.cuh's order: NaN first, then larger,
// then the lower expert id, as the CPU's argmax passes); a per-lane bitmask remembers the taken
// experts. Hash layers read tid2eid. The routing weights are summed in slot order (shuffles), as
// the CPU op. The fused decode routing fills the scratch with all its threads and reads the logits
// from shared memory; the op does both per warp (moe_gate_token).
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

// The warp-wide max of select keys (device.cuh's uint64 order: score key, then index key) as two
// 32-bit reductions (redux.sync, sm_80 and later): the largest score key, then the largest index
// key among the lanes holding it. The same value as warp_max_u64 in two steps instead of five.
__device__ __forceinline__ uint64_t moe_gate_warp_max(uint64_t v) {
  const uint32_t hi = static_cast<uint32_t>(v >> 32), lo = static_cast<uint32_t>(v);
  const uint32_t mh = __reduce_max_sync(0xffffffffu, hi);
  const uint32_t ml = __reduce_max_sync(0xffffffffu, hi == mh ? lo : 0u);
  return (static_cast<uint64_t>(mh) << 32) | ml;
}

// The selection value of an expert with logit z: its score, plus its bias on score layers.
__device__ __forceinline__ float moe_gate_sel(float z, bool has_bias, float bias) {
  return has_bias ? add_rn(moe_gate_score(z), bias) : moe_gate_score(z);
}

// The routing weights of a token whose lane i < topk holds slot i's expert `chosen` (called by all
// 32 lanes of a warp): lane i < topk gets its id and weight (the scores of the chosen experts summed
// in slot order, as the CPU op). z: the token's n_experts logits, visible to the warp; kScored:
// their moe_gate_score values instead (the caller kept them: one copy of the score's code less).
template <bool kScored = false>
__device__ __forceinline__ void moe_gate_weights(const MoeGateParams& p, const float* z, int32_t chosen, int lane,
                                                 int32_t& id, float& weight) {
  const int E = p.n_experts, K = p.topk;
  // Valid ids were checked by the caller; a bad one reads no memory and gives a NaN weight.
  const bool ok = chosen >= 0 && chosen < E;
  const float sv = lane < K ? (ok ? (kScored ? z[chosen] : moe_gate_score(z[chosen])) : NAN) : 0.0f;
  float sum = 0.0f;
  for (int i = 0; i < K; ++i) sum = add_rn(sum, __shfl_sync(0xffffffffu, sv, i));
  id = chosen;
  weight = lane < K ? mul_rn(div_rn(sv, sum), p.route_scale) : 0.0f;
}

// A score layer's choice (called by all 32 lanes of a warp): topk passes of a warp-wide max over
// the selection keys of the experts not yet taken. Lane i < topk gets slot i's expert.
__device__ __forceinline__ int32_t moe_gate_choose(int n_experts, int topk, const float* sel, int lane) {
  int32_t chosen = -1;
  uint32_t taken = 0;  // bit j: expert lane + 32 j
  for (int i = 0; i < topk; ++i) {
    uint64_t best = 0;
    for (int j = 0, e = lane; e < n_experts; ++j, e += kWarp) {
      if (taken & (1u << j)) continue;
      const uint64_t key = select_key(sel[e], static_cast<uint32_t>(e));
      best = key > best ? key : best;
    }
    best = moe_gate_warp_max(best);
    const int e = static_cast<int>(select_key_index(best));
    if (e % kWarp == lane) taken |= 1u << (e / kWarp);
    if (lane == i) chosen = e;
  }
  return chosen;
}

// Token t's experts and weights (called by all 32 lanes of a warp): lane i < topk gets slot i's
// expert id and weight. z: the token's n_experts logits; sel: their moe_gate_sel values (score
// layers; unread on hash layers), both visible to the warp (shared or global memory).
__device__ __forceinline__ void moe_gate_pick(const MoeGateParams& p, int64_t t, const float* z, const float* sel,
                                              int lane, int32_t& id, float& weight) {
  const int K = p.topk;
  int32_t chosen = -1;  // lane i < K holds slot i's expert
  if (p.tid2eid) {
    if (lane < K) chosen = p.tid2eid[static_cast<int64_t>(p.token_ids[t]) * K + lane];
  } else {
    chosen = moe_gate_choose(p.n_experts, K, sel, lane);
  }
  moe_gate_weights(p, z, chosen, lane, id, weight);
}

// moe_gate_choose on a score layer of at most kMoeGateSortedExperts experts (8 a lane), from
// registers: each lane sorts its experts' selection keys (a 19-comparator network, 0-1 principle
// checked), then each of the topk passes takes the largest of the lanes' heads (two redux.sync)
// and the lane holding it drops its head. The keys are distinct, so the same experts in the same
// order as the passes over shared memory. Lane i < topk gets slot i's expert.
constexpr int kMoeGateSortedExperts = 8 * kWarp;
__device__ __forceinline__ void moe_gate_cas(uint64_t& a, uint64_t& b) {  // a = max, b = min
  const uint64_t x = a, y = b;
  a = x > y ? x : y;
  b = x > y ? y : x;
}
__device__ __forceinline__ int32_t moe_gate_choose_sorted(int n_experts, int topk, const float* sel, int lane) {
  uint64_t k[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int e = lane + j * kWarp;
    k[j] = e < n_experts ? select_key(sel[e], static_cast<uint32_t>(e)) : 0;
  }
  moe_gate_cas(k[0], k[2]), moe_gate_cas(k[1], k[3]), moe_gate_cas(k[4], k[6]), moe_gate_cas(k[5], k[7]);
  moe_gate_cas(k[0], k[4]), moe_gate_cas(k[1], k[5]), moe_gate_cas(k[2], k[6]), moe_gate_cas(k[3], k[7]);
  moe_gate_cas(k[0], k[1]), moe_gate_cas(k[2], k[3]), moe_gate_cas(k[4], k[5]), moe_gate_cas(k[6], k[7]);
  moe_gate_cas(k[2], k[4]), moe_gate_cas(k[3], k[5]);
  moe_gate_cas(k[1], k[4]), moe_gate_cas(k[3], k[6]);
  moe_gate_cas(k[1], k[2]), moe_gate_cas(k[3], k[4]), moe_gate_cas(k[5], k[6]);
  int32_t chosen = -1;
#pragma unroll 1
  for (int i = 0; i < topk; ++i) {
    const uint64_t best = moe_gate_warp_max(k[0]);
    if (k[0] == best) {
#pragma unroll
      for (int j = 0; j < 7; ++j) k[j] = k[j + 1];
      k[7] = 0;
    }
    if (lane == i) chosen = static_cast<int32_t>(select_key_index(best));
  }
  return chosen;
}

// Token t of p (called by all 32 lanes of a warp). sel: warp-private scratch of n_experts floats.
__device__ __forceinline__ void moe_gate_token(const MoeGateParams& p, int64_t t, float* sel, int lane) {
  const int E = p.n_experts, K = p.topk;
  const float* z = p.logits + t * E;
  if (!p.tid2eid) {
    for (int e = lane; e < E; e += kWarp) sel[e] = moe_gate_sel(z[e], p.bias != nullptr, p.bias ? p.bias[e] : 0.0f);
    __syncwarp();
  }
  int32_t id;
  float w;
  moe_gate_pick(p, t, z, sel, lane, id, w);
  if (lane < K) {
    p.expert_ids[t * K + lane] = id;
    p.weights[t * K + lane] = w;
  }
  __syncwarp();  // sel is reused by the warp's next token
}

}  // namespace tandem::kernels::cuda
