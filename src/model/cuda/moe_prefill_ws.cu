// Grouped MXFP4 expert GEMMs on sm_90 (moe_prefill_ws.h), warp-specialized as kernels/cuda/
// tc_ws.cuh describes, persistent over (tile of 128 sorted slots, column block):
//  * two producer warpgroups, 256 converters (8 warps, two per SM sub-partition): the raw weights
//    of each K block into the e4m3 B tile (tc::mxfp4_group_to_e4m3: each row's four 32-element
//    groups scaled to the row's K-block reference exponent, 2^(ref - 127) kept as the column
//    scale), then a third mbarrier per stage; thread 0 also issues, kLead K blocks ahead, the TMA
//    copies of the A tile (128 slots x 128 e4m3 codes) and of the raw e2m1 weights (128 weight rows
//    x 64 bytes; up: 64 rows of w1 and 64 of w3). The conversion (~60 integer instructions per 32
//    weights) was this kernel's bound with three converter warps, one per sub-partition
//    (PERFORMANCE.md: ~2,100 cycles per K block against ~520 of FP8 MMA);
//  * two consumer warpgroups: 4 x wgmma.m64n128k32 per K block into a partial, promoted with the
//    slot's activation scale times the column scale, as tc::mainloop does (the same bits wherever
//    the tensor cores sum a block exactly).
// Up: tile columns interleave w1 and w3 rows in chunks of 8 so a thread holds g and u of one
// intermediate column (SwiGLU in the epilogue into bf16 act rows per slot); down: 128 w2 rows,
// bf16 values into pair_out rows.
#include "model/cuda/moe_prefill_ws.h"

#include <algorithm>
#include <mutex>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/gemm_tc.h"
#include "kernels/cuda/tc_ws.cuh"
#include "kernels/cuda/tma.h"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

namespace kc = kernels::cuda;
namespace tc = kernels::cuda::tc;
namespace ws = kernels::cuda::ws;

