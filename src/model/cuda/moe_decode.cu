// The decode-size MoE sub-block (see moe_decode.h) in three kernels (the first in
// moe_decode_route.cu, the experts and the buffers here), launched with programmatic dependent
// launch; the experts kernels are persistent grids of at most two CTAs per SM streaming weights
// through per-warp cp.async rings (the decode GEMV's design, kernels/cuda/decode_gemm_body.cuh):
//  1. gate + route: the bf16 gate's GEMV with k split over the whole grid (weights held in
//     registers, not a ring); the last CTA to finish (an arrival counter) adds the CTAs' partial
//     sums in a fixed order, routes every token and groups the (token, expert) pairs by distinct
//     expert, ascending.
//  2. experts up: items are (job, 32-row chunk, 16-column tile) with job 0 the shared expert (FP8,
//     known before the grid-dependency wait: in moe_decode its items run whole before the wait, over
//     kernel 1's run, which lets this launch start only past its own wait, so that x's codes are
//     complete) and then each active routed expert (MXFP4). A CTA item is a tile's w1 and w3 x their
//     k units, 8 warps;
//     the units meet in shared memory (added in unit order), then SwiGLU, and the last tile of each
//     128-column block to finish (a counter) quantizes the block's rows (act_quant, bit for bit).
//  3. experts down: the same over w2 (items of 8 / units tiles x units; the shared expert's first
//     stages prefetched before the wait, its input being kernel 2's; in moe_decode a CTA's first
//     item, if the shared expert's, runs before the wait, over kernel 2's tail, once a counter says
//     kernel 2 quantized every shared row block); the last item to finish on
//     a 16-column tile (a counter per tile) combines every token on those columns: routed outputs
//     in ascending expert id, plus the shared expert, rounded to bf16.
// The counters are zero between calls (the last arriver resets its own; the shared-rows counter is
// zeroed by kernel 1 at the start of each call), so a captured graph
// replays them as they are.
//
// Routed experts (MXFP4, per-32 E8M0 scales): the weights are the mma's A operand and the expert's
// tokens its n8 columns, so each weight value is dequantized once per 8 tokens (the largest cost
// per byte at decode sizes). Each lane reads a quarter (4 bytes, 8 values) of every 32-value group
// of weight rows g and g + 8 from the ring (16-byte chunks XOR-swizzled: conflict-free; one
// ldmatrix per two groups), so the 16 k-slots of an mma all share one weight scale; e2m1 becomes
// f16 by moving bits alone (value * 2^-14, integer instructions only); two f16 mmas per group go
// into a zeroed block accumulator, added with the scale product (exact power of two, the 2^14
// included) into the fp32 total. A token tile's activation codes are read straight from global
// memory (L1) at 32-bit offsets fixed per item; a single active token tile (the usual routed
// expert at decode sizes) has its own compiled loop. The shared expert (FP8)
// runs the dense decode GEMV's scheme: f16 mma on codes, the accumulator rescaled by an exact power
// of two between 128-k blocks.
#include "model/cuda/moe_decode.h"

#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "model/cuda/moe_decode_internal.h"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

using kernels::WeightFormat;
using kernels::WeightRef;
namespace mma = kernels::cuda::mma;
namespace timeline = kernels::cuda::timeline;
using namespace moe_internal;  // NOLINT: this file's half of the decode MoE

