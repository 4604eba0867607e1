// The decode-size MoE sub-block (see moe_decode.h): routing and grouping in one CTA, then the
// experts as GEMV jobs in the decode GEMV's style (kernels/cuda/decode_mma.cuh): a warp owns 16
// rows of one expert matrix (both w1 and w3 in the up pass, for the SwiGLU epilogue) over one k
// unit and multiplies them with every token of that expert, so each expert's weights are read
// once per step. Grid: x = 16-row tiles / row warps, y = jobs (the shared expert first, then one
// slot per possible active expert; slots past the step's active count exit), z = 48-token chunks.
//
// Routed experts (MXFP4, per-32 E8M0 scales): each lane takes a quarter (4 bytes, 8 values) of
// every 32-value scale group of its row, so the 16 k-slots of an mma all share one weight scale;
// e2m1 becomes e4m3 by moving bits (value * 2^-6) and f16 by the hardware conversion; two f16 mmas
// per group go into a zeroed block accumulator, added with the scale product (exact power of two)
// into the fp32 total. The shared expert (FP8) runs the dense decode GEMV's scheme: f16 mma on
// codes, accumulator rescaled by an exact power of two between 128-k blocks.
#include "model/cuda/moe_decode.h"

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_gate.cuh"

namespace tandem::cuda_model {

using kernels::WeightFormat;
using kernels::WeightRef;
namespace kc = kernels::cuda;
namespace mma = kernels::cuda::mma;

namespace {

constexpr int kRows = 16;            // rows per warp tile (two n8 tiles)
constexpr int kChunk = 48;          // tokens per expert job chunk (3 m16 tiles: no spills)
constexpr int kMaxThreads = 256;
constexpr int kMaxSmem = 64 * 1024;
constexpr int kRouteWarps = 16;
constexpr int kMaxTopk = 16;

int64_t max_active_of(const MoeDecodeDims& d, int64_t tokens) {
  return std::min<int64_t>(d.n_experts, tokens * d.topk);
}
size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// ---------------------------------------------------------------- routing + grouping
struct RouteArgs {
  kernels::MoeGateParams gate;   // logits, bias / tid2eid, ids, weights
  int expert_begin, expert_count;
  int max_active;
  int32_t* active;               // [1 + max_active + max_active + 1]
  int32_t* pair_token;
  float* pair_weight;
  int32_t* token_pair;
};

__global__ void __launch_bounds__(kRouteWarps * kc::kWarp) route_kernel(const __grid_constant__ RouteArgs a) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nthreads = blockDim.x;
  const int E = a.gate.n_experts, K = a.gate.topk, EL = a.expert_count;
  float* sel = smem + warp * E;
  int* cnt = reinterpret_cast<int*>(smem + kRouteWarps * E);
  int* cursor = cnt + EL;
  int* slot_of = cursor + EL;
  kc::pdl_trigger();
  kc::pdl_wait();
  for (int i = threadIdx.x; i < EL; i += nthreads) {
    cnt[i] = 0;
    cursor[i] = 0;
  }
  for (int64_t t = warp; t < a.gate.tokens; t += kRouteWarps) kc::moe_gate_token(a.gate, t, sel, lane);
  __syncthreads();  // ids / weights (global) and the zeroed counters are visible to the block
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
  for (int64_t p = threadIdx.x; p < P; p += nthreads) {
    const int e = a.gate.expert_ids[p] - a.expert_begin;
    if (e >= 0 && e < EL) {
      const int pos = act_off[slot_of[e]] + atomicAdd(&cursor[e], 1);
      a.pair_token[pos] = static_cast<int32_t>(p / K);
      a.pair_weight[pos] = a.gate.weights[p];
      a.token_pair[p] = pos;
    } else {
      a.token_pair[p] = -1;
    }
  }
}

// ---------------------------------------------------------------- expert GEMV jobs
struct ExpertArgs {
  const uint8_t* a_codes;     // activation codes [rows, k] (up: x codes by token; down: act codes)
  const uint8_t* a_scales;    // [rows, k / 128]
  int64_t k;                  // columns (up: dim, down: inter)
  int64_t rows;               // output rows per expert matrix (up: inter, down: dim)
  int64_t tokens;
  const int32_t* active;      // route output (count, experts, offsets)
  int max_active;
  const int32_t* pair_token;
  const float* pair_weight;
  WeightRef r0, r1;           // routed MXFP4, local experts concatenated (up: w1, w3; down: w2)
  WeightRef s0, s1;           // shared FP8 (up: w1, w3; down: w2); s0.data == null: none
  bool has_shared;
  int64_t shared_arow0;       // activation row of the shared job's first token
  float* out;                 // up: act [., inter]; down: pair_out [., dim]
  int64_t ldo;
  int64_t shared_orow0;       // up: row of the shared job's first token in out
  float* shared_out;          // down: [tokens, dim]
  float limit;
  int k_split, row_warps;
  int64_t ku;
};

struct Job {
  bool shared;
  int64_t wrow0;     // first weight row of this expert in the matrices
  int64_t nrows;     // job rows (tokens) in this chunk
  int64_t jrow0;     // index of the chunk's first job row (chunk * kChunk)
  int64_t off;       // pair offset (routed)
};

// A-row (activation row) and output row of job row j.
template <bool UP>
__device__ __forceinline__ int64_t a_row(const ExpertArgs& a, const Job& jb, int64_t j) {
  if (jb.shared) return UP ? j : a.shared_arow0 + j;
  return UP ? a.pair_token[jb.off + j] : jb.off + j;
}

__device__ __forceinline__ uint32_t word4(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

__device__ __forceinline__ uint32_t ld_cached_u32(const void* p) { return __ldg(static_cast<const uint32_t*>(p)); }
__device__ __forceinline__ uint2 ld_act8(const void* p) { return *static_cast<const uint2*>(p); }

template <bool UP, int MT>
__device__ __forceinline__ void run_job(const ExpertArgs& a, bool shared, int rslot, float* red) {
  constexpr int NMAT = UP ? 2 : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int kw = warp % a.k_split, rw = warp / a.k_split;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * a.row_warps + rw;
  const int64_t ntiles = a.rows / kRows;
  const bool tile_ok = tile < ntiles;
  const int64_t row0 = (tile_ok ? tile : ntiles - 1) * kRows;  // row within the expert matrix
  const int64_t k0 = kw * a.ku;
  const int nst = static_cast<int>(a.ku / 128);
  const int64_t chunk = blockIdx.z;

  Job jb{shared, 0, 0, chunk * kChunk, 0};
  float acc[MT][NMAT][2][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][mm][nt][i] = 0.0f;

  int64_t arow[MT][2];
  int mt_act = 0;
  auto set_rows = [&]() {
    const int64_t left = jb.nrows;
    mt_act = (left + 15) / 16 < MT ? static_cast<int>((left + 15) / 16) : MT;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t j0 = mt * 16 + g + hh * 8, j = j0 < left ? j0 : left - 1;
        arow[mt][hh] = a_row<UP>(a, jb, jb.jrow0 + j);
      }
  };

  if (shared) {
    // ---- FP8 shared expert: weights known before the dependency wait.
    constexpr int D = 2;
    const WeightRef* wm[2] = {&a.s0, &a.s1};
    const uint8_t* wrow[NMAT][2];
#pragma unroll
    for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        wrow[mm][nt] = static_cast<const uint8_t*>(wm[mm]->data) + (row0 + nt * 8 + g) * a.k + k0;
    auto load_stage = [&](uint4 (&b)[NMAT][2][2], int st) {
#pragma unroll
      for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h) b[mm][nt][h] = mma::ld_stream(wrow[mm][nt] + st * 128 + h * 64 + t * 16);
    };
    uint4 buf[D][NMAT][2][2];
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (d < nst) load_stage(buf[d], d);
    kc::pdl_trigger();
    kc::pdl_wait();
    jb.nrows = a.tokens - jb.jrow0 < kChunk ? a.tokens - jb.jrow0 : kChunk;
    if (jb.nrows <= 0) return;  // CTA-uniform
    set_rows();
    const uint8_t* wsc[NMAT];
#pragma unroll
    for (int mm = 0; mm < NMAT; ++mm) {
      const int64_t sld = wm[mm]->scale_ld > 0 ? wm[mm]->scale_ld : (a.k + 127) / 128;
      wsc[mm] = wm[mm]->scale + (row0 / 128) * sld + k0 / 128;
    }
    int prev_e[NMAT][MT][2] = {};
    bool nan_scale = false;
    auto compute = [&](const uint4 (&b)[NMAT][2][2], int st) {
      const int64_t kb = (k0 + st * 128) / 128;
#pragma unroll
      for (int mm = 0; mm < NMAT; ++mm) {
        const int ew = wsc[mm][st];
        nan_scale |= ew == 255;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (mt >= mt_act) break;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int e = ew + a.a_scales[arow[mt][hh] * (a.k / 128) + kb];
            if (st > 0) {
              const float r = mma::exp2i(prev_e[mm][mt][hh] - e);
#pragma unroll
              for (int nt = 0; nt < 2; ++nt) {
                acc[mt][mm][nt][2 * hh] *= r;
                acc[mt][mm][nt][2 * hh + 1] *= r;
              }
            }
            prev_e[mm][mt][hh] = e;
          }
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t kl = k0 + st * 128 + h * 64 + t * 16;
        uint4 c[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (mt >= mt_act) break;
          c[mt][0] = mma::ld_act16(a.a_codes + arow[mt][0] * a.k + kl);
          c[mt][1] = mma::ld_act16(a.a_codes + arow[mt][1] * a.k + kl);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t bf[NMAT][2][2];
#pragma unroll
          for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              const uint32_t w4 = word4(b[mm][nt][h], j);
              bf[mm][nt][0] = mma::e4m3x2_to_f16x2(w4);
              bf[mm][nt][1] = mma::e4m3x2_to_f16x2(w4 >> 16);
            }
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (mt >= mt_act) break;
            const uint32_t w0 = word4(c[mt][0], j), w1 = word4(c[mt][1], j);
            const uint32_t af[4] = {mma::e4m3x2_to_f16x2(w0), mma::e4m3x2_to_f16x2(w1), mma::e4m3x2_to_f16x2(w0 >> 16),
                                    mma::e4m3x2_to_f16x2(w1 >> 16)};
#pragma unroll
            for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
              for (int nt = 0; nt < 2; ++nt) mma::mma_f16(acc[mt][mm][nt], af, bf[mm][nt][0], bf[mm][nt][1]);
          }
        }
      }
    };
    for (int st0 = 0; st0 < nst; st0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int st = st0 + d;
        if (st < nst) {
          compute(buf[d], st);
          if (st + D < nst) load_stage(buf[d], st + D);
        }
      }
    }
