// The dense prefill GEMMs on sm_90: warp-specialized, fed by TMA, persistent over the output tiles
// (tc_ws.cuh describes the roles and the stage ring). Two instantiations:
//  * block-scaled FP8: 128 x 128 tiles (one 128-row weight scale block per tile), K blocks of 128,
//    six stages of 32 KiB; each consumer warpgroup multiplies a K block into a fresh partial
//    (4 x wgmma.m64n128k32), releases the stage, then promotes the partial into its accumulator with
//    the block's scales while the other warpgroup's MMAs run: the arithmetic of tc::mainloop
//    (acc = fma(partial, a_scale * w_scale, acc) in K order), so every back end gives the same bits
//    whenever the tensor cores sum a block exactly;
//  * bf16 (batched): 128 x 256 tiles, K blocks of 64, four stages of 48 KiB, 4 x wgmma.m64n256k16
//    per block straight into the accumulator, a stage released once the next block's MMAs are
//    issued (one group in flight).
// Each comes in two launch forms (TcBackend::kWgmmaWs / kWgmmaWsMc): one CTA per tile as above, or
// clusters of two CTAs on row blocks 2j and 2j + 1 of the same column block, each CTA copying half of
// the shared weight tile into both CTAs' stages with one multicast copy (TMA multicast): L2 -> shared
// traffic per K block 32 -> 24 KiB (FP8) and 48 -> 32 KiB (bf16). A stage is then released by both
// CTAs' consumer warps (16 arrivals, 8 of them remote), so neither copy engine overwrites a stage the
// other CTA still reads. Both CTAs walk the same pair-tile sequence; an odd last row block gives the
// second CTA a copy of the first's rows, computed and not stored. Every output is the same fixed K
// loop on the same operands either way: the same bits.
#include "kernels/cuda/gemm_ws.h"

#include <algorithm>
#include <mutex>

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
  int w_rows;                 // rows of W in the map b (the multicast halves' coordinates stay below it)
  bool accumulate, round;
};