namespace {

__device__ __forceinline__ uint32_t word4(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// MXFP4 scales as fp32 powers of two, with the exact values (and clamps) of mma::exp2i. A weight row's
// E8M0 byte b of `word` -> 2^(e - 127 + 6) (e <= 254; 255, NaN, is flagged separately by has_ff); an
// activation's E8M0 e -> 2^(e - 127 + 8). The 2^14 that the e2m1 -> f16 move takes
// (mma::e2m1x8_to_f16x8) is given back split between them, so that neither leaves fp32's normal range.
__device__ __forceinline__ float mx_row_scale(uint32_t word, int b) {
  uint32_t v = __byte_perm(word, 0u, 0x4044u | (static_cast<uint32_t>(b) << 8));  // e << 16
  v = v < (248u << 16) ? v : (248u << 16);
  return __uint_as_float(v * 128u + (6u << 23));
}
__device__ __forceinline__ float mx_act_scale(uint32_t e) { return __uint_as_float(((e < 246u ? e : 246u) + 8u) << 23); }
// A counter other CTAs (of this or an earlier kernel) release with a fence and an atomic.
__device__ __forceinline__ int ld_acquire(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// The job-chunk of item w: w / ipc in 32 bits (moe_decode_supports bounds every item index), a
// few instructions where the 64-bit division is a long sequence; it runs at every item change
// (Nsight Compute, batch 1: ~3% of the expert kernels' stall samples on the 64-bit divisions).
__device__ __forceinline__ int64_t item_chunk(int64_t w, int64_t ipc) {
  return static_cast<int64_t>(static_cast<uint32_t>(w) / static_cast<uint32_t>(ipc));
}
// True when a byte of w is 0xff (the zero-byte test on ~w).
__device__ __forceinline__ bool has_ff(uint32_t w) { return ((~w - 0x01010101u) & w & 0x80808080u) != 0; }

// Byte offset of 16-byte chunk c (a 32-value group) of row r in an MXFP4 stage with `cpr` chunks
// per row (8 for 256 k, 4 for 128 k). Lanes (g, t) read chunk j of rows nt * 8 + g at t * 4: the
// swizzle spreads the 8 rows g over distinct bank groups.
__device__ __forceinline__ int mx_chunk(int r, int c, int cpr) {
  const int phys = cpr == 8 ? (c ^ (r & 7)) : (c ^ ((r >> 1) & 3));
  return r * cpr * 16 + phys * 16;
}

// ---------------------------------------------------------------- 2, 3. experts
// Named barriers (0 is __syncthreads) of the item-end reduction, each over the whole CTA: kBarFull:
// the partials are in red (the non-lead warps arrive, the leads wait); kBarFree: the leads have
// read them (the leads arrive, the other warps wait before writing the next item's). bar.arrive
// orders the arriving warp's earlier shared-memory accesses before the waiters' later ones.
constexpr int kBarFull = 1, kBarFree = 2;
// Polls of ExpertArgs::sdone (about 0.3 us apart) before the early down item falls back to the
// grid-dependency wait: far above the up kernel's tail (tens of us), never reached in a healthy run.
constexpr int kSdonePolls = 1 << 14;
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(kThreads) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(kThreads) : "memory"); }

struct ExpertArgs {
  const uint8_t* a_codes;     // activation codes [rows, k] (up: x codes by token; down: act codes)
  const uint8_t* a_scales;    // [rows, k / 128]
  int64_t k;                  // columns (up: dim, down: inter)
  int64_t n;                  // output columns per expert matrix (up: inter, down: dim)
  int64_t tokens;
  const int32_t* active;      // route output (count, experts, offsets)
  int max_active;
  const int32_t* pair_token;
  const float* pair_weight;
  WeightRef r0, r1;           // routed MXFP4, local experts concatenated (up: w1, w3; down: w2, -)
  WeightRef s0, s1;           // shared FP8 (up: w1, w3; down: w2, -)
  int has_shared;
  int64_t shared_arow0;       // activation row of the shared job's row 0
  float* out;                 // up: act [., n]; down: pair_out [., n]
  int64_t ldo;
  int64_t shared_orow0;       // up: act row of the shared job's row 0
  float* shared_out;          // down: [tokens, n]
  float limit;
  int units, tpi, ring;       // k units per matrix, tiles per item, ring stages per warp
  int mx_k;                   // k of an MXFP4 stage: 256, or 128 when a unit is not a multiple of 256
  int64_t ipc;                // items per job-chunk (tiles / tpi)
  int64_t chunks_shared;      // 32-row chunks of the shared job (0 without it)
  int64_t chunks_max;         // chunk dimension of the quantization counters
  // up: act_quant of the SwiGLU rows (last tile of each 128-column block)
  uint8_t* act_codes;
  uint8_t* act_scales;
  int32_t* qcnt;              // [(1 + max_active) * chunks_max * (n / 128)]
  // down: combine (last item of each 16-column tile)
  const int32_t* combine_order;  // [tokens, topk] pairs by ascending expert id, -1: another rank's
  int topk;
  float* y;                   // [tokens, n]
  int routed_only;
  int early_shared;           // the shared expert's items before the wait (moe_decode's launches; down: its first)
  int32_t* sdone;             // shared rows' act_quant blocks done (up adds, down polls; the gate zeroes it)
  int32_t* ccnt;              // [n / 16]
  // Instrument: this kernel's timeline records (timeline.cuh), null: none. Thread 0's marks: 1 entry,
  // 2 prologue issued, 3 routing known, 4 + 2i / 5 + 2i item i's first stage ready / its tile-0
  // epilogue done (i < 5), 14 the early down item's poll done, 15 exit; count: items consumed.
  uint64_t* tl;
};

// Where a warp's weight stream is: item w (>= total: done), stage st, the item's job (0 = shared
// when present) and stages per unit. `ok` false: past the end, or (before the grid-dependency
// wait) an item whose job the routing has not decided yet.
// An item's matrix, chunk and this warp's tile (decoded once per item).
struct Ctx {
  bool shared;
  int32_t chunk, tile, off, nrows;  // off: the routed job's first pair; nrows: rows in the chunk
  int32_t expert;                   // the routed job's local expert
  const uint8_t* wsrc;              // this lane's first weight piece of the unit (stage 0): routed, its
                                    // first MXFP4 chunk; shared, row g's 16 bytes at k t * 16
  const uint8_t* ssrc;              // routed: the scales of row lane % 16 of the tile in the unit (stage 0)
};
struct Cur {
  int64_t w;
  int st, job = 0, nst;
  bool ok;
  Ctx x;
};

template <bool UP, int MT>
__global__ void __launch_bounds__(kThreads, 2) expert_kernel(const __grid_constant__ ExpertArgs a) {
  constexpr int NM = UP ? 2 : 1;   // matrices per item (up: w1 and w3)
  constexpr int kPer = MT * 2 * 4; // accumulators per lane
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int s_pre[kMaxJobs + 1];  // job-chunk prefix over the jobs
  __shared__ int s_jobs;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  uint64_t* const tlr = threadIdx.x == 0 ? timeline::record(a.tl) : nullptr;
  timeline::mark(tlr, 1);
  uint32_t tl_items = 0;
  const int S = a.ring, U = a.units;
  const int tl = warp / (NM * U), mm = (warp / U) % NM, unit = warp % U;  // role in an item
  uint8_t* ring = smem + static_cast<size_t>(warp) * S * kSlotBytes;
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(kWarps) * S * kSlotBytes);
  const int64_t ku = a.k / U;
  const int nst_fp8 = static_cast<int>(ku / 128), nst_mx = static_cast<int>(ku / a.mx_k);  // stages per unit
  const int cpr = a.mx_k / 32;  // MXFP4 chunks (groups) per stage row
  // This lane's MXFP4 stage geometry (fixed per launch): it copies chunks i = lane + 32 p (row i / cpr,
  // chunk i % cpr; cpr / 2 of them) to cp_d0 ^ (p odd ? cp_dx : 0) + 512 p, from cp_src0 + p cp_step
  // bytes into the stage's rows; and gives ldmatrix the address of row lane % 16, chunk lane / 16 (+ 2 p
  // for the pair of groups p: lm_b ^ 32 p), both as mx_chunk places them.
  const int cp_d0 = mx_chunk(lane / cpr, lane % cpr, cpr), cp_dx = cpr == 8 ? 64 : 0;
  const int64_t cp_src0 = static_cast<int64_t>(lane / cpr) * (a.k / 2) + (lane % cpr) * 16;
  const int64_t cp_step = static_cast<int64_t>(32 / cpr) * (a.k / 2);
  const int64_t row8 = 8 * a.k;  // FP8: weight rows g and g + 8 of a tile
  const int lm_b = mx_chunk(lane & 15, lane >> 4, cpr);
  int64_t total = 0;
  bool routed_known = false;