#pragma unroll
    for (int mm = 0; mm < NMAT; ++mm) {
      const int ewl = wsc[mm][nst - 1];
      const float sw = mma::exp2i(ewl - 127);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float sx = mt < mt_act ? mma::exp2i(prev_e[mm][mt][hh] - ewl - 127) : 1.0f;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              float& v = acc[mt][mm][nt][2 * hh + q];
              v = nan_scale ? __int_as_float(0x7fc00000) : (v * sw) * sx;
            }
        }
    }
  } else {
    // ---- routed MXFP4 expert: which expert is known only after the routing kernel.
    kc::pdl_trigger();
    kc::pdl_wait();
    if (rslot >= a.active[0]) return;  // CTA-uniform
    const int le = a.active[1 + rslot];
    jb.off = a.active[1 + a.max_active + rslot];
    const int64_t ne = a.active[1 + a.max_active + rslot + 1] - jb.off;
    jb.nrows = ne - jb.jrow0 < kChunk ? ne - jb.jrow0 : kChunk;
    if (jb.nrows <= 0) return;
    set_rows();
    jb.wrow0 = static_cast<int64_t>(le) * a.rows;
    constexpr int D = UP ? 2 : 4;
    const WeightRef* wm[2] = {&a.r0, &a.r1};
    const int64_t kb2 = a.k / 2, kg = a.k / 32;
    // This lane's weight row g and the scale rows of its C columns 2t, 2t+1, per matrix.
    const uint8_t* wbase[NMAT];
    const uint8_t* sbase[NMAT];
#pragma unroll
    for (int mm = 0; mm < NMAT; ++mm) {
      const int64_t r = jb.wrow0 + row0;
      wbase[mm] = static_cast<const uint8_t*>(wm[mm]->data) + (r + g) * kb2 + k0 / 2 + t * 4;
      sbase[mm] = wm[mm]->scale + (r + 2 * t) * kg + k0 / 32;
    }
    const int wnt = static_cast<int>(8 * kb2), snt = static_cast<int>(8 * kg), sq = static_cast<int>(kg);
    struct Stage {
      uint32_t w[NMAT][2][4];  // group j's quarter
      uint32_t sc[NMAT][2][2]; // E8M0 of groups 0..3, C columns 2t / 2t+1
    };
    auto load_stage = [&](Stage& s_, int st) {
#pragma unroll
      for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int j = 0; j < 4; ++j) s_.w[mm][nt][j] = ld_cached_u32(wbase[mm] + nt * wnt + st * 64 + j * 16);
          s_.sc[mm][nt][0] = ld_cached_u32(sbase[mm] + nt * snt + st * 4);
          s_.sc[mm][nt][1] = ld_cached_u32(sbase[mm] + nt * snt + sq + st * 4);
        }
    };
    Stage buf[D];
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (d < nst) load_stage(buf[d], d);
    auto compute = [&](const Stage& s_, int st) {
      const int64_t kb = (k0 + st * 128) / 128;
      float ftok[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          ftok[mt][hh] = mt < mt_act ? mma::exp2i(static_cast<int>(a.a_scales[arow[mt][hh] * (a.k / 128) + kb]) - 127)
                                     : 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t bf[NMAT][2][4];
        float frow[NMAT][2][2];
#pragma unroll
        for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            uint32_t lo, hi;
            mma::e2m1x8_to_e4m3x8(s_.w[mm][nt][j], lo, hi);
            bf[mm][nt][0] = mma::e4m3x2_to_f16x2(lo);
            bf[mm][nt][1] = mma::e4m3x2_to_f16x2(lo >> 16);
            bf[mm][nt][2] = mma::e4m3x2_to_f16x2(hi);
            bf[mm][nt][3] = mma::e4m3x2_to_f16x2(hi >> 16);
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const int ew = (s_.sc[mm][nt][q] >> (8 * j)) & 0xff;  // weight values carry 2^-6
              frow[mm][nt][q] = ew == 255 ? __int_as_float(0x7fc00000) : mma::exp2i(ew - 127 + 6);
            }
          }
        const int64_t kl = k0 + st * 128 + j * 32 + t * 8;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (mt >= mt_act) break;
          const uint2 c0 = ld_act8(a.a_codes + arow[mt][0] * a.k + kl);
          const uint2 c1 = ld_act8(a.a_codes + arow[mt][1] * a.k + kl);
          const uint32_t a0[4] = {mma::e4m3x2_to_f16x2(c0.x), mma::e4m3x2_to_f16x2(c1.x),
                                  mma::e4m3x2_to_f16x2(c0.x >> 16), mma::e4m3x2_to_f16x2(c1.x >> 16)};
          const uint32_t a1[4] = {mma::e4m3x2_to_f16x2(c0.y), mma::e4m3x2_to_f16x2(c1.y),
                                  mma::e4m3x2_to_f16x2(c0.y >> 16), mma::e4m3x2_to_f16x2(c1.y >> 16)};
