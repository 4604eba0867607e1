// The dense prefill GEMMs on sm_90: warp-specialized, fed by TMA, persistent over the output tiles
// (tc_ws.cuh describes the roles and the stage ring). Two instantiations:
//  * block-scaled FP8: 128 x 128 tiles (one 128-row weight scale block per tile), K blocks of 128,
//    six stages of 32 KiB; each consumer warpgroup multiplies K blocks into two fresh partials in
//    turn (4 x wgmma.m64n128k32 each) and, while one block's MMAs run, releases the previous block's
//    stage and promotes its partial into the accumulator with that block's scales: the arithmetic of
//    tc::mainloop (acc = fma(partial, a_scale * w_scale, acc) in K order), so every back end gives
//    the same bits whenever the tensor cores sum a block exactly;
//  * bf16 (batched): 128 x 256 tiles, K blocks of 64, four stages of 48 KiB, 4 x wgmma.m64n256k16
//    per block straight into the accumulator, a stage released once the next block's MMAs are
//    issued (one group in flight).
#include "kernels/cuda/gemm_ws.h"

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/smem_bounds.h"
#include "kernels/cuda/tc_ws.cuh"
#include "kernels/cuda/tma.h"

namespace tandem::kernels::cuda {
namespace {

template <bool kFp8>
struct WsCfg;
template <>
struct WsCfg<true> {
  static constexpr int kBN = 128, kStages = 6, kKElems = 128, kAcc = 64;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};
template <>
struct WsCfg<false> {
  static constexpr int kBN = 256, kStages = 4, kKElems = 64, kAcc = 128;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};

// Shared memory (offsets from a 1024-byte aligned base): A tiles, B tiles, then the barriers.
template <bool kFp8>
struct WsSmem {
  using C = WsCfg<kFp8>;
  static constexpr int kATile = 128 * 128;       // 128 rows x 128 bytes of K
  static constexpr int kBTile = C::kBN * 128;    // kBN rows x 128 bytes of K
  static constexpr int kA = 0;
  static constexpr int kB = C::kStages * kATile;
  static constexpr int kFull = kB + C::kStages * kBTile;
  static constexpr int kEmpty = kFull + C::kStages * 8;
  static constexpr int kBytes = kEmpty + C::kStages * 8;
  static constexpr int kAlloc = kBytes + 1024;
};

struct WsDenseParams {
  CUtensorMap a;              // A: e4m3 codes [m, k] or bf16 x [m, ldx]; box 128 bytes of K x 128 rows, swizzled
  CUtensorMap b;              // W [rows, k] e4m3 / bf16; box 128 bytes of K x kBN rows, swizzled
  const float* a_scale;       // FP8: [k / 128, a_scale_ld]
  int64_t a_scale_ld;
  const uint8_t* w_scale;     // FP8: [ceil(n / 128), w_scale_ld] E8M0
  int64_t w_scale_ld;
  float* y;                   // [m, ldy]; batch b from column b * y_col_batch
  int64_t ldy, m, n;          // n: columns per batch
  int64_t y_col_batch;
  int nk;                     // K blocks (128 bytes each)
  int mt, nt, batch;          // row blocks, column blocks, batches
  int a_col_batch;            // batch b reads A columns from b * a_col_batch (elements)
  int w_row_batch;            // batch b reads W rows from b * w_row_batch
  bool accumulate, round;
};

// Consumer g's accumulator (ws::acc_row / acc_col) into y, as tc_gemm's epilogue: 8-byte stores of
// column pairs where y allows, y += first when accumulating, then the bf16 rounding when asked.
template <int kAcc>
__device__ __forceinline__ void ws_store(const float (&acc)[kAcc], const WsDenseParams& p, int b, int64_t m0,
                                         int64_t n0, int g, int w, int lane) {
  float* y = p.y + b * p.y_col_batch;
  const bool pairs = (p.ldy & 1) == 0 && (p.y_col_batch & 1) == 0 && (reinterpret_cast<uintptr_t>(p.y) & 7) == 0;
#pragma unroll
  for (int i = 0; i < kAcc; i += 2) {
    const int64_t r = m0 + 64 * g + ws::acc_row(i, w, lane), c = n0 + ws::acc_col(i, lane);
    if (r >= p.m) continue;
    float* yp = y + r * p.ldy + c;
    float v0 = acc[i], v1 = acc[i + 1];
    if (pairs && c + 1 < p.n) {
      if (p.accumulate) {
        const float2 old = *reinterpret_cast<const float2*>(yp);
        v0 = add_rn(old.x, v0);
        v1 = add_rn(old.y, v1);
      }
      *reinterpret_cast<float2*>(yp) = p.round ? make_float2(round_bf16(v0), round_bf16(v1)) : make_float2(v0, v1);
      continue;
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if (c + q >= p.n) continue;
      float v = q ? v1 : v0;
      if (p.accumulate) v = add_rn(yp[q], v);
      yp[q] = p.round ? round_bf16(v) : v;
    }
  }
}

// Consumer warpgroup g (0 or 1): rows [64 g, 64 g + 64) of every tile of this CTA.
template <bool kFp8>
__device__ __forceinline__ void ws_consume(const WsDenseParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                           int g) {
  using C = WsCfg<kFp8>;
  using L = WsSmem<kFp8>;
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int total = p.batch * p.mt * p.nt;
  ws::Ring<C::kStages> ring;
  float acc[C::kAcc];
  float part[kFp8 ? 64 : 1];
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    const ws::DenseTile d = ws::dense_tile(t, p.mt, p.nt);
    const int64_t m0 = static_cast<int64_t>(d.mb) * 128, n0 = static_cast<int64_t>(d.nb) * C::kBN;
    if constexpr (kFp8) {
      // This thread's two rows (h = 0, 1) of the promotion; rows past m read row m-1's scales.
      const int64_t r0 = m0 + 64 * g + ws::acc_row(0, w, lane);
      const float* as0 = p.a_scale + min(r0, p.m - 1);
      const float* as1 = p.a_scale + min(r0 + 8, p.m - 1);
      const uint8_t* wsc = p.w_scale + (n0 / 128) * p.w_scale_ld;
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
      // K block kb's MMAs go into one of two partials; while they run, the previous block's partial
      // is promoted (the same promotions in the same K order as one partial: the same bits).
      // Measured at 4,096 rows against promoting after each block's wait (bench-gemm, us): wq_a
      // 60 -> 53, wo_b 203 -> 193, shared_w1 108 -> 100, shared_w2 127 -> 122.
      float part2[64];
      float w_prev0 = 0.0f, w_prev1 = 0.0f;
      int prev = 0;
      auto issue = [&](float (&pp)[64]) {
        ws::mbar_wait(&full[ring.stage], ring.phase);
        __syncwarp();  // lanes may leave the wait loop apart: reconverge before the .aligned wgmma
        const uint32_t a0 = tc::smem_u32(smem + L::kA + ring.stage * L::kATile) + g * 64 * 128;
        const uint32_t b0 = tc::smem_u32(smem + L::kB + ring.stage * L::kBTile);
        tc::fence_regs(pp);
        tc::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          tc::wgmma_m64n128k32(pp, tc::sw128_desc(a0 + 32 * s), tc::sw128_desc(b0 + 32 * s), s);
        tc::wgmma_commit();
      };
      // The previous block's MMAs are done (after a wait): release its stage, then promote its
      // partial (both scales powers of two: the product and part * scale are exact).
      auto retire = [&](float (&pp)[64]) {
        tc::fence_regs(pp);
        if (lane == 0) ws::mbar_arrive(&empty[prev]);  // this warp is done with the stage
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = fmaf(pp[i], (i & 2) ? w_prev1 : w_prev0, acc[i]);
      };
      // K blocks in pairs, even ones into part and odd ones into part2.
      for (int kb = 0; kb < p.nk; kb += 2) {
        float sa0 = __ldg(as0 + kb * p.a_scale_ld), sa1 = __ldg(as1 + kb * p.a_scale_ld);
        float sb = num::e8m0_to_f32(__ldg(wsc + kb));
        issue(part);
        if (kb > 0) {
          ws::wgmma_wait<1>();
          retire(part2);
        }
        prev = ring.stage;
        ring.next();
        w_prev0 = sa0 * sb;
        w_prev1 = sa1 * sb;
        if (kb + 1 < p.nk) {
          sa0 = __ldg(as0 + (kb + 1) * p.a_scale_ld);
          sa1 = __ldg(as1 + (kb + 1) * p.a_scale_ld);
          sb = num::e8m0_to_f32(__ldg(wsc + kb + 1));
          issue(part2);
          ws::wgmma_wait<1>();
          retire(part);
          prev = ring.stage;
          ring.next();
          w_prev0 = sa0 * sb;
          w_prev1 = sa1 * sb;
        }
      }
      ws::wgmma_wait<0>();
      if (p.nk & 1) retire(part);
      else retire(part2);
    } else {
      int prev = 0;
      for (int kb = 0; kb < p.nk; ++kb) {
        ws::mbar_wait(&full[ring.stage], ring.phase);
        __syncwarp();  // lanes may leave the wait loop apart: reconverge before the .aligned wgmma
        const uint32_t a0 = tc::smem_u32(smem + L::kA + ring.stage * L::kATile) + g * 64 * 128;
        const uint32_t b0 = tc::smem_u32(smem + L::kB + ring.stage * L::kBTile);
        tc::fence_regs(acc);
        tc::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          ws::wgmma_m64n256k16_bf16(acc, tc::sw128_desc(a0 + 32 * s), tc::sw128_desc(b0 + 32 * s),
                                    (kb > 0 || s > 0) ? 1 : 0);
        tc::wgmma_commit();
        if (kb > 0) {
          ws::wgmma_wait<1>();  // the previous block's MMAs are done: release its stage
          if (lane == 0) ws::mbar_arrive(&empty[prev]);
        }
        prev = ring.stage;
        ring.next();
      }
      ws::wgmma_wait<0>();
      tc::fence_regs(acc);
      if (lane == 0) ws::mbar_arrive(&empty[prev]);
    }
    ws_store<C::kAcc>(acc, p, d.b, m0, n0, g, w, lane);
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(ws::kThreads, 1) ws_dense_kernel(const __grid_constant__ WsDenseParams p) {
#if !TANDEM_TC_WGMMA
  __trap();  // sm_90a only: never launched elsewhere (tc_resolve)
#endif
  using C = WsCfg<kFp8>;
  using L = WsSmem<kFp8>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = tc::align1024(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kFull);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      ws::mbar_init(&full[s], 1);
      ws::mbar_init(&empty[s], ws::kConsumerWarps);
    }
    ws::mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    ws::reg_dealloc<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      ws::tma_prefetch_map(&p.a);
      ws::tma_prefetch_map(&p.b);
      const int total = p.batch * p.mt * p.nt;
      ws::Ring<C::kStages> ring;
      for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const ws::DenseTile d = ws::dense_tile(t, p.mt, p.nt);
        const int a_col = d.b * p.a_col_batch, a_row = d.mb * 128;
        const int b_row = d.b * p.w_row_batch + d.nb * C::kBN;
        for (int kb = 0; kb < p.nk; ++kb) {
          ws::mbar_wait(&empty[ring.stage], ring.phase ^ 1u);
          ws::mbar_arrive_expect_tx(&full[ring.stage], L::kATile + L::kBTile);
          ws::tma_load_2d(smem + L::kA + ring.stage * L::kATile, &p.a, a_col + kb * C::kKElems, a_row,
                          &full[ring.stage]);
          ws::tma_load_2d(smem + L::kB + ring.stage * L::kBTile, &p.b, kb * C::kKElems, b_row, &full[ring.stage]);
          ring.next();
        }
      }
    }
  } else {
    ws::reg_alloc<C::kConsumerRegs>();
    ws_consume<kFp8>(p, smem, full, empty, (threadIdx.x >> 7) - 1);
  }
}

