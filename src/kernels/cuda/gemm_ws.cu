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
// Each comes in three launch forms (TcBackend::kWgmmaWs, kWgmmaWsMc2, kWgmmaWsMc4): one CTA per tile
// as above, or thread-block clusters of kCm x kCn CTAs on adjacent tiles (row blocks kCm i' + i,
// column blocks kCn j' + j; 2 x 1 or 2 x 2) whose operand tiles are shared by TMA multicast: CTA
// (i, j) copies part j of its A tile (128 / kCn rows) into the stages of every CTA of its row (i, *)
// and part i of its weight tile (kBN / kCm rows) into every CTA of its column (*, j), one copy each.
// L2 -> shared bytes per K block: FP8 32 KiB -> 24 (2 x 1) or 16 (2 x 2); bf16 48 -> 32 or 24. A
// stage of CTA X is written by the CTAs of X's row and column, so it is released to each of them:
// every consumer warp arrives on the "empty" barrier of each CTA of its row and column (8 (kCm + kCn
// - 1) arrivals expected), and no copy engine overwrites a stage another CTA still reads. Every CTA
// of a cluster walks the same sequence of cluster tiles; a row or column block past the last one
// (odd mt or nt) loads the last one again (its operand parts stay in bounds for the peers that share
// them) and is computed but not stored. Every output is the same fixed K loop on the same operands
// in every form: the same bits.
#include "kernels/cuda/gemm_ws.h"

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/smem_bounds.h"
#include "kernels/cuda/tc_ws.cuh"
#include "kernels/cuda/tma.h"