#pragma unroll
          for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
              mma::mma_f16(blk, a0, bf[mm][nt][0], bf[mm][nt][1]);
              mma::mma_f16(blk, a1, bf[mm][nt][2], bf[mm][nt][3]);
#pragma unroll
              for (int i = 0; i < 4; ++i)
                acc[mt][mm][nt][i] = fmaf(blk[i], frow[mm][nt][i & 1] * ftok[mt][i >> 1], acc[mt][mm][nt][i]);
            }
        }
      }
    };
    for (int st0 = 0; st0 < nst; st0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int st = st0 + d;
        if (st < nst) {
          compute(buf[d], st);
          if (st + D < nst) load_stage(buf[d], st + D);
        }
      }
    }
  }

  // k-split partials through shared memory, added in unit order by the unit-0 warps.
  constexpr int kPer = MT * NMAT * 2 * 4;
  if (a.k_split > 1) {
    if (kw > 0) {
      float* dst = red + static_cast<int64_t>((kw - 1) * a.row_warps + rw) * kPer * 32;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) dst[(((mt * NMAT + mm) * 2 + nt) * 4 + i) * 32 + lane] = acc[mt][mm][nt][i];
    }
    __syncthreads();
    if (kw == 0)
      for (int u = 1; u < a.k_split; ++u) {
        const float* src = red + static_cast<int64_t>((u - 1) * a.row_warps + rw) * kPer * 32;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int mm = 0; mm < NMAT; ++mm)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i)
                acc[mt][mm][nt][i] =
                    kc::add_rn(acc[mt][mm][nt][i], src[(((mt * NMAT + mm) * 2 + nt) * 4 + i) * 32 + lane]);
      }
  }
  if (kw != 0 || !tile_ok) return;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t j = mt * 16 + g + (i >= 2 ? 8 : 0);  // job row within the chunk
        if (j >= jb.nrows) continue;
        const int64_t col = row0 + nt * 8 + 2 * t + (i & 1);
        const int64_t jr = jb.jrow0 + j;
        if constexpr (UP) {
          // The linears' bf16 outputs, then SwiGLU exactly as the swiglu op (and the routing weight).
          float gv = kc::round_bf16(acc[mt][0][nt][i]), uv = kc::round_bf16(acc[mt][1][nt][i]);
          if (a.limit > 0.0f) {
            uv = kc::clamp_std(uv, -a.limit, a.limit);
            gv = kc::min_std(gv, a.limit);
          }
          float v = kc::mul_rn(kc::div_rn(gv, kc::add_rn(1.0f, expf(-gv))), uv);
          int64_t orow;
          if (jb.shared) {
            orow = a.shared_orow0 + jr;
          } else {
            orow = jb.off + jr;
            v = kc::mul_rn(a.pair_weight[orow], v);
          }
          a.out[orow * a.ldo + col] = kc::round_bf16(v);
        } else {
          const float v = kc::round_bf16(acc[mt][0][nt][i]);
          if (jb.shared) a.shared_out[jr * a.ldo + col] = v;
          else a.out[(jb.off + jr) * a.ldo + col] = v;
        }
      }
}

