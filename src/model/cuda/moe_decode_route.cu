// The decode MoE's first kernel (moe_decode.h): the bf16 gate's GEMV spread over the whole GPU,
// whose last CTA to finish (an arrival counter, zero between calls) adds the partial sums, routes
// every token (the moe_gate op's device routines, moe_gate.cuh) and groups the (token, expert)
// pairs by distinct local expert, ascending, with each token's combine order.
//
// GEMV. The gate is small (256 x 4096 bf16, 2 MB) and every step waits for it, so it is cut into
// 2 KB warp tasks of 8 rows x 128 k (gate_split: 128 CTAs of 8 warps for the full gate, one per
// SM): each lane loads its four 16-byte pieces straight into registers before the grid-dependency
// wait (all 2 MB in flight at once, overlapping the previous kernel), then runs 8 bf16 mmas per
// 16 tokens (the tokens are the mma's rows, the gate rows its n8 columns; a lane's k-slots are the
// decode GEMV's, decode_gemm_body.cuh). A CTA's warps that share a row tile add their units in
// unit order in shared memory; the CTA stores that partial sum per k block, and the routing CTA
// adds the k blocks in order: one fixed order whatever the token count, so a token's logits never
// depend on the other tokens of the call.
//
// Tail (the last CTA only, no other global round trip than reading the partials): 8 tokens at a
// time, all threads add the partials and compute every expert's selection value into shared
// memory, then each warp picks one token's experts (from registers up to 256 experts:
// moe_gate_choose_sorted); the grouping reads the ids from shared memory (global memory past
// kRoutePairs pairs) and keeps the offsets there. Up to 8 tokens a leaner tail gives the same
// results (route_tail_lean).
#include "kernels/cuda/decode_mma.cuh"
#include "model/cuda/moe_decode_internal.h"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

namespace mma = kernels::cuda::mma;
namespace timeline = kernels::cuda::timeline;
using namespace moe_internal;  // NOLINT: this file's half of the decode MoE