namespace tandem::kernels::cuda {
namespace {

// The kernel's kinds: bf16, FP8 with 128 x 128 tiles, FP8 with 128 x 256 tiles (two 128-column
// halves, each multiplied into the one partial and promoted in turn: the same MMAs and promotion per
// output as 128 x 128, half the activation copies per FLOP).
enum WsKind : int { kBf16 = 0, kFp8N128 = 1, kFp8N256 = 2 };
template <int kKind>
struct WsCfg;
template <>
struct WsCfg<kFp8N128> {
  static constexpr bool kFp8 = true;
  static constexpr int kBN = 128, kStages = 6, kKElems = 128, kAcc = 64;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};
template <>
struct WsCfg<kFp8N256> {
  static constexpr bool kFp8 = true;
  static constexpr int kBN = 256, kStages = 4, kKElems = 128, kAcc = 128;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};
template <>
struct WsCfg<kBf16> {
  static constexpr bool kFp8 = false;
  static constexpr int kBN = 256, kStages = 4, kKElems = 64, kAcc = 128;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};

// Shared memory (offsets from a 1024-byte aligned base): A tiles, B tiles, then the barriers.
template <int kKind>
struct WsSmem {
  using C = WsCfg<kKind>;
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
  CUtensorMap a;              // A: e4m3 codes [m, k] or bf16 x [m, ldx]; box 128 bytes of K x 128 / kCn rows,
                              // swizzled
  CUtensorMap b;              // W [rows, k] e4m3 / bf16; box 128 bytes of K x kBN / kCm rows, swizzled
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
  int a_rows, w_rows;         // rows of the tensors in maps a and b (m; W's rows in all): the clusters'
                              // multicast parts start below them
  bool accumulate, round;
};

// A cluster of kCm x kCn CTAs (1 x 1: none): rank r = i + kCm j is row offset i, column offset j.
template <int kCm, int kCn>
struct WsCluster {
  static_assert((kCm == 1 || kCm == 2) && (kCn == 1 || kCn == 2), "clusters of 1 x 1, 2 x 1, 1 x 2 or 2 x 2 CTAs");
  static constexpr int kSize = kCm * kCn;
  // CTAs whose copies land in this CTA's stages (its row and column, itself once): the releases a
  // stage needs, per consumer warp.
  static constexpr int kWriters = kCm + kCn - 1;
  // Cluster ranks of row i / column j (multicast masks).
  static __device__ __forceinline__ uint16_t row_mask(int i) {
    return kCn == 1 ? 1u << i : (1u << i) | (1u << (i + kCm));
  }
  static __device__ __forceinline__ uint16_t col_mask(int j) {
    return kCm == 1 ? 1u << (kCm * j) : (1u << (kCm * j)) | (1u << (kCm * j + 1));
  }
};

// The tile of this CTA's step t: cluster tile t of ws::dense_tile over ceil(mt / kCm) x ceil(nt /
// kCn) blocks of kCm x kCn tiles, this CTA's (i, j) in it; a row or column block past the last one
// is the last one again, not stored (its operands stay in bounds, its result is discarded).
struct WsTile {
  int b, mb, nb;
  bool store;
};
template <int kCm, int kCn>
__device__ __forceinline__ int ws_steps(const WsDenseParams& p) {
  return p.batch * ((p.mt + kCm - 1) / kCm) * ((p.nt + kCn - 1) / kCn);
}
template <int kCm, int kCn>
__device__ __forceinline__ WsTile ws_tile(int t, const WsDenseParams& p, int ci, int cj) {
  if constexpr (kCm * kCn == 1) {
    const ws::DenseTile d = ws::dense_tile(t, p.mt, p.nt);
    return {d.b, d.mb, d.nb, true};
  } else {
    // Groups of 16 row blocks in flight as in the one-CTA form.
    const ws::DenseTile d = ws::dense_tile<16 / kCm>(t, (p.mt + kCm - 1) / kCm, (p.nt + kCn - 1) / kCn);
    const int mb = kCm * d.mb + ci, nb = kCn * d.nb + cj;
    return {d.b, min(mb, p.mt - 1), min(nb, p.nt - 1), mb < p.mt && nb < p.nt};
  }
}
// The first step and the stride of this CTA (clusters: per cluster; its CTAs take the same steps).
template <int kCm, int kCn>
__device__ __forceinline__ int ws_first_step() {
  if constexpr (kCm * kCn == 1) return blockIdx.x;
  else return static_cast<int>(ws::cluster_id_x());
}
template <int kCm, int kCn>
__device__ __forceinline__ int ws_step_stride() {
  if constexpr (kCm * kCn == 1) return gridDim.x;
  else return static_cast<int>(ws::cluster_count_x());
}
// A consumer warp's release of a stage: to its own CTA's producer, and in a cluster to every CTA of
// its row and column (their multicast copies wrote parts of the stage here and will write it again).
template <int kCm, int kCn>
__device__ __forceinline__ void ws_release(uint64_t* empty, int ci, int cj) {
  if constexpr (kCm * kCn == 1) {
    ws::mbar_arrive(empty);
  } else {
    for (int i = 0; i < kCm; ++i) ws::mbar_arrive_cluster(empty, i + kCm * cj);   // column cj (self included)
    for (int j = 0; j < kCn; ++j)
      if (j != cj) ws::mbar_arrive_cluster(empty, ci + kCm * j);                  // the rest of row ci
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
template <int kKind, int kCm, int kCn>
__device__ __forceinline__ void ws_consume(const WsDenseParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                           int g, int ci, int cj) {
  using C = WsCfg<kKind>;
  using L = WsSmem<kKind>;
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int total = ws_steps<kCm, kCn>(p);
  ws::Ring<C::kStages> ring;
  float acc[C::kAcc];
  float part[C::kFp8 ? 64 : 1];
  for (int t = ws_first_step<kCm, kCn>(); t < total; t += ws_step_stride<kCm, kCn>()) {
    const WsTile d = ws_tile<kCm, kCn>(t, p, ci, cj);
    const int64_t m0 = static_cast<int64_t>(d.mb) * 128, n0 = static_cast<int64_t>(d.nb) * C::kBN;
    if constexpr (C::kFp8) {
      // 128-column halves of the tile (one weight scale block each), multiplied and promoted in turn.
      constexpr int kHalves = C::kBN / 128;
      // This thread's two rows (h = 0, 1) of the promotion; rows past m read row m-1's scales.
      const int64_t r0 = m0 + 64 * g + ws::acc_row(0, w, lane);
      const float* as0 = p.a_scale + min(r0, p.m - 1);
      const float* as1 = p.a_scale + min(r0 + 8, p.m - 1);
      // A half wholly past n (256-wide tiles) reads the last scale row: never stored.
      const uint8_t* wsc[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) wsc[h] = p.w_scale + min(n0 / 128 + h, (p.n - 1) / 128) * p.w_scale_ld;
#pragma unroll
      for (int i = 0; i < C::kAcc; ++i) acc[i] = 0.0f;
      for (int kb = 0; kb < p.nk; ++kb) {
        const float sa0 = __ldg(as0 + kb * p.a_scale_ld), sa1 = __ldg(as1 + kb * p.a_scale_ld);
        float sb[kHalves];
#pragma unroll
        for (int h = 0; h < kHalves; ++h) sb[h] = num::e8m0_to_f32(__ldg(wsc[h] + kb));
        ws::mbar_wait(&full[ring.stage], ring.phase);
        __syncwarp();  // lanes may leave the wait loop apart: reconverge before the .aligned wgmma
        const uint32_t a0 = tc::smem_u32(smem + L::kA + ring.stage * L::kATile) + g * 64 * 128;
        const uint32_t b0 = tc::smem_u32(smem + L::kB + ring.stage * L::kBTile);
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          const uint32_t bh = b0 + h * 128 * 128;  // weight rows [128 h, 128 h + 128) of the tile
          tc::fence_regs(part);
          tc::wgmma_fence();
#pragma unroll
          for (int s = 0; s < 4; ++s)
            tc::wgmma_m64n128k32(part, tc::sw128_desc(a0 + 32 * s), tc::sw128_desc(bh + 32 * s), s);
          tc::wgmma_commit();
          ws::wgmma_wait<0>();
          tc::fence_regs(part);
          // After the last half's MMAs this warp is done with the stage.
          if (h == kHalves - 1 && lane == 0) ws_release<kCm, kCn>(&empty[ring.stage], ci, cj);
          // Promotion (both scales powers of two: the product and part * scale are exact).
          const float w0 = sa0 * sb[h], w1 = sa1 * sb[h];
#pragma unroll
          for (int i = 0; i < 64; ++i) acc[64 * h + i] = fmaf(part[i], (i & 2) ? w1 : w0, acc[64 * h + i]);
        }
        ring.next();
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
          if (lane == 0) ws_release<kCm, kCn>(&empty[prev], ci, cj);
        }
        prev = ring.stage;
        ring.next();
      }
      ws::wgmma_wait<0>();
      tc::fence_regs(acc);
      if (lane == 0) ws_release<kCm, kCn>(&empty[prev], ci, cj);
    }
    if (d.store) ws_store<C::kAcc>(acc, p, d.b, m0, n0, g, w, lane);
  }
}

// kCm x kCn = 1 x 1: one CTA per tile; else launched in clusters of kCm kCn CTAs along x (ws_launch),
// the operand tiles shared by multicast. Every thread reaches the end of the kernel: in a cluster the
// closing cluster barrier keeps each CTA's shared memory alive until the peers' last remote arrivals
// on its barriers are done (the peers' multicast copies into it completed earlier: this CTA's
// consumers waited for their bytes).
template <int kKind, int kCm, int kCn>
__global__ void __launch_bounds__(ws::kThreads, 1) ws_dense_kernel(const __grid_constant__ WsDenseParams p) {
#if !TANDEM_TC_WGMMA
  __trap();  // sm_90a only: never launched elsewhere (tc_resolve)
#endif
  using C = WsCfg<kKind>;
  using L = WsSmem<kKind>;
  using K = WsCluster<kCm, kCn>;
  constexpr int kAPart = L::kATile / kCn, kBPart = L::kBTile / kCm;  // bytes of the tiles this CTA copies
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = tc::align1024(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kFull);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);
  const int rank = K::kSize == 1 ? 0 : static_cast<int>(ws::cluster_rank());
  const int ci = rank % kCm, cj = rank / kCm;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      ws::mbar_init(&full[s], 1);
      ws::mbar_init(&empty[s], ws::kConsumerWarps * K::kWriters);
    }
    ws::mbar_fence_init();
  }
  // In a cluster the peers' first multicast copies and releases target these barriers.
  if constexpr (K::kSize == 1) __syncthreads();
  else ws::cluster_sync();
  if (threadIdx.x < 128) {
    ws::reg_dealloc<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      ws::tma_prefetch_map(&p.a);
      ws::tma_prefetch_map(&p.b);
      const int total = ws_steps<kCm, kCn>(p);
      ws::Ring<C::kStages> ring;
      for (int t = ws_first_step<kCm, kCn>(); t < total; t += ws_step_stride<kCm, kCn>()) {
        const WsTile d = ws_tile<kCm, kCn>(t, p, ci, cj);
        const int a_col = d.b * p.a_col_batch, a_row = d.mb * 128;
        const int b_row = d.b * p.w_row_batch + d.nb * C::kBN;
        // This CTA's parts; a part wholly past the rows of its tensor (rows past m or columns past n
        // only, never stored) reads the tensor's last rows instead, so no box lies wholly outside it.
        const int a_part_row = min(a_row + cj * (128 / kCn), p.a_rows - 1);
        const int b_part_row = min(b_row + ci * (C::kBN / kCm), p.w_rows - 1);
        for (int kb = 0; kb < p.nk; ++kb) {
          ws::mbar_wait(&empty[ring.stage], ring.phase ^ 1u);
          // Every part of both tiles lands on this barrier (this CTA's copies and the peers').
          ws::mbar_arrive_expect_tx(&full[ring.stage], L::kATile + L::kBTile);
          uint8_t* a_dst = smem + L::kA + ring.stage * L::kATile;
          uint8_t* b_dst = smem + L::kB + ring.stage * L::kBTile;
          if constexpr (kCn == 1)
            ws::tma_load_2d(a_dst, &p.a, a_col + kb * C::kKElems, a_row, &full[ring.stage]);
          else
            ws::tma_load_2d_multicast(a_dst + cj * kAPart, &p.a, a_col + kb * C::kKElems, a_part_row,
                                      &full[ring.stage], K::row_mask(ci));
          if constexpr (kCm == 1)
            ws::tma_load_2d(b_dst, &p.b, kb * C::kKElems, b_row, &full[ring.stage]);
          else
            ws::tma_load_2d_multicast(b_dst + ci * kBPart, &p.b, kb * C::kKElems, b_part_row, &full[ring.stage],
                                      K::col_mask(cj));
          ring.next();
        }
      }
    }
  } else {
    ws::reg_alloc<C::kConsumerRegs>();
    ws_consume<kKind, kCm, kCn>(p, smem, full, empty, (threadIdx.x >> 7) - 1, ci, cj);
  }
  if constexpr (K::kSize > 1) ws::cluster_sync();
}