template <bool UP, int MT>
__global__ void __launch_bounds__(kMaxThreads) expert_kernel(const __grid_constant__ ExpertArgs a) {
  extern __shared__ float red[];
  const bool shared = a.has_shared && blockIdx.y == 0;
  const int rslot = static_cast<int>(blockIdx.y) - (a.has_shared ? 1 : 0);
  if (shared) run_job<UP, MT>(a, true, rslot, red);
  else run_job<UP, MT>(a, false, rslot, red);
}

// ---------------------------------------------------------------- combine
struct CombineArgs {
  const float* pair_out;      // [pairs, dim]
  const int32_t* token_pair;  // [tokens, topk]
  const int32_t* expert_ids;  // [tokens, topk]
  const float* shared_out;    // [tokens, dim]
  int64_t tokens, dim;
  int topk;
  float* y;
  bool routed_only;
};

__global__ void combine_kernel(const CombineArgs a) {
  kc::pdl_trigger();
  kc::pdl_wait();
  const int64_t t = blockIdx.x;
  if (t >= a.tokens) return;
  int order[kMaxTopk];
  for (int k = 0; k < a.topk; ++k) order[k] = k;
  for (int i = 1; i < a.topk; ++i) {  // ascending expert id (distinct within a token)
    const int v = order[i];
    int b = i - 1;
    while (b >= 0 && a.expert_ids[t * a.topk + order[b]] > a.expert_ids[t * a.topk + v]) {
      order[b + 1] = order[b];
      --b;
    }
    order[b + 1] = v;
  }
  int32_t pair[kMaxTopk];
  for (int k = 0; k < a.topk; ++k) pair[k] = a.token_pair[t * a.topk + order[k]];
  for (int64_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < a.topk; ++k)
      if (pair[k] >= 0) acc = kc::add_rn(acc, a.pair_out[pair[k] * a.dim + d]);
    a.y[t * a.dim + d] = a.routed_only ? acc : kc::round_bf16(kc::add_rn(acc, a.shared_out[t * a.dim + d]));
  }
}