namespace {

constexpr int kStages = 5;
// K blocks the copies run ahead of the conversion. Thread 0 waits for the stage it refills, i.e.
// for the consumers' release of K block (current + kLead - kStages), while its warp has a K block
// to convert: the further ahead, the more often warp 0 (and with it every stage's "B converted")
// waits. Measured at 4,096 tokens (bench-gemm, up / down us): kLead 1: 1,297 / 714, 2: 1,304 / 717,
// 3: 1,326 / 735, 4: 1,760 / 910; the copies' latency is covered from one K block ahead.
constexpr int kLead = kStages - 3;
// 512 threads: two producer warpgroups (8 converter warps, two per SM sub-partition so one's
// latencies hide behind the other's work; thread 0 also issues the copies), then the two consumer
// warpgroups of tc_ws.cuh's layout.
constexpr int kThreads = 512;
constexpr int kConverterThreads = 256;
constexpr int kConverterWarps = kConverterThreads / 32;  // arrivals on a "B converted" barrier per K block
constexpr int kItems = 2;  // (row, group) items per converter thread: 128 * 4 / 256
// 256 * 56 + 256 * 200 = 65536, the register file (launched at 128 each; ptxas allocates each side
// to its setmaxnreg count: no spills on either, checked with -Xptxas -v).
constexpr int kProducerRegs = 56, kConsumerRegs = 200;
static_assert(kConverterThreads * kProducerRegs + (kThreads - kConverterThreads) * kConsumerRegs <= 65536);
static_assert((kThreads - kConverterThreads) / 32 == ws::kConsumerWarps);

// Shared memory (offsets from a 1024-byte aligned base).
struct MoeSmem {
  static constexpr int kTile = 128 * 128;    // A or converted B: 128 rows x 128 bytes of K
  static constexpr int kRawTile = 128 * 64;  // 128 weight rows x 64 bytes (128 e2m1 values)
  static constexpr int kA = 0;
  static constexpr int kB = kA + kStages * kTile;
  static constexpr int kRaw = kB + kStages * kTile;
  static constexpr int kCs = kRaw + kStages * kRawTile;  // [kStages][128] fp32 column scales
  static constexpr int kFullLd = kCs + kStages * 128 * 4;
  static constexpr int kFullB = kFullLd + kStages * 8;
  static constexpr int kEmpty = kFullB + kStages * 8;
  static constexpr int kBytes = kEmpty + kStages * 8;
  static constexpr int kAlloc = kBytes + 1024;
};
static_assert(MoeSmem::kAlloc <= 232448, "above the sm_90 shared-memory limit");

struct MoeWsParams {
  CUtensorMap a;              // codes [pairs, k]: box 128 bytes x 128 rows, swizzled
  CUtensorMap b;              // raw e2m1 [n_local * n, k / 2] bytes: box 64 bytes x (up ? 64 : 128) rows
  CUtensorMap b3;             // up: w3, as b
  const uint8_t* b_scale;     // E8M0 [n_local * n, k / 32]
  const uint8_t* b3_scale;
  const float* a_scale;       // [k / 128, a_scale_ld]
  int64_t a_scale_ld;
  const int32_t* slot_pair;   // [pairs]
  const int32_t* offsets;     // [n_local + 1]
  const int32_t* tiles;       // [max_tiles][2]
  const int32_t* tile_count;
  const float* route_w;       // [pairs]
  uint16_t* act;              // up: [pairs, n] bf16
  float* pair_out;            // down: [pairs, n]
  int64_t k, n;
  int nk, num_n;
  float limit;
};

// Tile t of the persistent sequence: local expert, first slot, first weight row within the expert.
struct MoeTile {
  int e, slot0;
  int64_t n0;
};
template <bool kUp>
__device__ __forceinline__ MoeTile moe_tile(const MoeWsParams& p, int t) {
  const int mt = t / p.num_n, nb = t - mt * p.num_n;
  MoeTile r;
  r.e = __ldg(p.tiles + 2 * mt);
  r.slot0 = __ldg(p.tiles + 2 * mt + 1);
  r.n0 = static_cast<int64_t>(nb) * (kUp ? 64 : 128);
  return r;
}

// The copies' side of the (tile, K block) sequence, run by thread 0 between its conversions:
// issue() requests the next K block's A tile and raw weights into the next stage once the consumers
// have released it; nothing past the last tile.
template <bool kUp>
struct MoeLoader {
  int t = 0, kb = 0, slot0 = 0, wrow = 0;
  ws::Ring<kStages> ring;
  __device__ __forceinline__ void locate(const MoeWsParams& p, int total) {
    if (t >= total) return;
    const MoeTile tl = moe_tile<kUp>(p, t);
    slot0 = tl.slot0;
    wrow = static_cast<int>(tl.e * p.n + tl.n0);
  }
  __device__ __forceinline__ void begin(const MoeWsParams& p, int total) {
    t = static_cast<int>(blockIdx.x);
    locate(p, total);
  }
  __device__ __forceinline__ void issue(const MoeWsParams& p, uint8_t* smem, uint64_t* full_ld, uint64_t* empty,
                                        int total) {
    using L = MoeSmem;
    if (t >= total) return;
    uint64_t* bar = &full_ld[ring.stage];
    ws::mbar_wait(&empty[ring.stage], ring.phase ^ 1u);
    ws::mbar_arrive_expect_tx(bar, L::kTile + L::kRawTile);
    ws::tma_load_2d(smem + L::kA + ring.stage * L::kTile, &p.a, kb * 128, slot0, bar);
    uint8_t* raw = smem + L::kRaw + ring.stage * L::kRawTile;
    ws::tma_load_2d(raw, &p.b, kb * 64, wrow, bar);
    if constexpr (kUp) ws::tma_load_2d(raw + L::kRawTile / 2, &p.b3, kb * 64, wrow, bar);
    ring.next();
    if (++kb == p.nk) {
      kb = 0;
      t += static_cast<int>(gridDim.x);
      locate(p, total);
    }
  }
};

// The producer warpgroups, converter thread ct = 0..255: items i = ct + 256 j (j < 2) of each K block,
// item i = B tile column i / 4 (a weight row), 32-element group i % 4 (= ct % 4 for both). A
// warp's 32 consecutive items cover 8 rows x 4 groups: conflict-free reads of 512 raw bytes and
// swizzled 16-byte stores. Thread 0 also issues the copies, kLead K blocks ahead of the conversion:
// the stage it refills was released by the consumers of K block (current - 3), which needs only
// conversions already done, so the wait cannot block on the converters.
template <bool kUp>
__device__ __forceinline__ void moe_convert(const MoeWsParams& p, uint8_t* smem, uint64_t* full_ld, uint64_t* full_b,
                                            uint64_t* empty, int total) {
  using L = MoeSmem;
  const int ct = static_cast<int>(threadIdx.x), q = ct & 3;
  const int64_t scale_words = p.k / 128;  // uint32 words (one K block's four E8M0 scales) per weight row
  // Per item, the same in every tile: offset in the raw tile, of the first of the two 16-byte
  // chunks in the B tile, and the weight row (within the tile's w1 or w3 rows, or w2 rows).
  uint32_t roff[kItems], doff[kItems];
  int wr[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int cc = (ct >> 2) + 64 * j;
    if constexpr (kUp) {
      const int w3 = (cc >> 3) & 1, rr = 8 * (cc >> 4) + (cc & 7);
      roff[j] = static_cast<uint32_t>(w3 * (L::kRawTile / 2) + rr * 64 + q * 16);
      wr[j] = rr;
    } else {
      roff[j] = static_cast<uint32_t>(cc * 64 + q * 16);
      wr[j] = cc;
    }
    doff[j] = static_cast<uint32_t>(tc::swz(cc, 2 * q));
  }
  MoeLoader<kUp> ld;
  if (ct == 0) {
    ld.begin(p, total);
    for (int i = 0; i < kLead; ++i) ld.issue(p, smem, full_ld, empty, total);
  }
  __syncwarp();
  ws::Ring<kStages> ring;
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    const MoeTile tl = moe_tile<kUp>(p, t);
    const uint32_t* sc[kItems];
    uint32_t word[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const bool w3 = kUp && (((ct >> 2) + 64 * j) >> 3 & 1);
      const uint8_t* base = w3 ? p.b3_scale : p.b_scale;
      sc[j] = reinterpret_cast<const uint32_t*>(base) + (tl.e * p.n + tl.n0 + wr[j]) * scale_words;
      word[j] = __ldg(sc[j]);
    }
    for (int kb = 0; kb < p.nk; ++kb) {
      uint32_t next[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j) next[j] = kb + 1 < p.nk ? __ldg(sc[j] + kb + 1) : 0u;
      if (ct == 0) ld.issue(p, smem, full_ld, empty, total);  // K block (this one + kLead)
      __syncwarp();  // warp 0 converts together again after thread 0's copies
      ws::mbar_wait(&full_ld[ring.stage], ring.phase);
      const uint8_t* raw = smem + L::kRaw + ring.stage * L::kRawTile;
      uint8_t* dst = smem + L::kB + ring.stage * L::kTile;
      float* cs = reinterpret_cast<float*>(smem + L::kCs + ring.stage * 128 * 4);
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const uint4 v = *reinterpret_cast<const uint4*>(raw + roff[j]);
        const int ref = tc::mxfp4_block_ref(word[j]);
        const int d = static_cast<int>((word[j] >> (8 * q)) & 0xffu) - ref;
        uint4 o0, o1;
        tc::mxfp4_group_to_e4m3(v, d, o0, o1);
        // The group's chunks 2q, 2q + 1 of row cc: swizzled positions differ in bit 4 alone.
        *reinterpret_cast<uint4*>(dst + doff[j]) = o0;
        *reinterpret_cast<uint4*>(dst + (doff[j] ^ 16u)) = o1;
        if (q == 0) cs[(ct >> 2) + 64 * j] = tc::pow2_any(ref - 127);
      }
      // The generic-proxy stores above are read next by wgmma: each thread fences its own, the warp
      // meets, and one release arrival per warp publishes them all (as a TMA store after a CTA barrier).
      tc::fence_proxy_async();
      __syncwarp();
      if ((ct & 31) == 0) ws::mbar_arrive(&full_b[ring.stage]);
#pragma unroll
      for (int j = 0; j < kItems; ++j) word[j] = next[j];
      ring.next();
    }
  }
}