// A kernel form: kind and cluster size (1: 1 x 1, 2: 2 x 1, 4: 2 x 2).
template <int kKind, int kSize>
constexpr auto ws_kernel() {
  static_assert(kSize == 1 || kSize == 2 || kSize == 4, "cluster sizes 1, 2, 4");
  if constexpr (kSize == 1) return ws_dense_kernel<kKind, 1, 1>;
  else if constexpr (kSize == 2) return ws_dense_kernel<kKind, 2, 1>;
  else return ws_dense_kernel<kKind, 2, 2>;
}
constexpr int ws_cm(int size) { return size == 1 ? 1 : 2; }  // CTAs along M (sharing the weight tile)
constexpr int ws_cn(int size) { return size == 4 ? 2 : 1; }  // CTAs along N (sharing the A tile)

int ws_kind(bool fp8, bool wide) { return !fp8 ? kBf16 : wide ? kFp8N256 : kFp8N128; }
int ws_bn(int kind) { return kind == kFp8N128 ? WsCfg<kFp8N128>::kBN : WsCfg<kBf16>::kBN; }

cudaLaunchConfig_t ws_cluster_config(int ctas, int size, int smem, cudaStream_t s, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(ws::kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = s;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(size);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clusters the device runs at once with each cluster form (0: it launches none), per device, read
// once (ws_init: start-up, outside graph capture). [kind][0]: clusters of 2, [kind][1]: of 4 (the
// 256-wide FP8 kernel has clusters of 2 only).
struct WsClusterFacts {
  std::once_flag once;
  int at_once[3][2] = {};
};
WsClusterFacts g_cluster_facts[64];

template <int kKind, int kSize>
int query_clusters(int sm_count) {
  const void* k = reinterpret_cast<const void*>(ws_kernel<kKind, kSize>());
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, WsSmem<kKind>::kAlloc) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg =
      ws_cluster_config(kSize * std::max(sm_count / kSize, 1), kSize, WsSmem<kKind>::kAlloc, nullptr, attr);
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
    f.at_once[kFp8N128][0] = query_clusters<kFp8N128, 2>(sms);
    f.at_once[kFp8N128][1] = query_clusters<kFp8N128, 4>(sms);
    f.at_once[kFp8N256][0] = query_clusters<kFp8N256, 2>(sms);
    f.at_once[kBf16][0] = query_clusters<kBf16, 2>(sms);
    f.at_once[kBf16][1] = query_clusters<kBf16, 4>(sms);
  });
  return f;
}