// ---------------------------------------------------------------- host helpers
template <typename Kernel, typename... Args>
void launch(Kernel* kern, dim3 grid, dim3 block, size_t smem, bool pdl, cudaStream_t s, Args&&... args) {
  if (pdl) {
    kc::launch_pdl(kern, grid, block, smem, s, std::forward<Args>(args)...);
  } else {
    kern<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
    TANDEM_CUDA_LAUNCH_CHECK();
  }
}

int moe_k_split(int64_t k) {
  int kw = 1;
  while (kw < 8 && k / (2 * kw) >= 1024 && (k / (2 * kw)) % 128 == 0) kw *= 2;
  return kw;
}

template <bool UP, int MT>
void launch_experts(const ExpertArgs& ea, int64_t jobs, int64_t chunks, bool pdl, cudaStream_t s) {
  auto* kern = expert_kernel<UP, MT>;
  static bool attr_set = false;  // first (eager) call, never inside a capture
  if (!attr_set) {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kern),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    attr_set = true;
  }
  constexpr int NMAT = UP ? 2 : 1;
  const size_t smem = static_cast<size_t>(ea.k_split - 1) * ea.row_warps * MT * NMAT * 2 * 4 * 32 * sizeof(float);
  TANDEM_CHECK(smem <= static_cast<size_t>(kMaxSmem));
  const int64_t tiles = ea.rows / kRows;
  const dim3 grid(static_cast<unsigned>((tiles + ea.row_warps - 1) / ea.row_warps), static_cast<unsigned>(jobs),
                  static_cast<unsigned>(chunks));
  TANDEM_CHECK(jobs <= 65535 && chunks <= 65535);
  launch(kern, grid, dim3(32 * ea.row_warps * ea.k_split), smem, pdl, s, ea);
}