int ws_grid(int64_t tiles) {
  TANDEM_CHECK_MSG(tiles < (int64_t{1} << 31), "too many output tiles for one launch");
  return static_cast<int>(std::min<int64_t>(tiles, tc_sm_count()));
}

}  // namespace

void ws_init() {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(ws_dense_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         WsSmem<true>::kAlloc));
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(ws_dense_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         WsSmem<false>::kAlloc));
}

void fp8_gemm_ws(const Fp8GemmArgs& g, cudaStream_t s) {
  using C = WsCfg<true>;
  TmaTile2d ta;
  ta.base = g.a;
  ta.dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  ta.elem_bytes = 1;
  ta.cols = static_cast<uint64_t>(g.k);
  ta.rows = static_cast<uint64_t>(g.m);
  ta.row_stride_bytes = static_cast<uint64_t>(g.k);
  ta.box_cols = 128;
  ta.box_rows = 128;
  ta.swizzle128 = true;
  TmaTile2d tb = ta;
  tb.base = g.w;
  tb.rows = static_cast<uint64_t>(g.n);
  tb.box_rows = C::kBN;
  WsDenseParams p{};
  p.a = tma_encode(ta);
  p.b = tma_encode(tb);
  p.a_scale = g.a_scale;
  p.a_scale_ld = g.a_scale_ld;
  p.w_scale = g.w_scale;
  p.w_scale_ld = g.w_scale_ld > 0 ? g.w_scale_ld : g.k / 128;
  p.y = g.y;
  p.ldy = g.ldy > 0 ? g.ldy : g.n;
  p.m = g.m;
  p.n = g.n;
  p.y_col_batch = 0;
  p.nk = static_cast<int>(g.k / 128);
  p.mt = static_cast<int>((g.m + 127) / 128);
  p.nt = static_cast<int>((g.n + C::kBN - 1) / C::kBN);
  p.batch = 1;
  p.a_col_batch = 0;
  p.w_row_batch = 0;
  p.accumulate = g.accumulate;
  p.round = g.round_bf16;
  const int grid = ws_grid(static_cast<int64_t>(p.mt) * p.nt);
  ws_dense_kernel<true><<<grid, ws::kThreads, WsSmem<true>::kAlloc, s>>>(p);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void bf16_gemm_ws(const Bf16GemmArgs& g, cudaStream_t s) {
  using C = WsCfg<false>;
  const int64_t ldx = g.ldx > 0 ? g.ldx : g.k;
  const uint64_t w_rows =
      g.w_rows > 0 ? g.w_rows : static_cast<uint64_t>((g.batch - 1) * g.w_batch_rows + g.n);
  TmaTile2d ta;
  ta.base = g.x;
  ta.dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  ta.elem_bytes = 2;
  ta.cols = static_cast<uint64_t>(ldx);
  ta.rows = static_cast<uint64_t>(g.m);
  ta.row_stride_bytes = static_cast<uint64_t>(ldx) * 2;
  ta.box_cols = 64;
  ta.box_rows = 128;
  ta.swizzle128 = true;
  TmaTile2d tb = ta;
  tb.base = g.w;
  tb.cols = static_cast<uint64_t>(g.k);
  tb.rows = w_rows;
  tb.row_stride_bytes = static_cast<uint64_t>(g.k) * 2;
  tb.box_rows = C::kBN;
  TANDEM_CHECK_MSG(g.x_batch_stride * (g.batch - 1) < (int64_t{1} << 31) &&
                       g.w_batch_rows * (g.batch - 1) < (int64_t{1} << 31),
                   "batch offsets beyond the TMA coordinate range");
  WsDenseParams p{};
  p.a = tma_encode(ta);
  p.b = tma_encode(tb);
  p.a_scale = nullptr;
  p.w_scale = nullptr;
  p.y = g.y;
  p.ldy = g.ldy > 0 ? g.ldy : g.n;
  p.m = g.m;
  p.n = g.n;
  p.y_col_batch = g.batch > 1 ? g.y_batch_stride : 0;
  p.nk = static_cast<int>(g.k / 64);
  p.mt = static_cast<int>((g.m + 127) / 128);
  p.nt = static_cast<int>((g.n + C::kBN - 1) / C::kBN);
  p.batch = static_cast<int>(g.batch);
  p.a_col_batch = g.batch > 1 ? static_cast<int>(g.x_batch_stride) : 0;
  p.w_row_batch = g.batch > 1 ? static_cast<int>(g.w_batch_rows) : 0;
  p.accumulate = g.accumulate;
  p.round = g.round_bf16;
  const int grid = ws_grid(static_cast<int64_t>(p.batch) * p.mt * p.nt);
  ws_dense_kernel<false><<<grid, ws::kThreads, WsSmem<false>::kAlloc, s>>>(p);
  TANDEM_CUDA_LAUNCH_CHECK();
}

std::vector<SmemBound> gemm_ws_smem_bounds() {
  // TMA + wgmma with warp specialization: sm_90a only (a trap elsewhere; tc_resolve never picks it).
  return {{"ws_dense_kernel<true>", WsSmem<true>::kAlloc, "FP8, " + std::to_string(WsCfg<true>::kStages) + " stages",
           "", 0, {90}},
          {"ws_dense_kernel<false>", WsSmem<false>::kAlloc,
           "bf16, " + std::to_string(WsCfg<false>::kStages) + " stages", "", 0, {90}}};
}

}  // namespace tandem::kernels::cuda