// The tile of this CTA's step t: kMc = 1, tile t of ws::dense_tile; kMc = 2, pair tile t (row blocks
// 2j, 2j + 1 of one column block), this CTA's row block 2j + rank; past the last row block (odd mt)
// the last one again, not stored (its operands stay in bounds, its result is discarded).
struct WsTile {
  int b, mb, nb;
  bool store;
};
template <int kMc>
__device__ __forceinline__ int ws_steps(const WsDenseParams& p) {
  return p.batch * ((p.mt + kMc - 1) / kMc) * p.nt;
}
template <int kMc>
__device__ __forceinline__ WsTile ws_tile(int t, const WsDenseParams& p, int rank) {
  if constexpr (kMc == 1) {
    const ws::DenseTile d = ws::dense_tile(t, p.mt, p.nt);
    return {d.b, d.mb, d.nb, true};
  } else {
    const ws::DenseTile d = ws::dense_tile<8>(t, (p.mt + 1) / 2, p.nt);
    const int mb = 2 * d.mb + rank;
    return {d.b, min(mb, p.mt - 1), d.nb, mb < p.mt};
  }
}
// The first step and the stride of this CTA (kMc = 2: per cluster; both CTAs take the same steps).
template <int kMc>
__device__ __forceinline__ int ws_first_step() {
  if constexpr (kMc == 1) return blockIdx.x;
  else return static_cast<int>(ws::cluster_id_x());
}
template <int kMc>
__device__ __forceinline__ int ws_step_stride() {
  if constexpr (kMc == 1) return gridDim.x;
  else return static_cast<int>(ws::cluster_count_x());
}
// A consumer warp's release of a stage: to its own CTA's producer, and with kMc = 2 to the peer's too
// (whose multicast wrote half of the stage here and will write it again).
template <int kMc>
__device__ __forceinline__ void ws_release(uint64_t* empty) {
  if constexpr (kMc == 1) {
    ws::mbar_arrive(empty);
  } else {
    ws::mbar_arrive_cluster(empty, 0);
    ws::mbar_arrive_cluster(empty, 1);
  }
}

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
template <bool kFp8, int kMc>
__device__ __forceinline__ void ws_consume(const WsDenseParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                           int g, int rank) {
  using C = WsCfg<kFp8>;
  using L = WsSmem<kFp8>;
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int total = ws_steps<kMc>(p);
  ws::Ring<C::kStages> ring;
  float acc[C::kAcc];
  float part[kFp8 ? 64 : 1];
  for (int t = ws_first_step<kMc>(); t < total; t += ws_step_stride<kMc>()) {
    const WsTile d = ws_tile<kMc>(t, p, rank);
    const int64_t m0 = static_cast<int64_t>(d.mb) * 128, n0 = static_cast<int64_t>(d.nb) * C::kBN;
    if constexpr (kFp8) {
      // This thread's two rows (h = 0, 1) of the promotion; rows past m read row m-1's scales.
      const int64_t r0 = m0 + 64 * g + ws::acc_row(0, w, lane);
      const float* as0 = p.a_scale + min(r0, p.m - 1);
      const float* as1 = p.a_scale + min(r0 + 8, p.m - 1);
      const uint8_t* wsc = p.w_scale + (n0 / 128) * p.w_scale_ld;
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
      for (int kb = 0; kb < p.nk; ++kb) {
        const float sa0 = __ldg(as0 + kb * p.a_scale_ld), sa1 = __ldg(as1 + kb * p.a_scale_ld);
        const float sb = num::e8m0_to_f32(__ldg(wsc + kb));
        ws::mbar_wait(&full[ring.stage], ring.phase);
        __syncwarp();  // lanes may leave the wait loop apart: reconverge before the .aligned wgmma
        const uint32_t a0 = tc::smem_u32(smem + L::kA + ring.stage * L::kATile) + g * 64 * 128;
        const uint32_t b0 = tc::smem_u32(smem + L::kB + ring.stage * L::kBTile);
        tc::fence_regs(part);
        tc::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
          tc::wgmma_m64n128k32(part, tc::sw128_desc(a0 + 32 * s), tc::sw128_desc(b0 + 32 * s), s);
        tc::wgmma_commit();
        ws::wgmma_wait<0>();
        tc::fence_regs(part);
        if (lane == 0) ws_release<kMc>(&empty[ring.stage]);  // this warp is done with the stage
        ring.next();
        // Promotion (both scales powers of two: the product and part * scale are exact).
        const float w0 = sa0 * sb, w1 = sa1 * sb;
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = fmaf(part[i], (i & 2) ? w1 : w0, acc[i]);
      }
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
          if (lane == 0) ws_release<kMc>(&empty[prev]);
        }
        prev = ring.stage;
        ring.next();
      }
      ws::wgmma_wait<0>();
      tc::fence_regs(acc);
      if (lane == 0) ws_release<kMc>(&empty[prev]);
    }
    if (d.store) ws_store<C::kAcc>(acc, p, d.b, m0, n0, g, w, lane);
  }
}