int max_clusters(int kind, int size) {
  const WsClusterFacts& f = cluster_facts();
  return size == 2 ? f.at_once[kind][0] : size == 4 ? f.at_once[kind][1] : 0;
}

// One launch of the kernel of cluster size kSize: one CTA per SM at most (kSize 1), or as many
// clusters as the device holds at once, at most one per cluster tile.
template <int kKind, int kSize>
void ws_launch_form(const WsDenseParams& p, cudaStream_t s) {
  constexpr int kCm = ws_cm(kSize), kCn = ws_cn(kSize);
  const int64_t steps =
      static_cast<int64_t>(p.batch) * ((p.mt + kCm - 1) / kCm) * ((p.nt + kCn - 1) / kCn);
  TANDEM_CHECK_MSG(steps < (int64_t{1} << 31), "too many output tiles for one launch");
  if constexpr (kSize == 1) {
    const int grid = static_cast<int>(std::min<int64_t>(steps, tc_sm_count()));
    ws_dense_kernel<kKind, 1, 1><<<grid, ws::kThreads, WsSmem<kKind>::kAlloc, s>>>(p);
    TANDEM_CUDA_LAUNCH_CHECK();
  } else {
    const int most = max_clusters(kKind, kSize);
    TANDEM_CHECK_MSG(most > 0, "the device runs no cluster of this ws kernel (tc_resolve refuses it)");
    const int clusters = static_cast<int>(std::min<int64_t>(steps, most));
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = ws_cluster_config(kSize * clusters, kSize, WsSmem<kKind>::kAlloc, s, attr);
    TANDEM_CUDA_CHECK(cudaLaunchKernelEx(&cfg, ws_kernel<kKind, kSize>(), p));
  }
}