template <bool kUp>
__device__ __forceinline__ void moe_consume(const MoeWsParams& p, uint8_t* smem, uint64_t* full_ld, uint64_t* full_b,
                                            uint64_t* empty, int total, int g) {
  using L = MoeSmem;
  const int w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  ws::Ring<kStages> ring;
  float acc[64], part[64];
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    const MoeTile tl = moe_tile<kUp>(p, t);
    const int slot_end = __ldg(p.offsets + tl.e + 1);
    // This thread's two slots (h = 0, 1); slots past the expert's read the last slot's scales.
    const int r0 = tl.slot0 + 64 * g + ws::acc_row(0, w, lane);
    const float* as0 = p.a_scale + min(r0, slot_end - 1);
    const float* as1 = p.a_scale + min(r0 + 8, slot_end - 1);
    // An expert's last tile with at most 64 slots: the second warpgroup has no row to compute and
    // only releases each stage after it is filled, as the ring's arrival count expects (uniform
    // over the warpgroup, so the .aligned wgmma of the other one are unaffected).
    const bool idle = tl.slot0 + 64 * g >= slot_end;
    // The epilogue's per-row lookups (this thread's two rows), requested now so their latency hides
    // behind the main loop; each was reloaded per output element before (~20% of the consumers'
    // time in the up GEMM's profile). Up: the pair's route weight; down: the pair (output row).
    int pr[2];
    float rw[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int s = r0 + 8 * h;
      pr[h] = s < slot_end ? __ldg(p.slot_pair + s) : 0;
      rw[h] = kUp && s < slot_end ? __ldg(p.route_w + pr[h]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int kb = 0; kb < p.nk; ++kb) {
      const float sa0 = __ldg(as0 + kb * p.a_scale_ld), sa1 = __ldg(as1 + kb * p.a_scale_ld);
      ws::mbar_wait(&full_ld[ring.stage], ring.phase);
      ws::mbar_wait(&full_b[ring.stage], ring.phase);
      __syncwarp();  // lanes may leave the wait loops apart: reconverge before the .aligned wgmma
      if (idle) {
        if (lane == 0) ws::mbar_arrive(&empty[ring.stage]);
        ring.next();
        continue;
      }
      const uint32_t a0 = tc::smem_u32(smem + L::kA + ring.stage * L::kTile) + g * 64 * 128;
      const uint32_t b0 = tc::smem_u32(smem + L::kB + ring.stage * L::kTile);
      tc::fence_regs(part);
      tc::wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s)
        tc::wgmma_m64n128k32(part, tc::sw128_desc(a0 + 32 * s), tc::sw128_desc(b0 + 32 * s), s);
      tc::wgmma_commit();
      // The column scales of this thread's 32 columns, read while the MMAs run (the converters
      // wrote them before the stage's "B converted" barrier) and before the stage is released.
      const float* cs = reinterpret_cast<const float*>(smem + L::kCs + ring.stage * 128 * 4);
      float2 c2[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) c2[j] = *reinterpret_cast<const float2*>(cs + 8 * j + 2 * (lane & 3));
      ws::wgmma_wait<0>();
      tc::fence_regs(part);
      if (lane == 0) ws::mbar_arrive(&empty[ring.stage]);
      ring.next();
      // Promotion: activation scale x column scale, both powers of two (exact), one rounding.
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float ra = h ? sa1 : sa0;
          const int i = 4 * j + 2 * h;
          acc[i] = fmaf(part[i], ra * c2[j].x, acc[i]);
          acc[i + 1] = fmaf(part[i + 1], ra * c2[j].y, acc[i + 1]);
        }
      }
    }
    if (idle) continue;
    if constexpr (kUp) {
      // Elements i, i + 1 (i even) are columns cc, cc + 1 of one row, adjacent intermediate columns
      // (cc even, within one chunk of 8): one 4-byte store of the two bf16 values (col even, n a
      // multiple of 128, act 4-byte aligned: moe_group_ws checks).
#pragma unroll
      for (int i = 0; i < 64; i += 2) {
        if (i & 4) continue;  // odd chunks (w3) are read with their even partner
        const int row = 64 * g + ws::acc_row(i, w, lane), cc = ws::acc_col(i, lane);
        const int s = tl.slot0 + row;
        const int64_t col = tl.n0 + 8 * (cc >> 4) + (cc & 7);
        if (s >= slot_end || col >= p.n) continue;
        uint32_t packed = 0;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          // The reference: g, u are bf16 outputs of their linears; clamp; silu(g) * u * weight -> bf16.
          float gv = kc::round_bf16(acc[i + e]), uv = kc::round_bf16(acc[i + e + 4]);
          if (p.limit > 0.0f) {
            uv = kc::clamp_std(uv, -p.limit, p.limit);
            gv = kc::min_std(gv, p.limit);
          }
          float v = kc::mul_rn(kc::div_rn(gv, kc::add_rn(1.0f, expf(-gv))), uv);
          v = kc::mul_rn(rw[(i >> 1) & 1], v);  // row 64 g + acc_row(i): r0 + 8 ((i >> 1) & 1)
          packed |= static_cast<uint32_t>(num::f32_to_bf16(v)) << (16 * e);
        }
        *reinterpret_cast<uint32_t*>(p.act + static_cast<int64_t>(s) * p.n + col) = packed;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 64; i += 2) {
        const int s = tl.slot0 + 64 * g + ws::acc_row(i, w, lane);
        const int64_t col = tl.n0 + ws::acc_col(i, lane);
        if (s >= slot_end) continue;
        float* yp = p.pair_out + static_cast<int64_t>(pr[(i >> 1) & 1]) * p.n + col;
        if (col + 1 < p.n) {
          *reinterpret_cast<float2*>(yp) = make_float2(kc::round_bf16(acc[i]), kc::round_bf16(acc[i + 1]));
        } else if (col < p.n) {
          yp[0] = kc::round_bf16(acc[i]);
        }
      }
    }
  }
}