  auto context = [&](const Cur& c) {
    Ctx x;
    const int64_t jc = item_chunk(c.w, a.ipc);
    x.shared = a.has_shared && c.job == 0;
    x.chunk = static_cast<int32_t>(jc - (routed_known ? s_pre[c.job] : 0));
    x.tile = static_cast<int32_t>((c.w - jc * a.ipc) * a.tpi + tl);
    x.off = 0;
    x.expert = 0;
    x.wsrc = x.ssrc = nullptr;
    int64_t rows = a.tokens;
    if (x.shared) {
      const WeightRef& w = mm == 0 ? a.s0 : a.s1;
      const int64_t row = static_cast<int64_t>(x.tile) * kRows + g;
      x.wsrc = static_cast<const uint8_t*>(w.data) + row * a.k + unit * ku + t * 16;
    } else {
      const int r = c.job - a.has_shared;
      x.expert = a.active[1 + r];
      x.off = a.active[1 + a.max_active + r];
      rows = a.active[1 + a.max_active + r + 1] - x.off;
      const WeightRef& w = mm == 0 ? a.r0 : a.r1;
      // The tile's first weight row: the expert's rows, then the tile's.
      const int64_t wrow = static_cast<int64_t>(x.expert) * a.n + static_cast<int64_t>(x.tile) * kRows;
      x.wsrc = static_cast<const uint8_t*>(w.data) + wrow * (a.k / 2) + unit * ku / 2 + cp_src0;
      x.ssrc = w.scale + (wrow + (lane & 15)) * (a.k / 32) + unit * ku / 32;
      // (No L1 prefetch of the item's first dependent reads here: on sm_90 a prefetch.global.L1
      // stalls the issuing warp about as long as the load it anticipates. With the token ids (up)
      // and the first row's codes and scales (down) prefetched here, the layer measured 72.5 us
      // at one token against 70.6 without, 293.4 against 285.0 at 8: PERFORMANCE.md.)
    }
    const int64_t left = rows - static_cast<int64_t>(x.chunk) * kChunk;
    x.nrows = static_cast<int32_t>(left < kChunk ? left : kChunk);
    return x;
  };
  auto locate = [&](Cur& c, int64_t w) {
    c.w = w;
    c.st = 0;
    const int64_t jc = item_chunk(w, a.ipc);
    if (!routed_known) {  // before the wait: only the shared expert's items are known (down: the first)
      c.ok = jc < a.chunks_shared && (UP || w < gridDim.x);
      c.job = 0;
      c.nst = nst_fp8;
      if (c.ok) c.x = context(c);
      return;
    }
    c.ok = w < total;
    if (!c.ok) return;
    // The job: the last with s_pre[job] <= jc. A cursor's items only move forward (by the grid), so
    // the scan starts at its previous job (0 before the routing), usually a step or two from it.
    int lo = c.job;
    while (lo + 1 < s_jobs && s_pre[lo + 1] <= jc) ++lo;
    c.job = lo;
    c.nst = a.has_shared && lo == 0 ? nst_fp8 : nst_mx;
    c.x = context(c);
  };
  auto next = [&](Cur& c) {
    if (++c.st == c.nst) locate(c, c.w + gridDim.x);
  };
  auto load = [&](const Cur& c, uint8_t* slot) {
    const Ctx& x = c.x;
    if (x.shared) {
      // Pieces p = (nt, h): rows nt * 8 + g, k st * 128 + h * 64 + t * 16 (16 bytes each).
      const uint8_t* src = x.wsrc + c.st * 128;
      uint8_t* dst = slot + lane * 16;
      mma::cp_async16(dst, src);
      mma::cp_async16(dst + 512, src + 64);
      mma::cp_async16(dst + 1024, src + row8);
      mma::cp_async16(dst + 1536, src + row8 + 64);
    } else {
      const uint8_t* src = x.wsrc + static_cast<int64_t>(c.st) * (a.mx_k / 2);
      // cpr / 2 chunks per lane (4 at 256 k a stage, the real widths; 2 at 128 k).
      mma::cp_async16(slot + cp_d0, src);
      mma::cp_async16(slot + ((cp_d0 ^ cp_dx) + 512), src + cp_step);
      if (cpr == 8) {
        mma::cp_async16(slot + (cp_d0 + 1024), src + 2 * cp_step);
        mma::cp_async16(slot + ((cp_d0 ^ cp_dx) + 1536), src + 3 * cp_step);
      }
      if (lane < kRows) {
        const uint8_t* ssrc = x.ssrc + c.st * cpr;
        if (cpr == 8) mma::cp_async8(slot + kMxDataBytes + lane * 8, ssrc);
        else mma::cp_async4(slot + kMxDataBytes + lane * 8, ssrc);
      }
    }
  };