// The form's launch (the 256-wide FP8 kernel: clusters of 2 only).
void ws_launch(const WsDenseParams& p, int kind, int cluster, cudaStream_t s) {
  if (kind == kFp8N256) {
    TANDEM_CHECK_MSG(cluster == 2, "the 256-wide FP8 kernel runs in clusters of 2");
    ws_launch_form<kFp8N256, 2>(p, s);
  } else if (kind == kFp8N128) {
    if (cluster == 1) ws_launch_form<kFp8N128, 1>(p, s);
    else if (cluster == 2) ws_launch_form<kFp8N128, 2>(p, s);
    else ws_launch_form<kFp8N128, 4>(p, s);
  } else {
    if (cluster == 1) ws_launch_form<kBf16, 1>(p, s);
    else if (cluster == 2) ws_launch_form<kBf16, 2>(p, s);
    else ws_launch_form<kBf16, 4>(p, s);
  }
}

bool form_valid(WsForm f) { return (f.cluster == 1 || f.cluster == 2 || f.cluster == 4) && (!f.wide || f.cluster == 2); }

}  // namespace

void ws_init() {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(ws_dense_kernel<kFp8N128, 1, 1>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, WsSmem<kFp8N128>::kAlloc));
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(ws_dense_kernel<kBf16, 1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         WsSmem<kBf16>::kAlloc));
  (void)cluster_facts();  // sets the cluster kernels' limits and counts their clusters
}

int ws_max_clusters(bool fp8, WsForm f) {
  return form_valid(f) && f.cluster > 1 ? max_clusters(ws_kind(fp8, f.wide), f.cluster) : 0;
}

bool ws_form_available(WsForm f) {
  if (!form_valid(f)) return false;
  if (f.cluster == 1) return true;
  return ws_max_clusters(true, f) > 0 && ws_max_clusters(false, f) > 0;
}

WsForm ws_form_for_shape(bool fp8, WsForm asked, int64_t m, int64_t n, int64_t batch) {
  TANDEM_CHECK(form_valid(asked));
  // Time of a launch ~ rounds of the persistent grid x columns per tile (K is the same for all).
  const auto cost = [&](WsForm f) -> int64_t {
    const int kind = ws_kind(fp8, f.wide);
    const int64_t bn = ws_bn(kind), mt = (m + 127) / 128, nt = (n + bn - 1) / bn;
    const int64_t cm = ws_cm(f.cluster), cn = ws_cn(f.cluster);
    const int64_t steps = batch * ((mt + cm - 1) / cm) * ((nt + cn - 1) / cn);
    const int64_t at_once = f.cluster == 1 ? tc_sm_count() : max_clusters(kind, f.cluster);
    return at_once > 0 ? (steps + at_once - 1) / at_once * bn : INT64_MAX;
  };
  const WsForm alone{1, false};
  const int64_t limit = cost(alone);
  if (fp8 && asked.wide) {
    if (cost(asked) <= limit) return asked;
    asked = WsForm{2, false};
  }
  for (WsForm f{asked.cluster, false}; f.cluster > 1; f.cluster /= 2)
    if (cost(f) <= limit) return f;
  return alone;
}