template <bool kUp>
__global__ void __launch_bounds__(kThreads, 1) moe_ws_kernel(const __grid_constant__ MoeWsParams p) {
#if !TANDEM_TC_WGMMA
  __trap();  // sm_90a only: never launched elsewhere (tc_resolve)
#endif
  using L = MoeSmem;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = tc::align1024(smem_raw);
  uint64_t* full_ld = reinterpret_cast<uint64_t*>(smem + L::kFullLd);
  uint64_t* full_b = reinterpret_cast<uint64_t*>(smem + L::kFullB);
  uint64_t* empty = reinterpret_cast<uint64_t*>(smem + L::kEmpty);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ws::mbar_init(&full_ld[s], 1);
      ws::mbar_init(&full_b[s], kConverterWarps);
      ws::mbar_init(&empty[s], ws::kConsumerWarps);
    }
    ws::mbar_fence_init();
  }
  __syncthreads();
  const int total = __ldg(p.tile_count) * p.num_n;
  if (threadIdx.x < kConverterThreads) {
    ws::reg_dealloc<kProducerRegs>();
    if (threadIdx.x == 0) {
      ws::tma_prefetch_map(&p.a);
      ws::tma_prefetch_map(&p.b);
      if constexpr (kUp) ws::tma_prefetch_map(&p.b3);
    }
    moe_convert<kUp>(p, smem, full_ld, full_b, empty, total);
  } else {
    ws::reg_alloc<kConsumerRegs>();
    moe_consume<kUp>(p, smem, full_ld, full_b, empty, total, (threadIdx.x - kConverterThreads) >> 7);
  }
}