// kMc = 1: one CTA per tile; kMc = 2: launched in clusters of 2 along x (ws_launch), the weight tile
// shared by multicast. Every thread reaches the end of the kernel: with kMc = 2 the closing cluster
// barrier keeps each CTA's shared memory alive until the peer's last remote arrivals are done (the
// peer's multicast copies into it completed earlier: this CTA's consumers waited for their bytes).
template <bool kFp8, int kMc>
__global__ void __launch_bounds__(ws::kThreads, 1) ws_dense_kernel(const __grid_constant__ WsDenseParams p) {
#if !TANDEM_TC_WGMMA
  __trap();  // sm_90a only: never launched elsewhere (tc_resolve)
#endif
  static_assert(kMc == 1 || kMc == 2, "clusters of one or two CTAs");
  using C = WsCfg<kFp8>;
  using L = WsSmem<kFp8>;
  constexpr int kBHalf = L::kBTile / kMc;  // bytes of the weight tile this CTA copies (C::kBN / kMc rows)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = tc::align1024(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kFull);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);
  const int rank = kMc == 1 ? 0 : static_cast<int>(ws::cluster_rank());
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      ws::mbar_init(&full[s], 1);
      ws::mbar_init(&empty[s], ws::kConsumerWarps * kMc);
    }
    ws::mbar_fence_init();
  }
  // kMc = 2: the peer's first multicast copies and releases target these barriers.
  if constexpr (kMc == 1) __syncthreads();
  else ws::cluster_sync();
  if (threadIdx.x < 128) {
    ws::reg_dealloc<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      ws::tma_prefetch_map(&p.a);
      ws::tma_prefetch_map(&p.b);
      const int total = ws_steps<kMc>(p);
      ws::Ring<C::kStages> ring;
      for (int t = ws_first_step<kMc>(); t < total; t += ws_step_stride<kMc>()) {
        const WsTile d = ws_tile<kMc>(t, p, rank);
        const int a_col = d.b * p.a_col_batch, a_row = d.mb * 128;
        const int b_row = d.b * p.w_row_batch + d.nb * C::kBN;
        for (int kb = 0; kb < p.nk; ++kb) {
          ws::mbar_wait(&empty[ring.stage], ring.phase ^ 1u);
          // Both halves of the weight tile land on this barrier (this CTA's copy and the peer's).
          ws::mbar_arrive_expect_tx(&full[ring.stage], L::kATile + L::kBTile);
          ws::tma_load_2d(smem + L::kA + ring.stage * L::kATile, &p.a, a_col + kb * C::kKElems, a_row,
                          &full[ring.stage]);
          uint8_t* b_dst = smem + L::kB + ring.stage * L::kBTile;
          if constexpr (kMc == 1)
            ws::tma_load_2d(b_dst, &p.b, kb * C::kKElems, b_row, &full[ring.stage]);
          else  // this CTA's half; one wholly past W's rows (columns past n only, never stored) reads W's
                // last rows instead, so no box lies wholly outside the tensor
            ws::tma_load_2d_multicast(b_dst + rank * kBHalf, &p.b, kb * C::kKElems,
                                      min(b_row + rank * (C::kBN / kMc), p.w_rows - 1), &full[ring.stage], 0x3);
          ring.next();
        }
      }
    }
  } else {
    ws::reg_alloc<C::kConsumerRegs>();
    ws_consume<kFp8, kMc>(p, smem, full, empty, (threadIdx.x >> 7) - 1, rank);
  }
  if constexpr (kMc == 2) ws::cluster_sync();
}

// Clusters of two the device runs at once with each kernel (0: no cluster launch), per device, read
// once (ws_init: start-up, outside graph capture).
struct WsClusterFacts {
  std::once_flag once;
  int fp8 = 0, bf16 = 0;
};
WsClusterFacts g_cluster_facts[64];

template <bool kFp8>
int query_clusters(int sm_count) {
  const void* k = reinterpret_cast<const void*>(ws_dense_kernel<kFp8, 2>);
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, WsSmem<kFp8>::kAlloc) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(2 * std::max(sm_count / 2, 1)));
  cfg.blockDim = dim3(ws::kThreads);
  cfg.dynamicSmemBytes = WsSmem<kFp8>::kAlloc;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, k, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}

const WsClusterFacts& cluster_facts() {
  int dev = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CHECK(dev >= 0 && dev < 64);
  WsClusterFacts& f = g_cluster_facts[dev];
  std::call_once(f.once, [&f] {
    const int sms = tc_sm_count();
    f.fp8 = query_clusters<true>(sms);
    f.bf16 = query_clusters<false>(sms);
  });
  return f;
}

int ws_grid(int64_t tiles) {
  TANDEM_CHECK_MSG(tiles < (int64_t{1} << 31), "too many output tiles for one launch");
  return static_cast<int>(std::min<int64_t>(tiles, tc_sm_count()));
}