namespace {

struct GateRouteArgs {
  const uint8_t* w;           // [n_experts, dim] bf16 gate
  const float* x;             // [tokens, dim] fp32 holding bf16 values
  int64_t dim, tokens;
  int upc, tpc, kb;           // gate_split
  float* partial;             // [kb, tokens, n_experts] per-k-block sums
  int32_t* ticket;            // arrival counter, zero between calls
  int32_t* sdone;             // the experts kernels' shared-rows counter (moe_decode.cu), zeroed here
  float* logits;              // [tokens, n_experts] out (the routing reads its shared copy)
  kernels::MoeGateParams gate;  // bias / tid2eid, ids and weights (out); logits unused
  int expert_begin, expert_count;
  int max_active;
  int32_t* active;            // [1 + max_active + max_active + 1]
  int32_t* pair_token;        // [tokens * topk]
  float* pair_weight;         // [tokens * topk]
  int32_t* token_pair;        // [tokens, topk]
  int32_t* combine_order;     // [tokens, topk]
  // Instrument: timeline records (timeline.cuh), null: none. Thread 0's marks: 1 entry, 3 past the
  // dependency wait, 4 partials stored, 5 / 6 the routing
  // CTA's tail start / end (inside it: 10 its scratch zeroed, 11 / 12 the first round's selection values computed / shared, 13 thread 0's
  // token picked, 7 every token picked, 8 experts counted, 9 grouped), 15 exit; count: 1 for the
  // routing CTA.
  uint64_t* tl;
  int general;                // MoeDecodeArgs::general_route: the general tail at every token count
};

// 16 bytes of weight, read-only and not kept in L1; volatile, so it stays before pdl_wait().
__device__ __forceinline__ uint4 ld_weight16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t word4(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// The routing CTA's shared memory (route_smem bytes), carved the same way on both sides.
struct TailSmem {
  float* z;        // [kWarps, E] logits of the round's tokens
  float* sel;      // [kWarps, E] their selection values
  int* cnt;        // [EL]
  int* cursor;     // [EL]
  int* slot_of;    // [EL]
  int* off;        // [EL + 1] pair offset of each active slot
  int* excl;       // [EL] pairs of the lower experts of the expert's 32-expert chunk
  int* chunk;      // [2, 32] active experts and pairs of each 32-expert chunk (EL <= 1024)
  int32_t* ids;    // [kRoutePairs]
  float* wts;      // [kRoutePairs]
};
__host__ __device__ inline size_t tail_bytes(int E, int EL, TailSmem* t, uint8_t* base) {
  size_t o = 0;
  auto take = [&](size_t bytes) {
    uint8_t* at = base ? base + o : nullptr;
    o += (bytes + 15) / 16 * 16;
    return at;
  };
  uint8_t* z = take(sizeof(float) * kWarps * E);
  uint8_t* sel = take(sizeof(float) * kWarps * E);
  uint8_t* cnt = take(sizeof(int) * EL);
  uint8_t* cursor = take(sizeof(int) * EL);
  uint8_t* slot_of = take(sizeof(int) * EL);
  uint8_t* off = take(sizeof(int) * (EL + 1));
  uint8_t* excl = take(sizeof(int) * EL);
  uint8_t* chunk = take(sizeof(int) * 2 * 32);
  uint8_t* ids = take(sizeof(int32_t) * kRoutePairs);
  uint8_t* wts = take(sizeof(float) * kRoutePairs);
  if (t) {
    t->z = reinterpret_cast<float*>(z);
    t->sel = reinterpret_cast<float*>(sel);
    t->cnt = reinterpret_cast<int*>(cnt);
    t->cursor = reinterpret_cast<int*>(cursor);
    t->slot_of = reinterpret_cast<int*>(slot_of);
    t->off = reinterpret_cast<int*>(off);
    t->excl = reinterpret_cast<int*>(excl);
    t->chunk = reinterpret_cast<int*>(chunk);
    t->ids = reinterpret_cast<int32_t*>(ids);
    t->wts = reinterpret_cast<float*>(wts);
  }
  return o;
}
// The GEMV's per-warp partial tiles: two buffers (alternate m tiles) of 8 warps x 16 tokens x 8 rows.
constexpr size_t kRedBytes = sizeof(float) * 2 * kWarps * 16 * kGateRows;

// Routing and grouping by the last CTA (see the file comment).
__device__ void route_tail(const GateRouteArgs& a, uint8_t* smem, uint64_t* tlr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const kernels::MoeGateParams& gp = a.gate;
  const int E = gp.n_experts, K = gp.topk, EL = a.expert_count;
  const int64_t T = a.tokens, P = T * K, TE = T * E;
  TailSmem s;
  tail_bytes(E, EL, &s, smem);
  const bool fit = P <= kRoutePairs;
  const int32_t* ids = fit ? s.ids : gp.expert_ids;  // generic: shared or global, this CTA's writes
  const float* wts = fit ? s.wts : gp.weights;
  for (int i = threadIdx.x; i < EL; i += kThreads) {
    s.cnt[i] = 0;
    s.cursor[i] = 0;
  }
  const bool hash = gp.tid2eid != nullptr;
  for (int64_t t0 = 0; t0 < T; t0 += kWarps) {
    const int n = static_cast<int>(T - t0 < kWarps ? T - t0 : kWarps);
    const int nE = n * E;
    const float* src = a.partial + t0 * E;
    if (t0 == 0) timeline::mark(tlr, 10);
    // Logits: the k blocks' partials added in order (4 outputs a thread at once, every load issued
    // before the first add), then each expert's selection value.
    for (int i0 = threadIdx.x; i0 < nE; i0 += 4 * kThreads) {
      float v[4][kGateMaxKb], bias[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = i0 + q * kThreads;
#pragma unroll
        for (int b = 0; b < kGateMaxKb; ++b) v[q][b] = i < nE && b < a.kb ? __ldcg(src + b * TE + i) : 0.0f;
        bias[q] = i < nE && gp.bias ? gp.bias[i % E] : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = i0 + q * kThreads;
        if (i >= nE) break;
        float z = v[q][0];
#pragma unroll
        for (int b = 1; b < kGateMaxKb; ++b)
          if (b < a.kb) z = kc::add_rn(z, v[q][b]);
        s.z[i] = z;
        a.logits[t0 * E + i] = z;
        if (!hash) s.sel[i] = kc::moe_gate_sel(z, gp.bias != nullptr, bias[q]);
      }
    }
    if (t0 == 0) timeline::mark(tlr, 11);
    __syncthreads();
    if (t0 == 0) timeline::mark(tlr, 12);
    if (warp < n) {
      const int64_t t = t0 + warp;
      int32_t id;
      float w;
      if (!hash && E <= kc::kMoeGateSortedExperts) {
        kc::moe_gate_weights(gp, s.z + warp * E, kc::moe_gate_choose_sorted(E, K, s.sel + warp * E, lane), lane, id, w);
      } else {
        kc::moe_gate_pick(gp, t, s.z + warp * E, s.sel + warp * E, lane, id, w);
      }
      if (t0 == 0) timeline::mark(tlr, 13);
      if (lane < K) {
        gp.expert_ids[t * K + lane] = id;
        gp.weights[t * K + lane] = w;
        if (fit) {
          s.ids[t * K + lane] = id;
          s.wts[t * K + lane] = w;
        }
      }
    }
    __syncthreads();  // ids / weights visible; z and sel are rewritten by the next round
  }
  timeline::mark(tlr, 7);
  for (int64_t p = threadIdx.x; p < P; p += kThreads) {
    const int e = ids[p] - a.expert_begin;
    if (e >= 0 && e < EL) atomicAdd(&s.cnt[e], 1);
  }
  __syncthreads();
  timeline::mark(tlr, 8);
  int32_t* act_expert = a.active + 1;
  int32_t* act_off = a.active + 1 + a.max_active;
  // Active experts in ascending id, each with its pairs' offset: a warp per 32-expert chunk ranks
  // its experts (ballot) and scans their counts, then adds the lower chunks' totals.
  const int chunks = (EL + 31) / 32;
  for (int c = warp; c < chunks; c += kWarps) {
    const int e = c * 32 + lane;
    const int n = e < EL ? s.cnt[e] : 0;
    const uint32_t mask = __ballot_sync(0xffffffffu, n > 0);
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (e < EL) {
      s.slot_of[e] = n > 0 ? __popc(mask & ((1u << lane) - 1u)) : -1;  // rank within the chunk
      s.excl[e] = incl - n;
    }
    if (lane == 31) {
      s.chunk[c] = __popc(mask);
      s.chunk[32 + c] = incl;
    }
  }
  __syncthreads();
  for (int c = warp; c < chunks; c += kWarps) {
    const int base_slot = __reduce_add_sync(0xffffffffu, lane < c ? s.chunk[lane] : 0);
    const int base_off = __reduce_add_sync(0xffffffffu, lane < c ? s.chunk[32 + lane] : 0);
    const int e = c * 32 + lane;
    if (e < EL && s.slot_of[e] >= 0) {
      const int slot = base_slot + s.slot_of[e], off = base_off + s.excl[e];
      act_expert[slot] = e;
      act_off[slot] = off;
      s.off[slot] = off;
      s.slot_of[e] = slot;
    }
    if (c == chunks - 1 && lane == 0) {
      const int total = base_slot + s.chunk[c];
      a.active[0] = total;
      act_off[total] = base_off + s.chunk[32 + c];
    }
  }
  __syncthreads();
  timeline::mark(tlr, 9);
  // Placement. The order of an expert's pairs is whatever the atomics give: no result depends on
  // it (a token's expert output is independent of the other tokens, and the combine walks each
  // token's experts in id order through token_pair).
  // The combine's order: a token's pairs by ascending expert id, ties (a hash table repeating an
  // expert) by slot, as a stable sort: the ranks are a permutation of the token's slots.
  for (int64_t p = threadIdx.x; p < P; p += kThreads) {
    const int id = ids[p], e = id - a.expert_begin;
    const int k = static_cast<int>(p % K);
    int pos = -1;
    if (e >= 0 && e < EL) {
      pos = s.off[s.slot_of[e]] + atomicAdd(&s.cursor[e], 1);
      a.pair_token[pos] = static_cast<int32_t>(p / K);
      a.pair_weight[pos] = wts[p];
    }
    a.token_pair[p] = pos;
    const int64_t t0 = p / K * K;
    int rank = 0;
    for (int q = 0; q < K; ++q) {
      const int iq = ids[t0 + q];
      rank += iq < id || (iq == id && q < k);
    }
    a.combine_order[t0 + rank] = pos;
  }
}

// The routing of a small call (lean_route: at most kWarps tokens and kLeanPairs pairs: the decode
// steps up to batch 8, the verify of 6 at batch 1) with the general tail's results in fewer
// instructions and shorter serial chains. Every routed expert item waits for this one CTA; the
// general tail took 15-19 us for one token, about 1,040 instructions a warp (1,382 distinct, nearly
// all run once), and Nsight Compute's samples put half its warps at a barrier (waiting for the one
// that works) and a fifth in fixed-latency waits. Here:
//  - the logits as the general tail adds them, then each thread's scores and selection values in a
//    loop (one copy of the score's code, not four, and not again for the weights: the scores are
//    kept);
//  - each token's warp picks from registers (moe_gate_choose_sorted, up to 256 experts; more, or a
//    hash layer: moe_gate_pick) instead of topk scans of shared memory;
//  - warp 0 alone groups the pairs: shared-memory counts per expert (an atomic gives a pair its
//    place under its expert), one pass of warp scans over the experts for the slots and offsets.
// Every output is the general tail's but the order of an expert's pairs (the atomics' in both; no
// result depends on it: moe_decode.h).
constexpr int kLeanPairs = 4 * kc::kWarp;  // pairs of a lean call (4 a lane of warp 0)
__host__ __device__ inline bool lean_route(int64_t tokens, int topk) { return tokens <= kWarps && tokens * topk <= kLeanPairs; }

__device__ void route_tail_lean(const GateRouteArgs& a, uint8_t* smem, uint64_t* tlr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const kernels::MoeGateParams& gp = a.gate;
  const int E = gp.n_experts, K = gp.topk, EL = a.expert_count;
  const int T = static_cast<int>(a.tokens), P = T * K, TE = T * E;
  TailSmem s;
  tail_bytes(E, EL, &s, smem);
  const bool hash = gp.tid2eid != nullptr;
  timeline::mark(tlr, 10);
  // Logits: 4 a thread at a time, the k blocks' partials added in order, every load of the four
  // issued first (one round at up to 4 tokens of 256 experts).
#pragma unroll 1
  for (int i0 = threadIdx.x; i0 < TE; i0 += 4 * kThreads) {
    float v[4][kGateMaxKb];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + q * kThreads;
#pragma unroll
      for (int b = 0; b < kGateMaxKb; ++b) v[q][b] = i < TE && b < a.kb ? __ldcg(a.partial + b * TE + i) : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int i = i0 + q * kThreads;
      float z = v[q][0];
#pragma unroll
      for (int b = 1; b < kGateMaxKb; ++b)
        if (b < a.kb) z = kc::add_rn(z, v[q][b]);
      if (i < TE) {
        s.z[i] = z;
        a.logits[i] = z;
      }
    }
  }
  // Selection values of this thread's logits (its own writes above); the scores replace the logits
  // in s.z for the weights (moe_gate_sel's arithmetic, one copy of the score's code).
  if (!hash) {
#pragma unroll 1
    for (int i = threadIdx.x; i < TE; i += kThreads) {
      const float sc = kc::moe_gate_score(s.z[i]);
      s.sel[i] = gp.bias ? kc::add_rn(sc, gp.bias[i % E]) : sc;
      s.z[i] = sc;
    }
  }
  timeline::mark(tlr, 11);
  __syncthreads();
  timeline::mark(tlr, 12);
  if (warp < T) {  // token `warp`
    const float* z = s.z + warp * E;
    int32_t id;
    float w;
    if (hash) {
      kc::moe_gate_pick(gp, warp, z, s.sel + warp * E, lane, id, w);
    } else {
      const float* sel = s.sel + warp * E;
      const int32_t chosen = E <= kc::kMoeGateSortedExperts ? kc::moe_gate_choose_sorted(E, K, sel, lane)
                                                             : kc::moe_gate_choose(E, K, sel, lane);
      kc::moe_gate_weights<true>(gp, z, chosen, lane, id, w);  // z holds the scores
    }
    timeline::mark(tlr, 13);
    if (lane < K) {
      gp.expert_ids[warp * K + lane] = id;
      gp.weights[warp * K + lane] = w;
      s.ids[warp * K + lane] = id;
      s.wts[warp * K + lane] = w;
    }
  }
  __syncthreads();
  timeline::mark(tlr, 7);
  if (warp != 0) return;
  // Grouping by warp 0. Lane l holds pairs l + 32 r: their local experts (-1: another rank's) and
  // places under them (counted in shared memory).
  for (int e = lane; e < EL; e += kc::kWarp) s.cnt[e] = 0;
  __syncwarp();
  int le[kLeanPairs / kc::kWarp], place[kLeanPairs / kc::kWarp];
#pragma unroll
  for (int r = 0; r < kLeanPairs / kc::kWarp; ++r) {
    const int p = lane + r * kc::kWarp;
    const int e = p < P ? s.ids[p] - a.expert_begin : -1;
    le[r] = e >= 0 && e < EL ? e : -1;
    place[r] = le[r] >= 0 ? atomicAdd(&s.cnt[le[r]], 1) : 0;
  }
  __syncwarp();
  timeline::mark(tlr, 8);
  // Lane l's experts are [l c, l c + c): their pairs and active experts, scanned over the lanes,
  // give each active expert its slot (ascending id) and its pairs' offset.
  const int c = (EL + kc::kWarp - 1) / kc::kWarp;
  int n = 0, d = 0;
#pragma unroll 1
  for (int j = 0; j < c; ++j) {
    const int e = lane * c + j;
    const int v = e < EL ? s.cnt[e] : 0;
    n += v;
    d += v > 0;
  }
  int ni = n, di = d;
#pragma unroll
  for (int o = 1; o < kc::kWarp; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, ni, o), y = __shfl_up_sync(0xffffffffu, di, o);
    if (lane >= o) {
      ni += x;
      di += y;
    }
  }
  const int local = __shfl_sync(0xffffffffu, ni, kc::kWarp - 1), distinct = __shfl_sync(0xffffffffu, di, kc::kWarp - 1);
  int32_t* act_expert = a.active + 1;
  int32_t* act_off = a.active + 1 + a.max_active;
  int off = ni - n, slot = di - d;
#pragma unroll 1
  for (int j = 0; j < c; ++j) {
    const int e = lane * c + j;
    const int v = e < EL ? s.cnt[e] : 0;
    if (v > 0) {
      act_expert[slot] = e;
      act_off[slot] = off;
      s.off[e] = off;
      ++slot;
    }
    off += v;
  }
  if (lane == 0) {
    a.active[0] = distinct;
    act_off[distinct] = local;
  }
  __syncwarp();
  timeline::mark(tlr, 9);
  // Placement and each token's combine order (its pairs by ascending expert id, ties by slot).
#pragma unroll
  for (int r = 0; r < kLeanPairs / kc::kWarp; ++r) {
    const int p = lane + r * kc::kWarp;
    if (p >= P) break;
    const int id = s.ids[p], k = p % K;
    int pos = -1;
    if (le[r] >= 0) {
      pos = s.off[le[r]] + place[r];
      a.pair_token[pos] = p / K;
      a.pair_weight[pos] = s.wts[p];
    }
    a.token_pair[p] = pos;
    const int t0 = p / K * K;
    int rank = 0;
#pragma unroll 1
    for (int q = 0; q < K; ++q) {
      const int iq = s.ids[t0 + q];
      rank += iq < id || (iq == id && q < k);
    }
    a.combine_order[t0 + rank] = pos;
  }
}