std::once_flag g_ws_once;

kc::TmaTile2d raw_tile(const kernels::WeightRef& w, int64_t k, uint32_t box_rows) {
  kc::TmaTile2d t;
  t.base = w.data;
  t.dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  t.elem_bytes = 1;
  t.cols = static_cast<uint64_t>(k / 2);
  t.rows = static_cast<uint64_t>(w.n);
  t.row_stride_bytes = static_cast<uint64_t>(k / 2);
  t.box_cols = 64;
  t.box_rows = box_rows;
  t.swizzle128 = false;
  return t;
}

}  // namespace

void moe_ws_init() {
  std::call_once(g_ws_once, [] {
    TANDEM_CUDA_CHECK(
        cudaFuncSetAttribute(moe_ws_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, MoeSmem::kAlloc));
    TANDEM_CUDA_CHECK(
        cudaFuncSetAttribute(moe_ws_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, MoeSmem::kAlloc));
  });
}

void moe_group_ws(const MoeWsArgs& a, cudaStream_t st) {
  if (a.pairs == 0) return;
  moe_ws_init();
  TANDEM_CHECK(a.k % 128 == 0 && a.n % 128 == 0 && a.b.format == kernels::WeightFormat::kMxfp4 &&
               a.b.k == a.k && a.b.n == a.n_local * a.n);
  TANDEM_CHECK(!a.up || (a.b3.format == kernels::WeightFormat::kMxfp4 && a.b3.n == a.b.n && a.b3.k == a.k));
  TANDEM_CHECK((reinterpret_cast<uintptr_t>(a.b.scale) & 3) == 0 &&
               (!a.up || (reinterpret_cast<uintptr_t>(a.b3.scale) & 3) == 0));
  TANDEM_CHECK(a.up ? (a.act != nullptr && (reinterpret_cast<uintptr_t>(a.act) & 3) == 0)
               : (a.pair_out != nullptr && (reinterpret_cast<uintptr_t>(a.pair_out) & 7) == 0));
  kc::TmaTile2d ta;
  ta.base = a.a;
  ta.dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  ta.elem_bytes = 1;
  ta.cols = static_cast<uint64_t>(a.k);
  ta.rows = static_cast<uint64_t>(a.pairs);
  ta.row_stride_bytes = static_cast<uint64_t>(a.k);
  ta.box_cols = 128;
  ta.box_rows = 128;
  ta.swizzle128 = true;
  MoeWsParams p{};
  p.a = kc::tma_encode(ta);
  p.b = kc::tma_encode(raw_tile(a.b, a.k, a.up ? 64 : 128));
  p.b3 = a.up ? kc::tma_encode(raw_tile(a.b3, a.k, 64)) : p.b;
  p.b_scale = a.b.scale;
  p.b3_scale = a.up ? a.b3.scale : a.b.scale;
  p.a_scale = a.a_scale;
  p.a_scale_ld = a.a_scale_ld;
  p.slot_pair = a.slot_pair;
  p.offsets = a.offsets;
  p.tiles = a.tiles;
  p.tile_count = a.tile_count;
  p.route_w = a.route_w;
  p.act = a.act;
  p.pair_out = a.pair_out;
  p.k = a.k;
  p.n = a.n;
  p.nk = static_cast<int>(a.k / 128);
  p.num_n = static_cast<int>(a.n / (a.up ? 64 : 128));
  p.limit = a.limit;
  const int64_t bound = a.max_tiles * p.num_n;
  TANDEM_CHECK_MSG(bound < (int64_t{1} << 31), "moe_group_ws: too many tiles");
  const int grid = static_cast<int>(std::min<int64_t>(bound, kc::tc_sm_count()));
  if (a.up) moe_ws_kernel<true><<<grid, kThreads, MoeSmem::kAlloc, st>>>(p);
  else moe_ws_kernel<false><<<grid, kThreads, MoeSmem::kAlloc, st>>>(p);
  TANDEM_CUDA_LAUNCH_CHECK();
}

std::vector<kc::SmemBound> moe_prefill_ws_smem_bounds() {
  // TMA + wgmma with warp specialization: sm_90a only (a trap elsewhere; never launched there).
  const std::string shape = std::to_string(kStages) + " stages";
  return {{"moe_ws_kernel", MoeSmem::kAlloc, shape, "", 0, {90}}};
}

}  // namespace tandem::cuda_model