template <bool UP>
void run_experts(const MoeDecodeArgs& a, cudaStream_t s) {
  const MoeDecodeDims& d = a.dims;
  ExpertArgs ea{};
  ea.k = UP ? d.dim : d.inter;
  ea.rows = UP ? d.inter : d.dim;
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
  ea.ldo = UP ? d.inter : d.dim;
  ea.shared_out = a.buf.shared_out;
  ea.limit = a.swiglu_limit;
  ea.k_split = moe_k_split(ea.k);
  ea.ku = ea.k / ea.k_split;
  const int64_t mc = std::min<int64_t>(a.tokens, kChunk);
  const int mt = mc <= 16 ? 1 : mc <= 32 ? 2 : 3;
  constexpr int NMAT = UP ? 2 : 1;
  int rw = std::max(mt, std::max(1, 4 / ea.k_split));
  rw = std::min(rw, std::max(1, (kMaxThreads / 32) / ea.k_split));
  while (rw > 1 && static_cast<int64_t>(ea.k_split - 1) * rw * mt * NMAT * 2 * 4 * 32 * 4 > kMaxSmem) --rw;
  ea.row_warps = rw;
  // Jobs: the shared expert, then one slot per possible active expert of this call.
  const int64_t routed_slots = std::min<int64_t>({max_active_of(d, a.tokens), a.expert_count, ea.max_active});
  const int64_t jobs = routed_slots + (ea.has_shared ? 1 : 0);
  if (jobs == 0) return;
  const int64_t chunks = (a.tokens + kChunk - 1) / kChunk;
  switch (mt) {
    case 1: return launch_experts<UP, 1>(ea, jobs, chunks, a.pdl, s);
    case 2: return launch_experts<UP, 2>(ea, jobs, chunks, a.pdl, s);
    default: return launch_experts<UP, 3>(ea, jobs, chunks, a.pdl, s);
  }
}

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

