// The decode GEMV's device code (decode_gemm.h has the contract, decode_gemm.cu the launcher),
// in a header of its own so that a kernel can run a decode GEMV and then something of its own on
// the output. (The MoE gate no longer does: model/cuda/moe_decode_route.cu splits its k wider.)
//
// Work split. A warp task is (16-row weight tile, k unit); a segment's k is cut into `units`
// units (a power of two <= 8 chosen from the weight's format, rows and k alone), and one CTA item
// is 8 / units tiles x units units = 8 warp tasks, so a tile's units meet in the CTA's shared
// memory and are added in unit order. An item covers one 96-row chunk of the activation rows; the
// items of a launch (all segments, all chunks, the chunks of a tile adjacent so that they share it
// through L2) are dealt round-robin to a persistent grid of at most two CTAs per SM (as many as
// shared memory lets reside at once).
//
// Weight stream. Each warp streams its tasks' weights through a ring of `ring` 2 KB stages in
// shared memory with cp.async (16 bytes per lane, four per lane per stage: the lane copies exactly
// the pieces it feeds to the mma, so no barrier orders the ring). The stream runs across items,
// so the next item's weights are in flight during an item's reduction and stores, and the first
// `ring` stages are requested before the grid-dependency wait (programmatic dependent launch):
// they overlap the previous kernel. A CTA needs at most half an SM's shared memory and registers
// (__launch_bounds__(256, 2)), so the next kernel's CTAs fit beside it and start their own
// prefetch while this one finishes.
//
// Per lane: weight rows g and g + 8 of the tile, 16 bytes at (h * 64 + t * 16) of each 128-byte
// stage row (FP8: 16 k, bf16: 8 k) for h = 0, 1: the mma k-slots of the lane are mapped onto
// those columns (decode_mma.cuh), for the weight and the activation alike.
#pragma once

#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/timeline.cuh"