void fp8_gemm_ws(const Fp8GemmArgs& g, WsForm f, cudaStream_t s) {
  TANDEM_CHECK(form_valid(f));
  const int kind = ws_kind(true, f.wide), cluster = f.cluster;
  const int bn = ws_bn(kind);
  TmaTile2d ta;
  ta.base = g.a;
  ta.dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  ta.elem_bytes = 1;
  ta.cols = static_cast<uint64_t>(g.k);
  ta.rows = static_cast<uint64_t>(g.m);
  ta.row_stride_bytes = static_cast<uint64_t>(g.k);
  ta.box_cols = 128;
  ta.box_rows = 128 / static_cast<uint32_t>(ws_cn(cluster));
  ta.swizzle128 = true;
  TmaTile2d tb = ta;
  tb.base = g.w;
  tb.rows = static_cast<uint64_t>(g.n);
  tb.box_rows = static_cast<uint32_t>(bn / ws_cm(cluster));
  TANDEM_CHECK_MSG(g.m < (int64_t{1} << 31) && g.n < (int64_t{1} << 31), "rows beyond the TMA coordinate range");
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
  p.nt = static_cast<int>((g.n + bn - 1) / bn);
  p.batch = 1;
  p.a_col_batch = 0;
  p.w_row_batch = 0;
  p.a_rows = static_cast<int>(g.m);
  p.w_rows = static_cast<int>(g.n);
  p.accumulate = g.accumulate;
  p.round = g.round_bf16;
  ws_launch(p, kind, cluster, s);
}

void bf16_gemm_ws(const Bf16GemmArgs& g, int cluster, cudaStream_t s) {
  using C = WsCfg<kBf16>;
  TANDEM_CHECK(cluster == 1 || cluster == 2 || cluster == 4);
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
  ta.box_rows = 128 / static_cast<uint32_t>(ws_cn(cluster));
  ta.swizzle128 = true;
  TmaTile2d tb = ta;
  tb.base = g.w;
  tb.cols = static_cast<uint64_t>(g.k);
  tb.rows = w_rows;
  tb.row_stride_bytes = static_cast<uint64_t>(g.k) * 2;
  tb.box_rows = C::kBN / static_cast<uint32_t>(ws_cm(cluster));
  TANDEM_CHECK_MSG(g.x_batch_stride * (g.batch - 1) < (int64_t{1} << 31) &&
                       g.w_batch_rows * (g.batch - 1) < (int64_t{1} << 31) && w_rows < (uint64_t{1} << 31) &&
                       g.m < (int64_t{1} << 31),
                   "batch offsets or rows beyond the TMA coordinate range");
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
  p.a_rows = static_cast<int>(g.m);
  p.w_rows = static_cast<int>(w_rows);
  p.accumulate = g.accumulate;
  p.round = g.round_bf16;
  ws_launch(p, kBf16, cluster, s);
}

std::vector<SmemBound> gemm_ws_smem_bounds() {
  // TMA + wgmma with warp specialization: sm_90a only (a trap elsewhere; tc_resolve never picks it).
  // The cluster forms take the same shared memory per CTA. Kinds as the demangler spells them:
  // 0 bf16, 1 FP8 128-wide, 2 FP8 256-wide.
  std::vector<SmemBound> b;
  for (const char* shape : {"1, 1", "2, 1", "2, 2"}) {
    b.push_back({std::string("ws_dense_kernel<1, ") + shape + ">", WsSmem<kFp8N128>::kAlloc,
                 "FP8, " + std::to_string(WsCfg<kFp8N128>::kStages) + " stages", "", 0, {90}});
    b.push_back({std::string("ws_dense_kernel<0, ") + shape + ">", WsSmem<kBf16>::kAlloc,
                 "bf16, " + std::to_string(WsCfg<kBf16>::kStages) + " stages", "", 0, {90}});
  }
  b.push_back({"ws_dense_kernel<2, 2, 1>", WsSmem<kFp8N256>::kAlloc,
               "FP8 256-wide, " + std::to_string(WsCfg<kFp8N256>::kStages) + " stages", "", 0, {90}});
  return b;
}

}  // namespace tandem::kernels::cuda