bool mxfp4_ok(const WeightRef& w, int64_t n, int64_t k) {
  return w.format == WeightFormat::kMxfp4 && w.data && w.scale && w.k == k && w.n >= n && k % 128 == 0 &&
         aligned(w.data, 4) && aligned(w.scale, 4);
}
bool fp8_ok(const WeightRef& w, int64_t n, int64_t k) {
  return w.format == WeightFormat::kFp8Block && w.data && w.scale && w.k == k && w.n == n && k % 128 == 0 &&
         aligned(w.data, 16);
}

}  // namespace

size_t moe_decode_bytes(const MoeDecodeDims& d) {
  const int64_t T = d.max_tokens, K = d.topk, E = d.n_experts, I = d.inter, D = d.dim;
  const int64_t A = max_active_of(d, T), P = T * K, R = P + T;
  size_t b = 0;
  b += align256(sizeof(float) * T * E);                 // gate_logits
  b += align256(sizeof(int32_t) * P);                   // expert_ids
  b += align256(sizeof(float) * P);                     // weights
  b += align256(sizeof(int32_t) * (2 * A + 2));         // active
  b += align256(sizeof(int32_t) * P);                   // pair_token
  b += align256(sizeof(float) * P);                     // pair_weight
  b += align256(sizeof(int32_t) * P);                   // token_pair
  b += align256(sizeof(float) * R * I);                 // act
  b += align256(static_cast<size_t>(R * I));            // act_codes
  b += align256(static_cast<size_t>(R * (I / 128)));    // act_scales
  b += align256(sizeof(float) * P * D);                 // pair_out
  b += align256(sizeof(float) * T * D);                 // shared_out
  return b;
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
  b.expert_ids = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  b.weights = reinterpret_cast<float*>(take(sizeof(float) * P));
  b.active = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * (2 * A + 2)));
  b.pair_token = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  b.pair_weight = reinterpret_cast<float*>(take(sizeof(float) * P));
  b.token_pair = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * P));
  b.act = reinterpret_cast<float*>(take(sizeof(float) * R * I));
  b.act_codes = take(static_cast<size_t>(R * I));
  b.act_scales = take(static_cast<size_t>(R * (I / 128)));
  b.pair_out = reinterpret_cast<float*>(take(sizeof(float) * P * D));
  b.shared_out = reinterpret_cast<float*>(take(sizeof(float) * T * D));
  return b;
}