namespace tandem::kernels::cuda::gemv {

enum class Kind : int { kFp8Codes = 0, kBf16F32 = 1, kFp8F32 = 2 };

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarp;
constexpr int kNT = 2;                 // n8 tiles per warp
constexpr int kTileRows = 8 * kNT;     // weight rows per warp task
constexpr int kStageBytes = 2048;      // one warp's stage: 16 rows x 128 bytes
constexpr int kPieceBytes = 512;       // one of the four 16-byte pieces of all 32 lanes
constexpr int kMaxUnits = kWarps;
constexpr int kMaxRing = 6;
constexpr int kMinRing = 2;

template <Kind K>
struct Traits;
template <>
struct Traits<Kind::kFp8Codes> {
  static constexpr int kStageK = 128;  // one scale block
  static constexpr int kSubK = 64;     // k of one 16-byte piece per lane (x4 lanes)
  static constexpr int kElemBytes = 1;
};
template <>
struct Traits<Kind::kFp8F32> : Traits<Kind::kFp8Codes> {};
template <>
struct Traits<Kind::kBf16F32> {
  static constexpr int kStageK = 64;
  static constexpr int kSubK = 32;
  static constexpr int kElemBytes = 2;
};

struct Seg {
  const uint8_t* w;      // [n, k] stored weight
  const uint8_t* scale;  // FP8 [ceil(n/128), sld]
  int64_t sld;
  float* y;              // [m, ldy]
  int64_t ldy;
  int64_t x_col0;
  int64_t item0;         // first item (of one chunk) of this segment
  int32_t n, tiles, units, tpi, nst;  // rows, 16-row tiles, k units, tiles per item, stages per unit
  int32_t units_log2;    // units = 1 << units_log2
  int64_t ku;            // k per unit (k / units)
  int64_t unit_bytes;    // bytes of a weight row's unit (ku x the element size)
  int32_t round_bf16, accumulate;
};

struct KernelArgs {
  const uint8_t* x_codes;
  const uint8_t* x_scales;
  int64_t ld_scales;
  const float* x;
  int64_t ldx;
  int64_t m, k;
  int64_t rowb;     // bytes of a weight row (k x the element size)
  int64_t chunks;   // 96-row chunks
  int64_t total;    // items x chunks
  int32_t num_segments;
  int32_t ring;     // stages per warp ring
  Seg seg[kMaxDecodeSegments];
  // Instrument: timeline records (timeline.cuh), null: none. Thread 0's marks: 1 entry, 2 prologue
  // issued, 3 past the dependency wait, 4 + 2i / 5 + 2i item i's first stage ready / its stores done
  // (i < 5), 15 exit; count: items.
  uint64_t* tl;
};

// Where a warp's weight stream is: item-chunk index w (>= total: done), stage st of its unit, and
// the item's segment, chunk and this warp's tile (unclamped) and unit (decoded once per item).
// Also this lane's weight pointers at the unit's first stage (rows g and g + 8 of the tile, the
// lane's 16 bytes of each 64-byte half: load_stage adds the stage and the half), so that a stage's
// copies need no index arithmetic (the GEMV at one row is bound by its instructions' latency, the
// per-stage bookkeeping included: PERFORMANCE.md, eleventh session).
struct Cursor {
  int64_t w;
  int st, s, nst, tile, unit;
  int64_t chunk;
  const uint8_t* wp[2];
};
__device__ __forceinline__ void seek(const KernelArgs& a, Cursor& c, int64_t w) {
  c.w = w;
  c.st = 0;
  if (w >= a.total) return;
  int64_t gi = w;
  c.chunk = 0;
  if (a.chunks > 1) {
    gi = w / a.chunks;
    c.chunk = w - gi * a.chunks;
  }
  int s = 0;
  while (s + 1 < a.num_segments && gi >= a.seg[s + 1].item0) ++s;
  c.s = s;
  const Seg& sg = a.seg[s];
  c.nst = sg.nst;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  c.tile = static_cast<int>((gi - sg.item0) * sg.tpi) + (warp >> sg.units_log2);
  c.unit = warp & (sg.units - 1);
  const int tile = min(c.tile, sg.tiles - 1);
  const uint8_t* base = sg.w + c.unit * sg.unit_bytes + (lane & 3) * 16;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    c.wp[nt] = base + static_cast<int64_t>(min(tile * kTileRows + nt * 8 + (lane >> 2), sg.n - 1)) * a.rowb;
}
__device__ __forceinline__ void advance(const KernelArgs& a, Cursor& c) {
  if (++c.st == c.nst) seek(a, c, c.w + gridDim.x);
}

// Stage (c) of this lane's weight pieces into its ring slot.
__device__ __forceinline__ void load_stage(const Cursor& c, uint8_t* slot, int lane) {
  const int koff = c.st * 128;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const int nt = p >> 1, h = p & 1;
    mma::cp_async16(slot + p * kPieceBytes + lane * 16, c.wp[nt] + koff + h * 64);
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// The kernel body: a __global__ wrapper (256 threads, __launch_bounds__(256, 2)) calls it with the
// launch's KernelArgs and its dynamic shared memory (Plan::smem bytes). Every thread returns from
// it past the grid-dependency wait, with its cp.async groups drained: the shared memory is then
// free for the caller.
// HALF (one m tile, a call of at most 8 rows: the decode steps at batch <= 8, the verify of 6 at
// batch 1): the roles of the mma's operands swap (half_stage below): the tile's 16 weight rows are
// A and the call's rows B's n8 columns, so a stage takes half the mmas of the general body, whose A
// rows g + 8 would hold no row of such a call. An output's products, rescales and sums are the
// general body's (CudaDecodeGemm.RowsAreIndependentOfTheRowCount compares 1, 6 and 8 rows with 9
// and 100).
template <Kind KIND, int MT, bool HALF = false>
__device__ __forceinline__ void decode_gemv_body(const KernelArgs& a, uint8_t* smem) {
  static_assert(!HALF || MT == 1, "HALF is a one-m-tile shape");
  using T = Traits<KIND>;
  constexpr int kSubs = T::kStageK / T::kSubK;  // 2
  constexpr bool kFp8W = KIND != Kind::kBf16F32;
  constexpr int kPer = MT * kNT * 4;            // accumulator values per lane

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int S = a.ring;
  uint8_t* ring = smem + static_cast<size_t>(warp) * S * kStageBytes;
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(kWarps) * S * kStageBytes);
  uint64_t* const tlr = threadIdx.x == 0 ? timeline::record(a.tl) : nullptr;
  timeline::mark(tlr, 1);
  uint32_t tl_items = 0;

  // Prologue: the first S stages of this warp's stream (weights only) before the dependency wait.
  Cursor prod, cons;
  seek(a, prod, blockIdx.x);
  cons = prod;
  for (int i = 0; i < S; ++i) {
    if (prod.w < a.total) {
      load_stage(prod, ring + i * kStageBytes, lane);
      advance(a, prod);
    }
    mma::cp_async_commit();
  }
  pdl_trigger();
  timeline::mark(tlr, 2);
  pdl_wait();
  timeline::mark(tlr, 3);

  float acc[MT][kNT][4];
  int prev_e[MT][2];
  bool nan_scale = false;
  int last_ew = 0;
  auto reset = [&] {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      prev_e[mt][0] = prev_e[mt][1] = 0;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
    }
    nan_scale = false;
  };
  reset();