  // Prologue: the shared expert's first stages before the dependency wait (its weights are known).
  Cur prod, cons;
  locate(prod, blockIdx.x);
  int loaded = 0;
  while (loaded < S && prod.ok) {
    load(prod, ring + loaded * kSlotBytes);
    mma::cp_async_commit();
    next(prod);
    ++loaded;
  }
  kc::pdl_trigger();
  timeline::mark(tlr, 2);
  // Early (a.early_shared: up, launched right after the gate + routing kernel, which triggers this
  // launch only past its own wait): the shared expert's items run before this kernel's wait, over
  // the gate's run. Their inputs (x's codes) come from a kernel before the gate, complete once the
  // gate passed its wait; they are read through L2 only (cg) before the wait.
  // Down (moe_decode's launch after the early up): the CTA's first item, if it is the shared
  // expert's, runs before the wait, over the up kernel's tail (its CTAs start as up's CTAs leave):
  // its input, the shared rows' act_quant, is complete once a.sdone counts every (chunk, 128-column
  // block) of them (the up kernel's quantizers add to it after their stores; the gate zeroed it
  // before this call's up kernel could start). Thread 0 polls it, a bounded number of times: past
  // the bound (never expected) the CTA takes the grid-dependency wait instead, which orders the
  // whole up kernel before it, so the poll is a shortcut, never a condition for progress. The
  // item's combine arrival waits for the routing (the tile's total), after the wait.
  const bool early = a.early_shared != 0;
  auto wait_jobs = [&] {
    kc::pdl_wait();
    // The jobs: the shared expert (if any), then the active routed experts; their 32-row chunks.
    if (warp == 0) {
      const int nact = a.active[0];
      const int J = a.has_shared + nact;
      int base = 0;
      for (int j0 = 0; j0 < J; j0 += 32) {
        const int j = j0 + lane;
        int c = 0;
        if (j < J) {
          int64_t rows = a.tokens;
          if (!(a.has_shared && j == 0)) {
            const int r = j - a.has_shared;
            rows = a.active[1 + a.max_active + r + 1] - a.active[1 + a.max_active + r];
          }
          c = static_cast<int>(chunks_of(rows));
        }
        int incl = c;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += v;
        }
        if (j < J) s_pre[j] = base + incl - c;
        base += __shfl_sync(0xffffffffu, incl, 31);
      }
      if (lane == 0) {
        s_pre[J] = base;
        s_jobs = J;
      }
    }
    __syncthreads();
    timeline::mark(tlr, 3);
    routed_known = true;
    total = static_cast<int64_t>(s_pre[s_jobs]) * a.ipc;
    if (!UP && s_pre[s_jobs] == 0) {
      // No local expert was chosen and there is no shared expert: the routed sum is zero.
      if (blockIdx.x == 0)
        for (int64_t i = threadIdx.x; i < a.tokens * a.n; i += blockDim.x) a.y[i] = 0.0f;
    }
  };
  if (early) {
    // S groups in flight, as the consumer's waits count them (the missing ones empty).
    for (int i = loaded; i < S; ++i) mma::cp_async_commit();
  }

  float acc[MT][2][4];
  int prev_e[MT][2];
  bool nan_scale = false;
  int nan_rows = 0;  // MXFP4: bit r set when weight row g + 8 r met a NaN scale in this unit
  int last_ew = 0;
  bool reduced = false;  // this CTA has done an item's reduction through red (uniform)
  auto reset = [&] {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      prev_e[mt][0] = prev_e[mt][1] = 0;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
    }
    nan_scale = false;
    nan_rows = 0;
  };
  reset();

  // Down: this (job, chunk)'s arrival on a 16-column tile (its outputs stored and fenced); the last
  // of the tile's s_pre[s_jobs] arrivals combines every token on it. Warp-collective.
  auto combine_arrive = [&](int32_t tile) {
    int32_t* cnt = a.ccnt + tile;
    const int64_t row0 = static_cast<int64_t>(tile) * kRows;
    int old = 0;
    if (lane == 0) old = atomicAdd(cnt, 1);
    old = __shfl_sync(0xffffffffu, old, 0);
    if (old != s_pre[s_jobs] - 1) return;
    __threadfence();
    const int K = a.topk;
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 2) {
      const int64_t tt = t0 + (lane >> 4);
      const int64_t col = row0 + (lane & 15);
      if (tt >= a.tokens) continue;
      // The token's routed outputs in ascending expert id (the routing's combine order), loads
      // first, then the adds in order; then the shared expert.
      int32_t pos[kMaxTopk];
      float val[kMaxTopk];
#pragma unroll
      for (int q = 0; q < kMaxTopk; ++q) pos[q] = q < K ? a.combine_order[tt * K + q] : -1;
#pragma unroll
      for (int q = 0; q < kMaxTopk; ++q) val[q] = pos[q] >= 0 ? mma::ld_cg(a.out + pos[q] * a.ldo + col) : 0.0f;
      float sum = 0.0f;
#pragma unroll
      for (int q = 0; q < kMaxTopk; ++q)
        if (pos[q] >= 0) sum = kc::add_rn(sum, val[q]);
      a.y[tt * a.ldo + col] =
          a.routed_only ? sum : kc::round_bf16(kc::add_rn(sum, mma::ld_cg(a.shared_out + tt * a.ldo + col)));
    }
    if (lane == 0) *cnt = 0;
  };
  int mt_act = 0;
  // Activation rows (clamped to the chunk) of the tokens whose codes this lane loads: FP8 shared
  // expert (tokens as the mma's A rows): tokens mt * 16 + hh * 8 + g; MXFP4 routed experts (tokens
  // as B columns, token tile tt = 2 mt + hh): token tt * 8 + g, the same set.
  int32_t arow[MT][2];
  // Byte offsets (below 2^31, moe_decode_supports) fixed per item. MXFP4: this lane's activation
  // codes in the unit (token tile tt's token, k quarter t), and the unit's activation scales of this
  // lane's C columns (tokens tt * 8 + 2t + q). FP8, index mt * 2 + hh: the codes of A row
  // mt * 16 + hh * 8 + g at k t * 16 of the unit, and ([.][0]) that row's first scale of the unit.
  int32_t aoff[2 * MT];
  int32_t asoff[2 * MT][2];
  // FP8, MT 1 and at most 8 rows: the weights become the mma's A operand and the tokens its n8
  // columns (the routed experts' layout, half_stage below) instead of A rows g + 8 with no token.
  bool half = false;
  const uint8_t* wsc = nullptr;
  const int64_t kb0 = unit * ku / 128;   // the unit's first 128-k block
  const int64_t ld_as = a.k / 128;
  locate(cons, blockIdx.x);
  if (!early) cons.ok = false;  // nothing consumed before the wait
  if (!UP && cons.ok) {
    // Down, early: the shared rows' codes and scales complete (see `early` above).
    __shared__ int s_ready;
    if (threadIdx.x == 0) {
      const int want = static_cast<int>(a.chunks_shared * (a.k / 128));
      int ready = 0;
      for (int i = 0; i < kSdonePolls && !ready; ++i) {
        ready = ld_acquire(a.sdone) >= want;
        if (!ready) __nanosleep(200);
      }
      s_ready = ready;
    }
    __syncthreads();
    timeline::mark(tlr, 14);
    if (!s_ready) kc::pdl_wait();  // the bound passed: the whole up kernel instead
  }
  int slot_i = 0;
  bool owe_free = false;  // early: a lead's kBarFree arrival decided once the routing is known
  int32_t pending_tile = -1;  // down, early: a lead's combine arrival for this tile, after the wait
  for (;;) {
    if (!cons.ok) {
      if (routed_known) break;
      // The wait, once: at the start, or (early) when this CTA's shared items are done (the
      // producer stopped at the same routed item, every stage it loaded consumed: the ring starts
      // over at slot 0). Otherwise the producer goes on from the stages it loaded before the wait.
      wait_jobs();
      locate(cons, cons.w);
      if (owe_free && cons.ok) bar_arrive(kBarFree);
      owe_free = false;
      if (!prod.ok) locate(prod, prod.w);  // stopped at a routed item (st 0) before the wait
      if (early) loaded = slot_i = 0;
      for (; loaded < S; ++loaded) {
        if (prod.ok) {
          load(prod, ring + loaded * kSlotBytes);
          next(prod);
        }
        mma::cp_async_commit();
      }
      if (pending_tile >= 0) {  // warp-uniform: a lead of the early item
        combine_arrive(pending_tile);
        pending_tile = -1;
      }
      continue;
    }
    const Ctx& x = cons.x;  // the consumed item's context (next(cons), its only writer, ends the iteration)
    if (cons.st == 0) {
      mt_act = static_cast<int>(x.shared ? (x.nrows + 15) / 16 : (x.nrows + 7) / 8);  // m16 / n8 token tiles
      auto act_row = [&](int64_t j0) {
        const int64_t j = j0 < x.nrows ? j0 : x.nrows - 1;
        const int64_t jr = static_cast<int64_t>(x.chunk) * kChunk + j;
        if (x.shared) return static_cast<int32_t>(UP ? jr : a.shared_arow0 + jr);
        return static_cast<int32_t>(UP ? a.pair_token[x.off + jr] : x.off + jr);
      };
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) arow[mt][hh] = act_row(mt * 16 + g + hh * 8);
      if (!x.shared) {
        half = false;
#pragma unroll
        for (int tt = 0; tt < 2 * MT; ++tt) {
          aoff[tt] = static_cast<int32_t>(static_cast<int64_t>(arow[tt >> 1][tt & 1]) * a.k + unit * ku + t * 8);
#pragma unroll
          for (int q = 0; q < 2; ++q)
            asoff[tt][q] = static_cast<int32_t>(static_cast<int64_t>(act_row(tt * 8 + 2 * t + q)) * ld_as + kb0);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 2 * MT; ++i) {
          aoff[i] = static_cast<int32_t>(static_cast<int64_t>(arow[i >> 1][i & 1]) * a.k + unit * ku + t * 16);
          asoff[i][0] = static_cast<int32_t>(static_cast<int64_t>(arow[i >> 1][i & 1]) * ld_as + kb0);
          asoff[i][1] = 0;
        }
        half = MT == 1 && x.nrows <= 8;
        if (half) {
#pragma unroll
          for (int q = 0; q < 2; ++q)
            asoff[0][q] = static_cast<int32_t>(static_cast<int64_t>(act_row(2 * t + q)) * ld_as + kb0);  // C columns 2t + q
        }
      }
      if (x.shared) {
        const WeightRef& w = mm == 0 ? a.s0 : a.s1;
        const int64_t sld = w.scale_ld > 0 ? w.scale_ld : (a.k + 127) / 128;
        wsc = w.scale + (static_cast<int64_t>(x.tile) * kRows / 128) * sld + kb0;
      }
    }
    mma::cp_async_wait_ring<kMaxRing>(S);  // the oldest of the S stages in flight
    __syncwarp();  // MXFP4 pieces were copied by other lanes of the warp
    const uint8_t* slot = ring + slot_i * kSlotBytes;
    const int st = cons.st;
    if (st == 0 && tl_items < 5) timeline::mark(tlr, 4 + 2 * static_cast<int>(tl_items));
    if (x.shared) {
      // ---- FP8 shared expert: as the dense decode GEMV on act_quant codes ----
      const int ew = wsc[st];
      nan_scale |= ew == 255;
      last_ew = ew;
      // CG: before the wait (early), the activations through L2 only.
      auto stage = [&]<bool CG>() {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (mt >= mt_act) break;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const uint8_t* sp = a.a_scales + (asoff[mt * 2 + hh][0] + st);
            const int e = ew + (CG ? __ldcg(sp) : *sp);
            if (st > 0) {
              const float r = mma::exp2i(prev_e[mt][hh] - e);
#pragma unroll
              for (int nt = 0; nt < 2; ++nt) {
                acc[mt][nt][2 * hh] *= r;
                acc[mt][nt][2 * hh + 1] *= r;
              }
            }
            prev_e[mt][hh] = e;
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 b[2];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) b[nt] = mma::lds128(slot + (nt * 2 + h) * 512 + lane * 16);
          const int kl = st * 128 + h * 64;
          uint4 c[MT][2];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (mt >= mt_act) break;
            auto ld = [&](const uint8_t* p) {
              return CG ? __ldcg(reinterpret_cast<const uint4*>(p)) : mma::ld_act16(p);
            };
            c[mt][0] = ld(a.a_codes + (aoff[mt * 2] + kl));
            c[mt][1] = ld(a.a_codes + (aoff[mt * 2 + 1] + kl));
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint32_t bf[2][2];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              const uint32_t w4 = word4(b[nt], j);
              bf[nt][0] = mma::e4m3x2_to_f16x2(w4);
              bf[nt][1] = mma::e4m3x2_hi_to_f16x2(w4);
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              if (mt >= mt_act) break;
              const uint32_t w0 = word4(c[mt][0], j), w1 = word4(c[mt][1], j);
              const uint32_t af[4] = {mma::e4m3x2_to_f16x2(w0), mma::e4m3x2_to_f16x2(w1), mma::e4m3x2_hi_to_f16x2(w0),
                                      mma::e4m3x2_hi_to_f16x2(w1)};
#pragma unroll
              for (int nt = 0; nt < 2; ++nt) mma::mma_f16(acc[mt][nt], af, bf[nt][0], bf[nt][1]);
            }
          }
        }
      };
      // At most 8 tokens: the tile's 16 weight rows are A (rows g, g + 8: the lane's two pieces at
      // the same k-slots), token g's codes B column g, so one mma per 16 k covers the tile (two in
      // stage<>, whose A rows g + 8 would hold no token). C: acc[0][0] = (rows g, g + 8) x tokens
      // (2t, 2t + 1), as a routed expert's; every output sees the same products, rescales and sums.
      auto half_stage = [&]<bool CG>() {
        float(&cc)[4] = acc[0][0];
#pragma unroll
        for (int q = 0; q < 2; ++q) {  // C columns 2t + q
          const uint8_t* sp = a.a_scales + (asoff[0][q] + st);
          const int e = ew + (CG ? __ldcg(sp) : *sp);
          if (st > 0) {
            const float r = mma::exp2i(prev_e[0][q] - e);
            cc[q] *= r;
            cc[2 + q] *= r;
          }
          prev_e[0][q] = e;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 b[2];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) b[nt] = mma::lds128(slot + (nt * 2 + h) * 512 + lane * 16);
          const uint8_t* cp = a.a_codes + (aoff[0] + st * 128 + h * 64);
          const uint4 c = CG ? __ldcg(reinterpret_cast<const uint4*>(cp)) : mma::ld_act16(cp);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t w0 = word4(b[0], j), w1 = word4(b[1], j), xw = word4(c, j);
            const uint32_t af[4] = {mma::e4m3x2_to_f16x2(w0), mma::e4m3x2_to_f16x2(w1), mma::e4m3x2_hi_to_f16x2(w0),
                                    mma::e4m3x2_hi_to_f16x2(w1)};
            mma::mma_f16(cc, af, mma::e4m3x2_to_f16x2(xw), mma::e4m3x2_hi_to_f16x2(xw));
          }
        }
      };
      if (half) {
        if (!routed_known) half_stage.template operator()<true>();
        else half_stage.template operator()<false>();
      } else if (!routed_known) {
        stage.template operator()<true>();
      } else {
        stage.template operator()<false>();
      }
    } else {
      // ---- MXFP4 routed expert: groups of 32 k, one weight scale per mma ----
      // Weights are the mma's A operand (rows g and g + 8 of the tile), the expert's tokens its n8
      // columns (token tile tt: tokens tt * 8 ..): the weight's dequantization, the largest cost
      // per byte, is done once per 16 x 8 outputs. A lane's k-slots 2t, 2t + 1, 2t + 8, 2t + 9 of
      // the group's first (second) k16 step are its 8 values 8t .. 8t + 3 (8t + 4 .. 8t + 7), for
      // the weight and the activation alike. One ldmatrix reads a lane's quarter of two groups of
      // both rows; the codes become f16 by bit moves (value * 2^-14; mx_row_scale / mx_act_scale
      // give the 2^14 back), so each group costs two mmas into a zeroed block accumulator and one
      // fma per accumulator with the scale product.
      const uint2 sr0 = mma::lds64(slot + kMxDataBytes + g * 8);        // E8M0 of row g's groups
      const uint2 sr1 = mma::lds64(slot + kMxDataBytes + (g + 8) * 8);  // row g + 8 (.y: cpr 8 only)
      // A NaN scale makes its row NaN in every column (as the fma of every later group would).
      const uint32_t ym = cpr == 8 ? 0xffffffffu : 0u;
      nan_rows |= static_cast<int>(has_ff(sr0.x) | has_ff(sr0.y & ym)) | (static_cast<int>(has_ff(sr1.x) | has_ff(sr1.y & ym)) << 1);
      const uint32_t slot_s = mma::smem_u32(slot);
      // The stage for NT token tiles (those below mt_act): the single-tile case, a routed expert's
      // usual one at decode sizes, is compiled apart so that it issues nothing for absent tiles.
      // ONE (a single token in the chunk, every routed expert's case at batch 1): the C columns 2t + 1
      // hold no token, so their scale products and fmas are skipped (column 2t's are unchanged).
      auto stage = [&]<int NT, bool ONE>() {
        for (int sb = 0; sb < cpr / 4; ++sb) {  // 128-k blocks of the stage: one activation scale each
          const int kbr = st * (cpr / 4) + sb;  // the block within the unit
          float ftok[NT][2];                    // activation scales of this lane's C columns
#pragma unroll
          for (int tt = 0; tt < NT; ++tt)
#pragma unroll
            for (int q = 0; q < 2; ++q)
              ftok[tt][q] = (NT == 1 || tt < mt_act) && !(ONE && q == 1)
                                ? mx_act_scale(a.a_scales[asoff[tt][q] + kbr])
                                : 0.0f;
          const uint32_t wr0 = sb == 0 ? sr0.x : sr0.y, wr1 = sb == 0 ? sr1.x : sr1.y;  // the block's 4 groups
#pragma unroll
          for (int pp = 0; pp < 2; ++pp) {
            uint32_t wq[4];  // rows g, g + 8 of group 2 pp of the block, then of group 2 pp + 1
            mma::ldsm_x4(wq, slot_s + (lm_b ^ ((2 * sb + pp) << 5)));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int jb = pp * 2 + h;  // group within the block
              uint32_t f0[4], f1[4];
              mma::e2m1x8_to_f16x8(wq[2 * h], f0);
              mma::e2m1x8_to_f16x8(wq[2 * h + 1], f1);
              const uint32_t a0[4] = {f0[0], f1[0], f0[1], f1[1]};
              const uint32_t a1[4] = {f0[2], f1[2], f0[3], f1[3]};
              const float frow[2] = {mx_row_scale(wr0, jb), mx_row_scale(wr1, jb)};  // C rows g, g + 8
#pragma unroll
              for (int tt = 0; tt < NT; ++tt) {
                if (NT > 1 && tt >= mt_act) break;
                // The group's activation codes of this lane (token tile tt, k quarter t).
                const uint2 c = mma::ld_act8(a.a_codes + aoff[tt] + kbr * 128 + jb * 32);
                float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma::mma_f16(blk, a0, mma::e4m3x2_to_f16x2(c.x), mma::e4m3x2_hi_to_f16x2(c.x));
                mma::mma_f16(blk, a1, mma::e4m3x2_to_f16x2(c.y), mma::e4m3x2_hi_to_f16x2(c.y));
                float* acc_t = acc[tt >> 1][tt & 1];
#pragma unroll
                for (int i = 0; i < 4; ++i)
                  if (!(ONE && (i & 1))) acc_t[i] = fmaf(blk[i], frow[i >> 1] * ftok[tt][i & 1], acc_t[i]);
              }
            }
          }
        }
      };
      if (x.nrows == 1) stage.template operator()<1, true>();
      else if (mt_act == 1) stage.template operator()<1, false>();
      else stage.template operator()<2 * MT, false>();
    }
    __syncwarp();  // every lane is done with the slot before any lane refills it
    if (prod.ok) {
      load(prod, ring + slot_i * kSlotBytes);
      next(prod);
    }
    mma::cp_async_commit();
    slot_i = slot_i + 1 == S ? 0 : slot_i + 1;

    if (st == cons.nst - 1) {
      // ---- end of the unit: FP8 back to real units, units (and w1/w3) through shared memory ----
      if (x.shared) {
        const float sw = mma::exp2i(last_ew - 127);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          // The activation scale of A rows g (0) and g + 8 (1), or with `half` of C columns 2t + q.
          float sxs[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) sxs[u] = mt < mt_act ? mma::exp2i(prev_e[mt][u] - last_ew - 127) : 1.0f;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
              for (int q = 0; q < 2; ++q) {
                float& v = acc[mt][nt][2 * hh + q];
                v = nan_scale ? __int_as_float(0x7fc00000) : (v * sw) * sxs[half ? q : hh];
              }
        }
      } else if (nan_rows) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              if ((nan_rows >> (i >> 1)) & 1) acc[mt][nt][i] = __int_as_float(0x7fffffff);  // the fma's NaN
      }
      const bool lead = mm == 0 && unit == 0;  // the tile's warp that sums and stores
      const bool reduce = NM > 1 || U > 1;     // uniform over the CTA
      // Partials of warp (tl, m2, u) for this lane, in red.
      auto part = [&](int m2, int u, int mt, int nt, int i) {
        return red[(static_cast<int64_t>((tl * NM + m2) * U + u) * kPer + (mt * 2 + nt) * 4 + i) * 32 + lane];
      };
      if (reduce) {
        // No CTA-wide barrier: the other warps hand their partials to the leads (kBarFull) and go on
        // streaming their next item; they wait only before overwriting red, until the leads have
        // read it (kBarFree), so a lead's epilogue (stores, counter, act_quant / combine) overlaps
        // the next item. A lead releases red only when another item follows, so that every arrival
        // meets a wait.
        if (!lead) {
          if (reduced) bar_sync(kBarFree);
          float* dst = red + static_cast<int64_t>(warp) * kPer * 32;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) dst[((mt * 2 + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i];
          bar_arrive(kBarFull);
        } else {
          bar_sync(kBarFull);
          // w1 (down: w2): the units in order
          for (int u = 1; u < U; ++u)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mt][nt][i] = kc::add_rn(acc[mt][nt][i], part(0, u, mt, nt, i));
          if constexpr (UP) {
            // w3: its units in order, the sum kept in the lead's own slot of red (part(0, 0), which
            // no other warp writes or reads) so that red can be released before the stores.
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  float v = part(NM - 1, 0, mt, nt, i);
                  for (int u = 1; u < U; ++u) v = kc::add_rn(v, part(NM - 1, u, mt, nt, i));
                  red[(static_cast<int64_t>(warp) * kPer + (mt * 2 + nt) * 4 + i) * 32 + lane] = v;
                }
          }
          const int64_t wn = cons.w + gridDim.x;  // this CTA's next item, if any
          if (routed_known) {
            if (wn < total) bar_arrive(kBarFree);
          } else if (item_chunk(wn, a.ipc) < a.chunks_shared) {
            bar_arrive(kBarFree);  // before the wait (early): another shared item follows
          } else {
            owe_free = true;  // a routed item follows if the routing gave this rank one
          }
        }
        reduced = true;
      }
      if (lead) {
        const int64_t row0 = static_cast<int64_t>(x.tile) * kRows;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              // (token within the chunk, output column) of accumulator (mt, nt, i): the shared
              // expert's tokens are A rows, the routed experts' (and the shared expert's at most 8
              // with `half`) C columns (token tile 2 mt + nt).
              const bool rows = x.shared && !half;
              const int64_t j = rows ? mt * 16 + g + (i >= 2 ? 8 : 0) : (mt * 2 + nt) * 8 + 2 * t + (i & 1);
              if (j >= x.nrows) continue;
              const int64_t col = row0 + (rows ? nt * 8 + 2 * t + (i & 1) : g + (i >= 2 ? 8 : 0));
              const int64_t jr = static_cast<int64_t>(x.chunk) * kChunk + j;
              if constexpr (UP) {
                // The linears' bf16 outputs, then SwiGLU exactly as the swiglu op (and the routing weight).
                float gv = kc::round_bf16(acc[mt][nt][i]), uv = kc::round_bf16(part(0, 0, mt, nt, i));  // w3's sum, above
                if (a.limit > 0.0f) {
                  uv = kc::clamp_std(uv, -a.limit, a.limit);
                  gv = kc::min_std(gv, a.limit);
                }
                float v = kc::mul_rn(kc::div_rn(gv, kc::add_rn(1.0f, expf(-gv))), uv);
                int64_t orow;
                if (x.shared) {
                  orow = a.shared_orow0 + jr;
                } else {
                  orow = x.off + jr;
                  v = kc::mul_rn(a.pair_weight[orow], v);
                }
                a.out[orow * a.ldo + col] = kc::round_bf16(v);
              } else {
                const float v = kc::round_bf16(acc[mt][nt][i]);
                if (x.shared) a.shared_out[jr * a.ldo + col] = v;
                else a.out[(x.off + jr) * a.ldo + col] = v;
              }
            }
        // Arrival of this tile: stores ordered before the counter (every lane fences its own).
        __threadfence();
        __syncwarp();
        if constexpr (UP) {
          // The last of the 8 tiles of a 128-column block quantizes the chunk's rows of the block
          // (act_quant, as decode_act_pack): amax over the block, E8M0 scale, e4m3 codes.
          const int64_t blk = x.tile / 8, nb = a.n / 128;
          int32_t* cnt = a.qcnt + (static_cast<int64_t>(cons.job) * a.chunks_max + x.chunk) * nb + blk;
          int old = 0;
          if (lane == 0) old = atomicAdd(cnt, 1);
          old = __shfl_sync(0xffffffffu, old, 0);
          if (old == 7) {
            __threadfence();
            for (int64_t j = 0; j < x.nrows; ++j) {
              const int64_t jr = static_cast<int64_t>(x.chunk) * kChunk + j;
              const int64_t orow = x.shared ? a.shared_orow0 + jr : x.off + jr;
              const float* src = a.out + orow * a.ldo + blk * 128;
              float v[4];
              float amax = 0.0f;
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                v[q] = mma::ld_cg(src + lane + 32 * q);
                const float av = fabsf(v[q]);
                amax = av > amax ? av : amax;  // NaN compares false: ignored, as the act_quant op
              }
              amax = kc::warp_max(amax);
              const int e = num::ue8m0_scale_exponent(amax, num::kE4m3Max, num::kFp8ActAmaxFloor);
              const float scl = num::pow2_int(e);
              if (lane == 0) a.act_scales[orow * nb + blk] = num::e8m0_from_exponent(e);
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const float qv = kc::clamp_std(kc::div_rn(v[q], scl), -num::kE4m3Max, num::kE4m3Max);
                a.act_codes[orow * a.n + blk * 128 + lane + 32 * q] = num::f32_to_e4m3(kc::is_nan(v[q]) ? v[q] : qv);
              }
            }
            if (lane == 0) *cnt = 0;
            if (x.shared) {
              // The shared rows' blocks done, for the down kernel's early item: after the stores.
              __threadfence();
              __syncwarp();
              if (lane == 0) atomicAdd(a.sdone, 1);
            }
          }
        } else if (routed_known) {
          combine_arrive(x.tile);
        } else {
          pending_tile = x.tile;  // the tile's total is the routing's
        }
      }
      if (tl_items < 5) timeline::mark(tlr, 5 + 2 * static_cast<int>(tl_items));
      ++tl_items;
      reset();
    }
    next(cons);
  }
  mma::cp_async_wait(0);
  timeline::mark(tlr, 15);
  timeline::finish(tlr, tl_items);
}