bool moe_decode_supports(const MoeDecodeArgs& a) {
  const MoeDecodeDims& d = a.dims;
  if (d.dim % 128 || d.inter % 128 || d.inter > kc::kMaxPackDim || d.topk < 1 || d.topk > kMaxTopk ||
      d.n_experts < 1 || d.n_experts > kc::kMoeGateMaxExperts)
    return false;
  if (a.gate.format != WeightFormat::kBf16 || a.gate.n != d.n_experts || !kc::decode_gemm_supports(a.gate, false))
    return false;
  if (a.expert_count < 1 || a.expert_begin < 0 || a.expert_begin + a.expert_count > d.n_experts) return false;
  if (!mxfp4_ok(a.w1, a.expert_count * d.inter, d.dim) || !mxfp4_ok(a.w3, a.expert_count * d.inter, d.dim) ||
      !mxfp4_ok(a.w2, a.expert_count * d.dim, d.inter))
    return false;
  if (a.sh_w1.data &&
      (!fp8_ok(a.sh_w1, d.inter, d.dim) || !fp8_ok(a.sh_w3, d.inter, d.dim) || !fp8_ok(a.sh_w2, d.dim, d.inter)))
    return false;
  return true;
}

void moe_route(const MoeDecodeArgs& a, cudaStream_t s) {
  const MoeDecodeDims& d = a.dims;
  RouteArgs ra{};
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
  const size_t smem = sizeof(float) * kRouteWarps * d.n_experts + sizeof(int) * 3 * a.expert_count;
  static bool attr_set = false;
  if (!attr_set) {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(route_kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    attr_set = true;
  }
  TANDEM_CHECK(smem <= 96 * 1024);
  launch(route_kernel, dim3(1), dim3(kRouteWarps * kc::kWarp), smem, a.pdl, s, ra);
}

void moe_experts_up(const MoeDecodeArgs& a, cudaStream_t s) { run_experts<true>(a, s); }
void moe_experts_down(const MoeDecodeArgs& a, cudaStream_t s) { run_experts<false>(a, s); }

void moe_combine_decode(const MoeDecodeArgs& a, cudaStream_t s) {
  CombineArgs ca{};
  ca.pair_out = a.buf.pair_out;
  ca.token_pair = a.buf.token_pair;
  ca.expert_ids = a.buf.expert_ids;
  ca.shared_out = a.buf.shared_out;
  ca.tokens = a.tokens;
  ca.dim = a.dims.dim;
  ca.topk = a.dims.topk;
  ca.y = a.y;
  ca.routed_only = a.routed_only;
  launch(combine_kernel, dim3(static_cast<unsigned>(a.tokens)), dim3(256), 0, a.pdl, s, ca);
}

void moe_decode(const MoeDecodeArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  const MoeDecodeDims& d = a.dims;
  TANDEM_CHECK_MSG(a.tokens <= d.max_tokens, "moe_decode: more tokens than the buffers were sized for");
  TANDEM_CHECK_MSG(moe_decode_supports(a), "moe_decode: unsupported weights");
  TANDEM_CHECK_MSG(a.sh_w1.data || a.routed_only, "moe_decode: the combine needs the shared expert");
  // Gate logits (fp32, as the reference's fp32 GEMM; the activation is bf16-valued).
  kc::DecodeGemmArgs g;
  g.x = a.x;
  g.ldx = d.dim;
  g.m = a.tokens;
  g.k = d.dim;
  g.num_segments = 1;
  g.seg[0].w = a.gate;
  g.seg[0].y = a.buf.gate_logits;
  g.seg[0].ldy = d.n_experts;
  g.pdl = a.pdl;
  kc::decode_gemm(g, s);
  moe_route(a, s);
  moe_experts_up(a, s);
  kc::DecodeActPackArgs q;
  q.x = a.buf.act;
  q.rows = a.tokens * d.topk + (a.sh_w1.data ? a.tokens : 0);
  q.dim = d.inter;
  q.codes = a.buf.act_codes;
  q.scales = a.buf.act_scales;
  q.pdl = a.pdl;
  kc::decode_act_pack(q, s);
  moe_experts_down(a, s);
  moe_combine_decode(a, s);
}

}  // namespace tandem::cuda_model