// One launch of the kMc = 1 kernel (a CTA per SM at most) or of the kMc = 2 kernel in clusters of
// two (as many clusters as the device holds at once, at most one per pair tile).
template <bool kFp8>
void ws_launch(const WsDenseParams& p, bool multicast, cudaStream_t s) {
  if (!multicast) {
    const int grid = ws_grid(static_cast<int64_t>(p.batch) * p.mt * p.nt);
    ws_dense_kernel<kFp8, 1><<<grid, ws::kThreads, WsSmem<kFp8>::kAlloc, s>>>(p);
    TANDEM_CUDA_LAUNCH_CHECK();
    return;
  }
  const int max_clusters = kFp8 ? cluster_facts().fp8 : cluster_facts().bf16;
  TANDEM_CHECK_MSG(max_clusters > 0, "the device runs no 2-CTA cluster of the ws kernels (tc_resolve refuses it)");
  const int64_t pairs = static_cast<int64_t>(p.batch) * ((p.mt + 1) / 2) * p.nt;
  TANDEM_CHECK_MSG(pairs < (int64_t{1} << 31), "too many output tiles for one launch");
  const int clusters = static_cast<int>(std::min<int64_t>(pairs, max_clusters));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(2 * clusters));
  cfg.blockDim = dim3(ws::kThreads);
  cfg.dynamicSmemBytes = WsSmem<kFp8>::kAlloc;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, ws_dense_kernel<kFp8, 2>, p));
}

}  // namespace

void ws_init() {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(ws_dense_kernel<true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         WsSmem<true>::kAlloc));
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(ws_dense_kernel<false, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         WsSmem<false>::kAlloc));
  (void)cluster_facts();  // sets the kMc = 2 kernels' limits and counts their clusters
}

bool ws_multicast_available() {
  const WsClusterFacts& f = cluster_facts();
  return f.fp8 > 0 && f.bf16 > 0;
}

int ws_multicast_clusters(bool fp8) { return fp8 ? cluster_facts().fp8 : cluster_facts().bf16; }

void fp8_gemm_ws(const Fp8GemmArgs& g, bool multicast, cudaStream_t s) {
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
  tb.box_rows = multicast ? C::kBN / 2 : C::kBN;
  TANDEM_CHECK_MSG(g.n < (int64_t{1} << 31), "W rows beyond the TMA coordinate range");
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
  p.w_rows = static_cast<int>(g.n);
  p.accumulate = g.accumulate;
  p.round = g.round_bf16;
  ws_launch<true>(p, multicast, s);
}

void bf16_gemm_ws(const Bf16GemmArgs& g, bool multicast, cudaStream_t s) {
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
  tb.box_rows = multicast ? C::kBN / 2 : C::kBN;
  TANDEM_CHECK_MSG(g.x_batch_stride * (g.batch - 1) < (int64_t{1} << 31) &&
                       g.w_batch_rows * (g.batch - 1) < (int64_t{1} << 31) && w_rows < (uint64_t{1} << 31),
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
  p.w_rows = static_cast<int>(w_rows);
  p.accumulate = g.accumulate;
  p.round = g.round_bf16;
  ws_launch<false>(p, multicast, s);
}

std::vector<SmemBound> gemm_ws_smem_bounds() {
  // TMA + wgmma with warp specialization: sm_90a only (a trap elsewhere; tc_resolve never picks it).
  // The 2-CTA cluster forms (kMc = 2) take the same shared memory per CTA.
  std::vector<SmemBound> b;
  for (const char* mc : {"1", "2"}) {
    b.push_back({std::string("ws_dense_kernel<true, ") + mc + ">", WsSmem<true>::kAlloc,
                 "FP8, " + std::to_string(WsCfg<true>::kStages) + " stages", "", 0, {90}});
    b.push_back({std::string("ws_dense_kernel<false, ") + mc + ">", WsSmem<false>::kAlloc,
                 "bf16, " + std::to_string(WsCfg<false>::kStages) + " stages", "", 0, {90}});
  }
  return b;
}

}  // namespace tandem::kernels::cuda