template <bool UP, int MT>
void launch_experts(const ExpertArgs& ea, int64_t grid, size_t smem, bool pdl, cudaStream_t s) {
  auto* kern = expert_kernel<UP, MT>;
  static std::atomic<bool> attr{false};
  allow_smem(reinterpret_cast<const void*>(kern), attr);
  launch(kern, dim3(static_cast<unsigned>(grid)), smem, pdl, s, ea);
}

// The job table expert_kernel keeps in static shared memory, beside the dynamic part.
constexpr int64_t kJobTableBytes = static_cast<int64_t>(sizeof(int)) * (kMaxJobs + 2);

// The launch's dynamic shared memory for `mt` m tiles: every warp's ring of kExpertRing stages and
// the reduction buffer (the job table is static).
size_t expert_smem(int mt) {
  const int64_t red = static_cast<int64_t>(kWarps) * mt * 8 * 32 * 4;
  return static_cast<size_t>(kWarps * kExpertRing * kSlotBytes + red);
}

template <bool UP>
void run_experts(const MoeDecodeArgs& a, cudaStream_t s, bool early) {
  const MoeDecodeDims& d = a.dims;
  ExpertArgs ea{};
  ea.k = UP ? d.dim : d.inter;
  ea.n = UP ? d.inter : d.dim;
  ea.tokens = a.tokens;
  ea.a_codes = UP ? a.x_codes : a.buf.act_codes;
  ea.a_scales = UP ? a.x_scales : a.buf.act_scales;
  ea.active = a.buf.active;
  ea.max_active = static_cast<int>(max_active_of(d, d.max_tokens));
  ea.pair_token = a.buf.pair_token;
  ea.pair_weight = a.buf.pair_weight;
  ea.r0 = UP ? a.w1 : a.w2;
  ea.r1 = UP ? a.w3 : a.w2;
  ea.has_shared = a.sh_w1.data != nullptr;
  ea.s0 = UP ? a.sh_w1 : a.sh_w2;
  ea.s1 = UP ? a.sh_w3 : a.sh_w2;
  ea.shared_arow0 = UP ? 0 : a.tokens * d.topk;
  ea.shared_orow0 = a.tokens * d.topk;
  ea.out = UP ? a.buf.act : a.buf.pair_out;
  ea.ldo = ea.n;
  ea.shared_out = a.buf.shared_out;
  ea.limit = a.swiglu_limit;
  ea.units = units_of(ea.k, UP);
  ea.mx_k = (ea.k / ea.units) % 256 == 0 ? 256 : 128;
  const int nm = UP ? 2 : 1;
  ea.tpi = kWarps / (nm * ea.units);
  ea.ipc = ea.n / kRows / ea.tpi;
  ea.chunks_shared = ea.has_shared ? chunks_of(a.tokens) : 0;
  ea.chunks_max = chunks_of(d.max_tokens);
  ea.act_codes = a.buf.act_codes;
  ea.act_scales = a.buf.act_scales;
  ea.qcnt = a.buf.counters + quant0_of(d);
  ea.combine_order = a.buf.combine_order;
  ea.topk = d.topk;
  ea.y = a.y;
  ea.routed_only = a.routed_only;
  ea.early_shared = early && ea.has_shared;
  ea.sdone = a.buf.counters + kSdone;
  ea.ccnt = a.buf.counters + kCombine0;
  ea.tl = a.timeline ? a.timeline + (UP ? 1 : 2) * timeline::kCtas * timeline::kSlots : nullptr;
  const int mt = std::min<int64_t>(a.tokens, kChunk) <= 16 ? 1 : 2;
  const kc::DecodeLaunchLimits& lim = kc::decode_launch_limits();
  ea.ring = kExpertRing;
  const size_t smem = expert_smem(mt);
  TANDEM_CHECK_MSG(static_cast<int64_t>(smem) + kJobTableBytes <= lim.smem_per_block,
                   "moe_decode: shared memory of the device");
  // Items: at most (shared chunks + every routed job's chunks) x items per chunk; routed jobs
  // have one chunk each plus one per 32 of their pairs.
  const int64_t slots = std::min<int64_t>({max_active_of(d, a.tokens), a.expert_count, ea.max_active});
  const int64_t upper = ea.ipc * (ea.chunks_shared + slots + chunks_of(a.tokens * d.topk));
  const int64_t grid =
      std::max<int64_t>(1, std::min<int64_t>(upper, kc::decode_max_ctas(lim, static_cast<int64_t>(smem) + kJobTableBytes)));
  if (mt == 1) launch_experts<UP, 1>(ea, grid, smem, a.pdl, s);
  else launch_experts<UP, 2>(ea, grid, smem, a.pdl, s);
}

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