  // Item context (set at each item's first stage).
  int tile = 0, unit = 0, mt_act = 0;
  int64_t m0 = 0, xk0 = 0;
  int32_t tok[MT][2];  // clamped activation rows of this lane's A rows g and g + 8 (not HALF)
  const uint8_t* wscale = nullptr;
  // HALF: this lane's activation row (token g, clamped: the B column it feeds) at its k-slots of
  // the unit's first stage, and the scale rows of its C columns 2t and 2t + 1 at the unit's first block.
  const uint8_t* xh8 = nullptr;
  const float* xhf = nullptr;
  const uint8_t* xsh[2] = {nullptr, nullptr};

  // HALF's stage: the weights are the mma's A operand (rows g and g + 8 of the tile: the lane's two
  // row pieces, at the general body's k-slots) and the call's rows its n8 columns (B column g: row
  // g's activation, clamped), so one mma covers the tile's 16 weight rows where the two n8 tiles of
  // the general body took two, and no zero A rows are moved. C: acc[0][0] = (weight row g, call
  // rows 2t and 2t + 1), (row g + 8, the same two). Each output sees the same products, rescales
  // and sums as in the general body (one 16 x 8 x 16 mma per 16 k, in k order).
  auto half_stage = [&](const uint4 (&b)[kNT][kSubs], int st, int64_t kst) {
    float(&c)[4] = acc[0][0];
    if constexpr (kFp8W) {
      const int ew = wscale[st];
      nan_scale |= ew == 255;
      last_ew = ew;
      if constexpr (KIND == Kind::kFp8Codes) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {  // C columns 2t + q
          const int e = ew + xsh[q][st];
          if (st > 0) {
            const float r = mma::exp2i(prev_e[0][q] - e);
            c[q] *= r;
            c[2 + q] *= r;
          }
          prev_e[0][q] = e;
        }
      } else {
        if (st > 0) {
          const float r = mma::exp2i(prev_e[0][0] - ew);
#pragma unroll
          for (int i = 0; i < 4; ++i) c[i] *= r;
        }
        prev_e[0][0] = ew;
      }
    }
#pragma unroll
    for (int h = 0; h < kSubs; ++h) {
      constexpr int kJ = T::kSubK / 16;
      if constexpr (KIND == Kind::kFp8Codes) {
        const uint4 x = mma::ld_act16(xh8 + kst + h * T::kSubK);
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          const uint32_t w0 = word(b[0][h], j), w1 = word(b[1][h], j), xw = word(x, j);
          const uint32_t af[4] = {mma::e4m3x2_to_f16x2(w0), mma::e4m3x2_to_f16x2(w1), mma::e4m3x2_hi_to_f16x2(w0),
                                  mma::e4m3x2_hi_to_f16x2(w1)};
          mma::mma_f16(c, af, mma::e4m3x2_to_f16x2(xw), mma::e4m3x2_hi_to_f16x2(xw));
        }
      } else {
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          uint32_t af[4];
          if constexpr (KIND == Kind::kFp8F32) {
            const uint32_t w0 = word(b[0][h], j), w1 = word(b[1][h], j);
            af[0] = mma::e4m3x2_to_bf16x2(w0);
            af[1] = mma::e4m3x2_to_bf16x2(w1);
            af[2] = mma::e4m3x2_to_bf16x2(w0 >> 16);
            af[3] = mma::e4m3x2_to_bf16x2(w1 >> 16);
          } else {
            af[0] = word(b[0][h], 2 * j);
            af[1] = word(b[1][h], 2 * j);
            af[2] = word(b[0][h], 2 * j + 1);
            af[3] = word(b[1][h], 2 * j + 1);
          }
          const float4 x = mma::ld_act_f4(xhf + kst + h * T::kSubK + 4 * j);
          mma::mma_bf16(c, af, mma::f32x2_to_bf16x2(x.x, x.y), mma::f32x2_to_bf16x2(x.z, x.w));
        }
      }
    }
  };

  int slot_i = 0;
  while (cons.w < a.total) {
    const Seg& sg = a.seg[cons.s];
    if (cons.st == 0) {
      tile = cons.tile;
      unit = cons.unit;
      const int tc = min(tile, sg.tiles - 1);
      const int64_t ku = sg.ku;
      m0 = cons.chunk * kDecodeRowsPerCall;
      const int64_t mt_left = (a.m - m0 + 15) / 16;
      mt_act = mt_left < MT ? static_cast<int>(mt_left) : MT;
      if constexpr (!HALF) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) tok[mt][hh] = static_cast<int32_t>(min(m0 + mt * 16 + g + hh * 8, a.m - 1));
      }
      xk0 = sg.x_col0 + unit * ku;
      if constexpr (kFp8W) wscale = sg.scale + (static_cast<int64_t>(tc) * kTileRows / 128) * sg.sld + unit * ku / 128;
      if constexpr (HALF) {
        const int64_t tb = min(m0 + g, a.m - 1);
        const int64_t kl0 = xk0 + t * (16 / T::kElemBytes);
        if constexpr (KIND == Kind::kFp8Codes) {
          xh8 = a.x_codes + tb * a.ldx + kl0;
#pragma unroll
          for (int q = 0; q < 2; ++q) xsh[q] = a.x_scales + min(m0 + 2 * t + q, a.m - 1) * a.ld_scales + xk0 / 128;
        } else {
          xhf = a.x + tb * a.ldx + kl0;
        }
      }
    }
    // This lane's pieces of stage (cons) have landed (the usual depth: one or two m tiles on a device
    // with half an SM's shared memory for 6 stages).
    mma::cp_async_wait_ring<kMaxRing>(S);
    if (cons.st == 0 && tl_items < 5) timeline::mark(tlr, 4 + 2 * static_cast<int>(tl_items));
    const uint8_t* slot = ring + slot_i * kStageBytes;
    uint4 b[kNT][kSubs];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int h = 0; h < kSubs; ++h) b[nt][h] = mma::lds128(slot + (nt * 2 + h) * kPieceBytes + lane * 16);

    // ---- the stage's mmas (k in order; FP8: in this 128-k block's scale) ----
    const int st = cons.st;
    const int64_t kst = static_cast<int64_t>(st) * T::kStageK;
    if constexpr (HALF) {
      half_stage(b, st, kst);
    } else {
    if constexpr (kFp8W) {
      const int ew = wscale[st];
      nan_scale |= ew == 255;
      last_ew = ew;
      if constexpr (KIND == Kind::kFp8Codes) {
        const int64_t kb = (xk0 + kst) / 128;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (mt >= mt_act) break;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int e = ew + a.x_scales[static_cast<int64_t>(tok[mt][hh]) * a.ld_scales + kb];
            if (st > 0) {
              const float r = mma::exp2i(prev_e[mt][hh] - e);
#pragma unroll
              for (int nt = 0; nt < kNT; ++nt) {
                acc[mt][nt][2 * hh] *= r;
                acc[mt][nt][2 * hh + 1] *= r;
              }
            }
            prev_e[mt][hh] = e;
          }
        }
      } else {
        if (st > 0) {
          const float r = mma::exp2i(prev_e[0][0] - ew);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[mt][nt][i] *= r;
        }
        prev_e[0][0] = ew;
      }
    }