__global__ void __launch_bounds__(kThreads, 2) gate_route_kernel(const __grid_constant__ GateRouteArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  uint64_t* const tlr = threadIdx.x == 0 ? timeline::record(a.tl) : nullptr;
  timeline::mark(tlr, 1);
  const int E = a.gate.n_experts;
  const int64_t D = a.dim, T = a.tokens;
  const int rg = static_cast<int>(blockIdx.x) / a.kb, kb = static_cast<int>(blockIdx.x) % a.kb;
  const int tl = warp / a.upc, u = warp % a.upc;
  const int row0 = (rg * a.tpc + tl) * kGateRows;
  const bool live = row0 < E;  // a warp past the last row tile only meets the barriers
  const int64_t k0 = static_cast<int64_t>(kb * a.upc + u) * kGateUnitK;

  // Row row0 + g, k [k0 + 32 p + 8 t, + 8) for p = 0..3: 16 bytes each (rows past E repeat the last).
  uint4 wv[4] = {};
  if (live) {
    const uint8_t* src = a.w + static_cast<int64_t>(min(row0 + g, E - 1)) * D * 2 + k0 * 2 + t * 16;
#pragma unroll
    for (int p = 0; p < 4; ++p) wv[p] = ld_weight16(src + p * 64);
  }
  // The trigger comes after the wait: moe_decode's experts-up kernel, the dependent launch, reads
  // x's codes (written before this kernel) before its own wait (its early shared expert), so every
  // kernel before this one must be complete when it starts.
  kc::pdl_wait();
  timeline::mark(tlr, 3);
  // The experts' shared-rows counter starts this call at zero before the dependent up kernel can
  // start (it adds to it; the previous call's down kernel, its reader, is complete: the chain of
  // waits before this one). The exchange is performed and fenced before CTA 0 triggers.
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) {
      atomicExch(a.sdone, 0);
      __threadfence();
    }
    __syncthreads();
  }
  kc::pdl_trigger();

  float* red = reinterpret_cast<float*>(smem);
  int buf = 0;
  for (int64_t m0 = 0; m0 < T; m0 += 16, buf ^= 1) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const float* x0 = a.x + min(m0 + g, T - 1) * D + k0 + t * 8;
      const float* x1 = a.x + min(m0 + g + 8, T - 1) * D + k0 + t * 8;