bool mxfp4_ok(const WeightRef& w, int64_t n, int64_t k) {
  return w.format == WeightFormat::kMxfp4 && w.data && w.scale && w.k == k && w.n >= n && k % 128 == 0 &&
         aligned(w.data, 16) && aligned(w.scale, 8);
}
bool fp8_ok(const WeightRef& w, int64_t n, int64_t k) {
  return w.format == WeightFormat::kFp8Block && w.data && w.scale && w.k == k && w.n == n && k % 128 == 0 &&
         aligned(w.data, 16);
}

}  // namespace

size_t moe_decode_data_bytes(const MoeDecodeDims& d) {
  const int64_t T = d.max_tokens, K = d.topk, E = d.n_experts, I = d.inter, D = d.dim;
  const int64_t A = max_active_of(d, T), P = T * K, R = P + T;
  size_t b = 0;
  b += align256(sizeof(float) * T * E);                 // gate_logits
  b += align256(sizeof(float) * gate_split(D, d.n_experts).kb * T * E);  // gate_partial
  b += align256(sizeof(int32_t) * P);                   // expert_ids
  b += align256(sizeof(float) * P);                     // weights
  b += align256(sizeof(int32_t) * (2 * A + 2));         // active
  b += align256(sizeof(int32_t) * P);                   // pair_token
  b += align256(sizeof(float) * P);                     // pair_weight
  b += align256(sizeof(int32_t) * P);                   // token_pair
  b += align256(sizeof(int32_t) * P);                   // combine_order
  b += align256(sizeof(float) * R * I);                 // act
  b += align256(static_cast<size_t>(R * I));            // act_codes
  b += align256(static_cast<size_t>(R * (I / 128)));    // act_scales
  b += align256(sizeof(float) * P * D);                 // pair_out
  b += align256(sizeof(float) * T * D);                 // shared_out
  return b;
}