#pragma unroll
    for (int h = 0; h < kSubs; ++h) {
      constexpr int kJ = T::kSubK / 16;
      uint32_t bf[kNT][kJ][2];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          if constexpr (KIND == Kind::kFp8Codes) {
            const uint32_t w4 = word(b[nt][h], j);
            bf[nt][j][0] = mma::e4m3x2_to_f16x2(w4);
            bf[nt][j][1] = mma::e4m3x2_hi_to_f16x2(w4);
          } else if constexpr (KIND == Kind::kFp8F32) {
            const uint32_t w4 = word(b[nt][h], j);
            bf[nt][j][0] = mma::e4m3x2_to_bf16x2(w4);
            bf[nt][j][1] = mma::e4m3x2_to_bf16x2(w4 >> 16);
          } else {
            bf[nt][j][0] = word(b[nt][h], 2 * j);
            bf[nt][j][1] = word(b[nt][h], 2 * j + 1);
          }
        }
      const int64_t kl = xk0 + kst + h * T::kSubK + t * (16 / T::kElemBytes);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (mt >= mt_act) break;
        if constexpr (KIND == Kind::kFp8Codes) {
          const uint4 c0 = mma::ld_act16(a.x_codes + static_cast<int64_t>(tok[mt][0]) * a.ldx + kl);
          const uint4 c1 = mma::ld_act16(a.x_codes + static_cast<int64_t>(tok[mt][1]) * a.ldx + kl);
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const uint32_t w0 = word(c0, j), w1 = word(c1, j);
            const uint32_t af[4] = {mma::e4m3x2_to_f16x2(w0), mma::e4m3x2_to_f16x2(w1), mma::e4m3x2_hi_to_f16x2(w0),
                                    mma::e4m3x2_hi_to_f16x2(w1)};
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) mma::mma_f16(acc[mt][nt], af, bf[nt][j][0], bf[nt][j][1]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const float4 x0 = mma::ld_act_f4(a.x + static_cast<int64_t>(tok[mt][0]) * a.ldx + kl + 4 * j);
            const float4 x1 = mma::ld_act_f4(a.x + static_cast<int64_t>(tok[mt][1]) * a.ldx + kl + 4 * j);
            const uint32_t af[4] = {mma::f32x2_to_bf16x2(x0.x, x0.y), mma::f32x2_to_bf16x2(x1.x, x1.y),
                                    mma::f32x2_to_bf16x2(x0.z, x0.w), mma::f32x2_to_bf16x2(x1.z, x1.w)};
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) mma::mma_bf16(acc[mt][nt], af, bf[nt][j][0], bf[nt][j][1]);
          }
        }
      }
    }
    }  // !HALF

    // Refill the slot just read (its pieces are in registers, consumed by the mmas above) with the
    // stage S ahead; every iteration commits a group, empty or not, so the wait count stays S - 1.
    if (prod.w < a.total) {
      load_stage(prod, ring + slot_i * kStageBytes, lane);
      advance(a, prod);
    }
    mma::cp_async_commit();
    slot_i = slot_i + 1 == S ? 0 : slot_i + 1;

    if (st == cons.nst - 1) {
      // ---- end of the unit: back to real units, k-split sum in unit order, store ----
      // Accumulator (mt, nt, i): the general body's C is (call row mt * 16 + g [+ 8], weight row
      // nt * 8 + 2t [+ 1]); HALF's (acc[0][0] only) is (call row 2t [+ 1], weight row g [+ 8]).
      constexpr int kLiveNT = HALF ? 1 : kNT;
      auto call_row = [&](int mt, int i) -> int64_t {
        return HALF ? m0 + 2 * t + (i & 1) : m0 + mt * 16 + g + (i >= 2 ? 8 : 0);
      };
      auto weight_row = [&](int64_t row0, int nt, int i) -> int64_t {
        return HALF ? row0 + g + (i >= 2 ? 8 : 0) : row0 + nt * 8 + 2 * t + (i & 1);
      };
      if constexpr (kFp8W) {
        const float sw = mma::exp2i(last_ew - 127);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float sx[2] = {1.0f, 1.0f};  // prev_e[mt][.]: A rows g, g + 8 (HALF: C columns 2t, 2t + 1)
          if constexpr (KIND == Kind::kFp8Codes) {
#pragma unroll
            for (int u = 0; u < 2; ++u) sx[u] = mt < mt_act ? mma::exp2i(prev_e[mt][u] - last_ew - 127) : 1.0f;
          }
#pragma unroll
          for (int nt = 0; nt < kLiveNT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              float& v = acc[mt][nt][i];
              v = nan_scale ? __int_as_float(0x7fc00000) : (v * sw) * sx[HALF ? (i & 1) : (i >> 1)];
            }
        }
      }
      const int units = sg.units, tl = warp >> sg.units_log2;
      if (units > 1) {  // uniform over the CTA (one item at a time)
        if (unit > 0) {
          float* dst = red + static_cast<int64_t>((unit - 1) * sg.tpi + tl) * kPer * 32;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kLiveNT; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) dst[((mt * kNT + nt) * 4 + i) * 32 + lane] = acc[mt][nt][i];
        }
        __syncthreads();
        if (unit == 0) {
          for (int u = 1; u < units; ++u) {
            const float* src = red + static_cast<int64_t>((u - 1) * sg.tpi + tl) * kPer * 32;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int nt = 0; nt < kLiveNT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                  acc[mt][nt][i] = add_rn(acc[mt][nt][i], src[((mt * kNT + nt) * 4 + i) * 32 + lane]);
          }
        }
        __syncthreads();  // red is written again at the next item's end
      }
      if (unit == 0 && tile < sg.tiles) {
        const int64_t row0 = static_cast<int64_t>(tile) * kTileRows;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kLiveNT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int64_t token = call_row(mt, i), row = weight_row(row0, nt, i);
              if (token >= a.m || row >= sg.n) continue;
              float* yp = sg.y + token * sg.ldy + row;
              float v = acc[mt][nt][i];
              if (sg.accumulate) v = add_rn(*yp, v);
              *yp = sg.round_bf16 ? round_bf16(v) : v;
            }
      }
      if (tl_items < 5) timeline::mark(tlr, 5 + 2 * static_cast<int>(tl_items));
      ++tl_items;
      reset();
    }
    advance(a, cons);
  }
  mma::cp_async_wait(0);
  timeline::mark(tlr, 15);
  timeline::finish(tlr, tl_items);
}


// Host side: the KernelArgs, m-tile template and shared memory of a DecodeGemmArgs launch.
struct Plan {
  KernelArgs ka{};
  Kind kind = Kind::kFp8Codes;
  int mt = 1;           // m tiles per chunk: 1, 2, 3 or 6
  bool half = false;    // at most 8 rows: the HALF body (decode_gemv_body)
  size_t smem = 0;      // dynamic shared memory bytes
  int64_t grid = 0;     // CTAs (<= SMs)
};
Plan plan(const DecodeGemmArgs& a);
// Ring stages per warp and the dynamic shared memory of an `mt`-m-tile launch within `lim`.
size_t plan_smem(int mt, const DecodeLaunchLimits& lim, int* ring);
int units_for(Kind kind, int64_t n, int64_t k);

}  // namespace tandem::kernels::cuda::gemv
