// The decode MoE's first kernel (moe_decode.h): the decode GEMV on the bf16 gate (the dense
// kernel's device code, kernels/cuda/decode_gemm_body.cuh), whose last CTA to finish (an arrival
// counter, zero between calls) routes every token (the moe_gate op's device routine) and groups
// the (token, expert) pairs by distinct local expert, ascending, with each token's combine order.
#include "kernels/cuda/decode_gemm_body.cuh"
#include "model/cuda/moe_decode_internal.h"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

namespace gemv = kernels::cuda::gemv;
using namespace moe_internal;  // NOLINT: this file's half of the decode MoE

namespace {

// ---------------------------------------------------------------- 1. gate + route
struct RouteArgs {
  kernels::MoeGateParams gate;   // logits, bias / tid2eid, ids, weights
  int expert_begin, expert_count;
  int max_active;
  int32_t* active;               // [1 + max_active + max_active + 1]
  int32_t* pair_token;
  float* pair_weight;
  int32_t* token_pair;
  int32_t* combine_order;
};

// Routing and grouping by the whole CTA (route_smem bytes of shared memory).
__device__ void route_block(const RouteArgs& a, uint8_t* smem_raw) {
  float* smem = reinterpret_cast<float*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nthreads = blockDim.x, nwarps = nthreads >> 5;
  const int E = a.gate.n_experts, K = a.gate.topk, EL = a.expert_count;
  float* sel = smem + warp * E;
  int* cnt = reinterpret_cast<int*>(smem + nwarps * E);
  int* cursor = cnt + EL;
  int* slot_of = cursor + EL;
  for (int i = threadIdx.x; i < EL; i += nthreads) {
    cnt[i] = 0;
    cursor[i] = 0;
  }
  for (int64_t t = warp; t < a.gate.tokens; t += nwarps) kc::moe_gate_token(a.gate, t, sel, lane);
  __syncthreads();  // ids / weights (global, this CTA's writes) and the zeroed counters are visible
  const int64_t P = a.gate.tokens * K;
  for (int64_t p = threadIdx.x; p < P; p += nthreads) {
    const int e = a.gate.expert_ids[p] - a.expert_begin;
    if (e >= 0 && e < EL) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  int32_t* act_expert = a.active + 1;
  int32_t* act_off = a.active + 1 + a.max_active;
  if (warp == 0) {
    // Active experts in ascending id, each with its pairs' offset: 32 experts per ballot.
    int base_slot = 0, base_off = 0;
    for (int c0 = 0; c0 < EL; c0 += 32) {
      const int e = c0 + lane;
      const int c = e < EL ? cnt[e] : 0;
      const uint32_t mask = __ballot_sync(0xffffffffu, c > 0);
      const int rank = __popc(mask & ((1u << lane) - 1u));
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (e < EL) slot_of[e] = c > 0 ? base_slot + rank : -1;
      if (c > 0) {
        act_expert[base_slot + rank] = e;
        act_off[base_slot + rank] = base_off + incl - c;
      }
      base_slot += __popc(mask);
      base_off += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      a.active[0] = base_slot;
      act_off[base_slot] = base_off;
    }
  }
  __syncthreads();
  // Placement. The order of an expert's pairs is whatever the atomics give: no result depends on
  // it (a token's expert output is independent of the other tokens, and the combine walks each
  // token's experts in id order through token_pair).
  // The combine's order: a token's pairs by ascending expert id, ties (a hash table repeating an
  // expert) by slot, as a stable sort: the ranks are a permutation of the token's slots.
  for (int64_t p = threadIdx.x; p < P; p += nthreads) {
    const int id = a.gate.expert_ids[p], e = id - a.expert_begin;
    const int k = static_cast<int>(p % K);
    int pos = -1;
    if (e >= 0 && e < EL) {
      pos = act_off[slot_of[e]] + atomicAdd(&cursor[e], 1);
      a.pair_token[pos] = static_cast<int32_t>(p / K);
      a.pair_weight[pos] = a.gate.weights[p];
    }
    a.token_pair[p] = pos;
    const int64_t t0 = p / K * K;
    int rank = 0;
    for (int q = 0; q < K; ++q) {
      const int iq = a.gate.expert_ids[t0 + q];
      rank += iq < id || (iq == id && q < k);
    }
    a.combine_order[t0 + rank] = pos;
  }
}

struct GateRouteArgs {
  gemv::KernelArgs gemv;  // the gate GEMV (bf16 weight, fp32 activation, fp32 logits)
  RouteArgs route;
  int32_t* ticket;        // arrival counter, zero between calls
};

template <int MT>
__global__ void __launch_bounds__(kThreads, 2) gate_route_kernel(const __grid_constant__ GateRouteArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_last;
  gemv::decode_gemv_body<gemv::Kind::kBf16F32, MT>(a.gemv, smem);
  // Arrival: every thread's logits stores are ordered before the CTA's ticket; the last CTA sees
  // all of them (its reads of other CTAs' logits go to L2: moe_gate_token).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(a.ticket, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  route_block(a.route, smem);
  if (threadIdx.x == 0) *a.ticket = 0;
}

}  // namespace

size_t moe_internal::route_smem(int n_experts, int expert_count) {
  return sizeof(float) * kWarps * n_experts + sizeof(int) * 3 * expert_count;
}

void moe_gate_route(const MoeDecodeArgs& a, cudaStream_t s) {
  const MoeDecodeDims& d = a.dims;
  // The gate GEMV's plan (fp32 logits, as the reference's fp32 GEMM; the activation is bf16-valued).
  kc::DecodeGemmArgs g;
  g.x = a.x;
  g.ldx = d.dim;
  g.m = a.tokens;
  g.k = d.dim;
  g.num_segments = 1;
  g.seg[0].w = a.gate;
  g.seg[0].y = a.buf.gate_logits;
  g.seg[0].ldy = d.n_experts;
  const gemv::Plan p = gemv::plan(g);
  TANDEM_CHECK(p.kind == gemv::Kind::kBf16F32);
  GateRouteArgs ga{};
  ga.gemv = p.ka;
  RouteArgs& ra = ga.route;
  ra.gate.logits = a.buf.gate_logits;
  ra.gate.bias = a.tid2eid ? nullptr : a.bias;
  ra.gate.token_ids = a.tid2eid ? a.token_ids : nullptr;
  ra.gate.tid2eid = a.tid2eid;
  ra.gate.tokens = a.tokens;
  ra.gate.n_experts = d.n_experts;
  ra.gate.topk = d.topk;
  ra.gate.route_scale = a.route_scale;
  ra.gate.expert_ids = a.buf.expert_ids;
  ra.gate.weights = a.buf.weights;
  ra.expert_begin = a.expert_begin;
  ra.expert_count = a.expert_count;
  ra.max_active = static_cast<int>(max_active_of(d, d.max_tokens));
  ra.active = a.buf.active;
  ra.pair_token = a.buf.pair_token;
  ra.pair_weight = a.buf.pair_weight;
  ra.token_pair = a.buf.token_pair;
  ra.combine_order = a.buf.combine_order;
  ga.ticket = a.buf.counters;
  const size_t smem = std::max(p.smem, route_smem(d.n_experts, a.expert_count));
  const dim3 grid(static_cast<unsigned>(p.grid));
  auto go = [&](auto* kern, std::atomic<bool>& attr) {
    allow_smem(reinterpret_cast<const void*>(kern), attr);
    launch(kern, grid, smem, a.pdl, s, ga);
  };
  static std::atomic<bool> a1{false}, a2{false}, a3{false}, a6{false};
  switch (p.mt) {
    case 1: return go(gate_route_kernel<1>, a1);
    case 2: return go(gate_route_kernel<2>, a2);
    case 3: return go(gate_route_kernel<3>, a3);
    default: return go(gate_route_kernel<6>, a6);
  }
}

kc::SmemBound gate_route_smem_bound(int n_experts) {
  // The larger of the gate GEMV's ring (sized from the device: the decode GEMV's bound at
  // sm_120/sm_121's limits) and the routing scratch with every expert on this rank.
  int64_t gemv_most = 0;
  for (const auto& b : kc::decode_gemm_smem_bounds()) gemv_most = std::max(gemv_most, b.bytes);
  const int64_t route = static_cast<int64_t>(route_smem(n_experts, n_experts));
  return {"gate_route_kernel", std::max(gemv_most, route),
          "gate GEMV ring " + std::to_string(gemv_most) + " B or routing scratch for " + std::to_string(n_experts) +
              " experts " + std::to_string(route) + " B",
          ""};
}

}  // namespace tandem::cuda_model