size_t moe_decode_bytes(const MoeDecodeDims& d) {
  return moe_decode_data_bytes(d) + align256(sizeof(int32_t) * counter_count(d));
}

MoeDecodeBuffers moe_decode_carve(const MoeDecodeDims& d, void* base) {
  const int64_t T = d.max_tokens, K = d.topk, E = d.n_experts, I = d.inter, D = d.dim;
  const int64_t A = max_active_of(d, T), P = T * K, R = P + T;
  uint8_t* p = static_cast<uint8_t*>(base);
  auto take = [&](size_t bytes) {
    uint8_t* at = p;
    p += align256(bytes);
    return at;
  };
  MoeDecodeBuffers b;
  b.gate_logits = reinterpret_cast<float*>(take(sizeof(float) * T * E));
  b.gate_partial = reinterpret_cast<float*>(take(sizeof(float) * gate_split(D, d.n_experts).kb * T * E));
  b.expert_ids = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  b.weights = reinterpret_cast<float*>(take(sizeof(float) * P));
  b.active = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (2 * A + 2)));
  b.pair_token = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  b.pair_weight = reinterpret_cast<float*>(take(sizeof(float) * P));
  b.token_pair = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  b.combine_order = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  b.act = reinterpret_cast<float*>(take(sizeof(float) * R * I));
  b.act_codes = take(static_cast<size_t>(R * I));
  b.act_scales = take(static_cast<size_t>(R * (I / 128)));
  b.pair_out = reinterpret_cast<float*>(take(sizeof(float) * P * D));
  b.shared_out = reinterpret_cast<float*>(take(sizeof(float) * T * D));
  b.counters = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * counter_count(d)));
  return b;
}