#pragma unroll
      for (int p = 0; p < 4; ++p)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float4 v0 = mma::ld_act_f4(x0 + p * 32 + 4 * j);
          const float4 v1 = mma::ld_act_f4(x1 + p * 32 + 4 * j);
          const uint32_t af[4] = {mma::f32x2_to_bf16x2(v0.x, v0.y), mma::f32x2_to_bf16x2(v1.x, v1.y),
                                  mma::f32x2_to_bf16x2(v0.z, v0.w), mma::f32x2_to_bf16x2(v1.z, v1.w)};
          mma::mma_bf16(acc, af, word4(wv[p], 2 * j), word4(wv[p], 2 * j + 1));
        }
    }
    // acc: tokens m0 + g (0, 1) and m0 + g + 8 (2, 3), gate rows row0 + 2t (0, 2) and + 1 (1, 3).
    float* rw = red + (buf * kWarps + warp) * 16 * kGateRows;
    *reinterpret_cast<float2*>(rw + g * kGateRows + 2 * t) = make_float2(acc[0], acc[1]);
    *reinterpret_cast<float2*>(rw + (g + 8) * kGateRows + 2 * t) = make_float2(acc[2], acc[3]);
    // One barrier per m tile: the other buffer's readers (the previous tile) are past it too.
    __syncthreads();
    for (int i = threadIdx.x; i < a.tpc * 16 * kGateRows; i += kThreads) {
      const int tt = i / (16 * kGateRows), tok = (i / kGateRows) % 16, col = i % kGateRows;
      const int e = (rg * a.tpc + tt) * kGateRows + col;
      const int64_t token = m0 + tok;
      if (e >= E || token >= T) continue;
      const float* src = red + (buf * kWarps + tt * a.upc) * 16 * kGateRows + tok * kGateRows + col;
      float v = src[0];
      for (int uu = 1; uu < a.upc; ++uu) v = kc::add_rn(v, src[uu * 16 * kGateRows]);
      a.partial[(kb * T + token) * E + e] = v;
    }
  }
  // Arrival: every thread's partial stores are ordered before the CTA's ticket; the last CTA sees
  // all of them (it reads the other CTAs' partials from L2).
  __threadfence();
  __syncthreads();
  timeline::mark(tlr, 4);
  if (threadIdx.x == 0) s_last = atomicAdd(a.ticket, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!s_last) {
    timeline::mark(tlr, 15);
    timeline::finish(tlr, 0);
    return;
  }
  __threadfence();
  timeline::mark(tlr, 5);
  // The red buffers' last readers are past the barriers above.
  if (!a.general && lean_route(a.tokens, a.gate.topk)) {
    route_tail_lean(a, smem, tlr);
  } else {
    route_tail(a, smem, tlr);
  }
  if (threadIdx.x == 0) *a.ticket = 0;
  timeline::mark(tlr, 6);
  timeline::mark(tlr, 15);
  timeline::finish(tlr, 1);
}

}  // namespace