void moe_decode_init(const MoeDecodeDims& d, const MoeDecodeBuffers& b, cudaStream_t s) {
  TANDEM_CUDA_CHECK(cudaMemsetAsync(b.counters, 0, sizeof(int32_t) * counter_count(d), s));
}

int moe_decode_units(int64_t k, bool up) { return units_of(k, up); }

int moe_gate_k_split(int64_t dim) {
  const GateSplit g = gate_split(dim, 1);
  return g.upc + g.kb - 1;
}

bool moe_decode_supports(const MoeDecodeArgs& a) {
  const MoeDecodeDims& d = a.dims;
  if (d.dim % 128 || d.inter % 128 || d.topk < 1 || d.topk > kMaxTopk || d.n_experts < 1 ||
      d.n_experts > kc::kMoeGateMaxExperts || d.max_tokens < 1)
    return false;
  if (a.gate.format != WeightFormat::kBf16 || a.gate.n != d.n_experts || a.gate.k != d.dim ||
      !kc::decode_gemm_supports(a.gate, false) || gate_split(d.dim, d.n_experts).kb > kGateMaxKb)
    return false;
  if (!aligned(a.x, 16)) return false;
  if (a.expert_count < 1 || a.expert_begin < 0 || a.expert_begin + a.expert_count > d.n_experts) return false;
  if (!mxfp4_ok(a.w1, a.expert_count * d.inter, d.dim) || !mxfp4_ok(a.w3, a.expert_count * d.inter, d.dim) ||
      !mxfp4_ok(a.w2, a.expert_count * d.dim, d.inter))
    return false;
  if (a.sh_w1.data &&
      (!fp8_ok(a.sh_w1, d.inter, d.dim) || !fp8_ok(a.sh_w3, d.inter, d.dim) || !fp8_ok(a.sh_w2, d.dim, d.inter)))
    return false;
  if (!aligned(a.x_codes, 16) || !aligned(a.buf.act_codes, 16)) return false;
  // The expert kernels address activation codes with 32-bit offsets. This also bounds their item
  // indices, which item_chunk divides in 32 bits: a launch has at most ipc (<= max(dim, inter) / 16)
  // x (shared chunks + active experts + pair chunks <= 2 (topk + 1) max_tokens) items, below 2^28,
  // and a CTA locates at most its grid (a few hundred) past the last.
  if (d.max_tokens * (d.topk + 1) * std::max(d.dim, d.inter) >= (int64_t{1} << 31)) return false;
  // The routing CTA's scratch (two floats per expert per warp and the grouping's arrays) fits one
  // block's shared memory.
  if (route_smem(d.n_experts, a.expert_count) > static_cast<size_t>(kc::decode_launch_limits().smem_per_block))
    return false;
  return true;
}

void moe_experts_up(const MoeDecodeArgs& a, cudaStream_t s) { run_experts<true>(a, s, false); }
void moe_experts_down(const MoeDecodeArgs& a, cudaStream_t s) { run_experts<false>(a, s, false); }

void moe_decode(const MoeDecodeArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  const MoeDecodeDims& d = a.dims;
  TANDEM_CHECK_MSG(a.tokens <= d.max_tokens, "moe_decode: more tokens than the buffers were sized for");
  TANDEM_CHECK_MSG(moe_decode_supports(a), "moe_decode: unsupported weights");
  TANDEM_CHECK_MSG(a.sh_w1.data || a.routed_only, "moe_decode: the combine needs the shared expert");
  moe_gate_route(a, s);
  run_experts<true>(a, s, /*early=*/true);   // its predecessor is the gate + routing kernel
  run_experts<false>(a, s, /*early=*/true);  // its predecessor is that up kernel
}

kc::SmemBound expert_smem_bound() {
  // The larger of the two m-tile counts (the ring is kExpertRing stages on every device).
  return {"expert_kernel", static_cast<int64_t>(expert_smem(2)),
          "2 m tiles, ring " + std::to_string(kExpertRing) + " stages a warp", ""};
}

}  // namespace tandem::cuda_model