size_t moe_internal::route_smem(int n_experts, int expert_count) {
  return std::max(kRedBytes, tail_bytes(n_experts, expert_count, nullptr, nullptr));
}

void moe_gate_route(const MoeDecodeArgs& a, cudaStream_t s) {
  const MoeDecodeDims& d = a.dims;
  const GateSplit sp = gate_split(d.dim, d.n_experts);
  TANDEM_CHECK(sp.kb <= kGateMaxKb && a.gate.n == d.n_experts && a.gate.k == d.dim);
  GateRouteArgs ga{};
  ga.w = static_cast<const uint8_t*>(a.gate.data);
  ga.x = a.x;
  ga.dim = d.dim;
  ga.tokens = a.tokens;
  ga.upc = sp.upc;
  ga.tpc = sp.tpc;
  ga.kb = sp.kb;
  ga.partial = a.buf.gate_partial;
  ga.ticket = a.buf.counters;
  ga.sdone = a.buf.counters + kSdone;
  kernels::MoeGateParams& gp = ga.gate;
  ga.logits = a.buf.gate_logits;
  gp.logits = a.buf.gate_logits;
  gp.bias = a.tid2eid ? nullptr : a.bias;
  gp.token_ids = a.tid2eid ? a.token_ids : nullptr;
  gp.tid2eid = a.tid2eid;
  gp.tokens = a.tokens;
  gp.n_experts = d.n_experts;
  gp.topk = d.topk;
  gp.route_scale = a.route_scale;
  gp.expert_ids = a.buf.expert_ids;
  gp.weights = a.buf.weights;
  ga.expert_begin = a.expert_begin;
  ga.expert_count = a.expert_count;
  ga.max_active = static_cast<int>(max_active_of(d, d.max_tokens));
  ga.active = a.buf.active;
  ga.pair_token = a.buf.pair_token;
  ga.pair_weight = a.buf.pair_weight;
  ga.token_pair = a.buf.token_pair;
  ga.combine_order = a.buf.combine_order;
  ga.tl = a.timeline;
  ga.general = a.general_route;
  const size_t smem = route_smem(d.n_experts, a.expert_count);
  static std::atomic<bool> attr{false};
  allow_smem(reinterpret_cast<const void*>(gate_route_kernel), attr);
  launch(gate_route_kernel, dim3(static_cast<unsigned>(sp.grid())), smem, a.pdl, s, ga);
}

kc::SmemBound gate_route_smem_bound(int n_experts) {
  // The routing scratch with every expert on this rank (the partial tiles are smaller).
  const int64_t b = static_cast<int64_t>(route_smem(n_experts, n_experts));
  return {"gate_route_kernel", b,
          "routing scratch for " + std::to_string(n_experts) + " experts and " + std::to_string(kRoutePairs) +
              " pairs (" + std::to_string(kRedBytes) + " B of GEMV partial tiles)",
          ""};
}

}  // namespace tandem::cuda_model
