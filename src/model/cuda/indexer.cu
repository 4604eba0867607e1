// The lightning indexer on the tensor cores (indexer.h), two kernels with the same bits. One row per
// block (indexer_kernel: decode-size steps) walks tiles of 128 entries: the tile's FP4 key records
// are decoded into a bf16 tile in shared memory (e2m1 x E8M0 is exact in bf16), Q K^T runs as
// m16n8k16 bf16 mma (16 keys per warp, every 16-head tile of the row's queries from shared memory),
// each dot is rounded to bf16, passed through relu, scaled by its head weight and rounded again,
// and one thread per entry adds the heads' terms in ascending order (the CPU's fp32 order) and
// stores the bf16 score. Up to 8 consecutive rows of one sequence per block (prefill chunks,
// verify batches: indexer_group_kernel, described above it) share each decoded key tile, with the
// queries in registers and the next tile's records loaded during the products. The first pass of
// the top-k selection (a histogram of the scores' top key byte) rides along.
#include "model/cuda/indexer.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "model/cuda/indexer_topk.h"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

using kernels::cuda::ceil_div;

namespace {

namespace mma = kernels::cuda::mma;
using kernels::cuda::add_rn;
using kernels::cuda::mul_rn;

constexpr int kThreads = 256;
constexpr int kTile = 128;                 // entries per tile: 16 per warp
constexpr int kMaxHeads = 64;
constexpr int kMaxRows = 4;                // rows of one sequence sharing a block's key tiles
constexpr int kMaxM = 128;                 // query rows (rows x heads) of a block: 8 m-tiles
constexpr uint16_t kBf16NegInf = 0xff80u;

// A head weight scaled as scale_round does (one product, rounded to bf16): shared by scale_round
// and the score kernel's IndexerArgs::w_scale, so the two give the same bits.
__device__ __forceinline__ float scaled_weight(float w, float scale) { return num::round_bf16(mul_rn(w, scale)); }

template <int D>
struct Layout {
  static constexpr int kPitch = 2 * D + 16;                          // bytes per bf16 row (key, query)
  static constexpr int kKeyBytes = kTile * kPitch;
  static constexpr int kTermPitch = kTile + 8;                       // floats (+8: fewer bank conflicts)
  static constexpr int kTermBytes = kMaxHeads * kTermPitch * 4;      // [heads][kTermPitch] fp32, over the keys
  static constexpr int kK = 0;
  static constexpr int kQ = kK + (kKeyBytes > kTermBytes ? kKeyBytes : kTermBytes);
  static constexpr int kW = kQ + kMaxM * kPitch;                     // [kMaxM] fp32 head weights
  static constexpr int kHist = kW + kMaxM * 4;                       // [kMaxRows][256] u32
  static constexpr int kRec = kHist + kMaxRows * 256 * 4;            // [kTile] record pointers
  static constexpr int kVis = kRec + kTile * 8;                      // [kMaxRows] int64
  static constexpr int kBytes = kVis + kMaxRows * 8;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Piece `piece` (dims [8 piece, 8 piece + 8)) of an FP4 index-key record: its 8 e2m1 codes (element
// i in bits 4i..4i+3; records of dim 128 are 4-byte aligned, of dim 64 only 2-byte) and the E8M0
// scale byte of its 32-dim block.
template <int D>
__device__ __forceinline__ uint32_t key_piece_codes(const uint8_t* rec, int piece) {
  if constexpr (D % 128 == 0) {
    return __ldg(reinterpret_cast<const uint32_t*>(rec + 4 * piece));
  } else {
    return static_cast<uint32_t>(__ldg(rec + 4 * piece)) | (static_cast<uint32_t>(__ldg(rec + 4 * piece + 1)) << 8) |
           (static_cast<uint32_t>(__ldg(rec + 4 * piece + 2)) << 16) |
           (static_cast<uint32_t>(__ldg(rec + 4 * piece + 3)) << 24);
  }
}
template <int D>
__device__ __forceinline__ uint8_t key_piece_scale(const uint8_t* rec, int piece) {
  return __ldg(rec + D / 2 + piece / 4);
}

// 8 e2m1 codes (element i in bits 4i..4i+3) times a power-of-two scale as 8 bf16 (exact).
__device__ __forceinline__ uint4 fp4x8_bf16(uint32_t codes, float s) {
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    r[i] = mma::f32x2_to_bf16x2(mul_rn(num::e2m1_decode(static_cast<uint8_t>((codes >> (8 * i)) & 0xfu)), s),
                                mul_rn(num::e2m1_decode(static_cast<uint8_t>((codes >> (8 * i + 4)) & 0xfu)), s));
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// A block's rows [t0, t0 + R) run in spans of one sequence (a span shares every key tile): the
// span's nr * heads query rows are the mma's M (MT m-tiles, compile-time bound). Each output
// element depends only on its own row, head and entry, so R and the grid do not change any bit.
template <int D, int MT>
__global__ void __launch_bounds__(kThreads) indexer_kernel(IndexerArgs a, int R) {
  using L = Layout<D>;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sK = smem + L::kK;
  float* sTerm = reinterpret_cast<float*>(smem + L::kK);
  uint8_t* sQ = smem + L::kQ;
  float* sW = reinterpret_cast<float*>(smem + L::kW);
  uint32_t* sHist = reinterpret_cast<uint32_t*>(smem + L::kHist);
  const uint8_t** sRec = reinterpret_cast<const uint8_t**>(smem + L::kRec);
  int64_t* sVis = reinterpret_cast<int64_t*>(smem + L::kVis);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  kernels::cuda::pdl_wait();
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * R;
  if (t0 >= a.rows) return;
  const int H = a.heads;
  const int nr_all = static_cast<int>(a.rows - t0 < R ? a.rows - t0 : R);
  constexpr int kPieces = D / 8;
  const int64_t ntiles = (a.n_cols + kTile - 1) / kTile;
  const int frag_row = (lane & 7) + ((lane >> 3) & 1) * 8;

  for (int s0 = 0; s0 < nr_all;) {
    // the span [s0, s1): consecutive rows of one sequence
    const int seq = a.m.row_seq[t0 + s0];
    int s1 = s0 + 1;
    while (s1 < nr_all && a.m.row_seq[t0 + s1] == seq) ++s1;
    const int nr = s1 - s0, mrows = nr * H, mt_run = (mrows + 15) / 16;
    const int64_t ta = t0 + s0;
    const int32_t* table = a.m.block_tables + static_cast<int64_t>(seq) * a.m.max_blocks;
    int64_t maxvis = 0;
    for (int r = 0; r < nr; ++r) {
      const int64_t v = (a.m.positions[ta + r] + 1) / 4;
      maxvis = v > maxvis ? v : maxvis;
    }
    __syncthreads();  // the previous span's readers of every shared array are done
    if (tid < nr) {
      sVis[tid] = (a.m.positions[ta + tid] + 1) / 4;
      if (blockIdx.x == 0) a.visible[ta + tid] = static_cast<int32_t>(sVis[tid]);
    }
    // the span's queries as bf16 rows m = r * H + h (zeros past the span), head weights, histograms
    for (int i = tid; i < MT * 16 * kPieces; i += kThreads) {
      const int m = i / kPieces, piece = i % kPieces;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (m < mrows) {
        const float4* f = reinterpret_cast<const float4*>(a.q + (ta * H + m) * D) + 2 * piece;
        const float4 x = f[0], y = f[1];
        v = make_uint4(mma::f32x2_to_bf16x2(x.x, x.y), mma::f32x2_to_bf16x2(x.z, x.w),
                       mma::f32x2_to_bf16x2(y.x, y.y), mma::f32x2_to_bf16x2(y.z, y.w));
      }
      *reinterpret_cast<uint4*>(sQ + m * L::kPitch + piece * 16) = v;
    }
    for (int i = tid; i < MT * 16; i += kThreads) {
      const float w = i < mrows ? a.w[ta * H + i] : 0.0f;
      sW[i] = a.w_scale != 0.0f ? scaled_weight(w, a.w_scale) : w;  // scale_round's values (0 stays 0)
    }
    for (int i = tid; i < kMaxRows * 256; i += kThreads) sHist[i] = 0;

    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
      const int64_t e0 = tile * kTile;
      if (e0 >= maxvis) {  // nothing visible to the span: -inf only
        for (int i = tid; i < nr * kTile; i += kThreads) {
          const int64_t e = e0 + i % kTile;
          if (e < a.n_cols) a.scores[(ta + i / kTile) * a.lds + e] = kBf16NegInf;
        }
        continue;
      }
      __syncthreads();  // the previous tile's readers of sK / sTerm / sRec are done (and the setup above)
      if (tid < kTile) {
        const int64_t e = e0 + tid;
        const uint8_t* rec = nullptr;
        if (e < maxvis) {
          const int64_t pos = 4 * e;
          rec = a.pool + static_cast<int64_t>(table[pos / a.m.block_size]) * a.block_bytes + a.pool_idx +
                ((pos % a.m.block_size) / 4) * a.key.bytes;
        }
        sRec[tid] = rec;
      }
      __syncthreads();
      // keys -> bf16 rows (entries past every row's visibility: zeros)
      {
        constexpr int kIters = kTile * kPieces / kThreads;
        uint32_t codes[kIters];
        uint8_t sc[kIters];
#pragma unroll
        for (int it = 0; it < kIters; ++it) {
          const int i = it * kThreads + tid, key = i / kPieces, piece = i % kPieces;
          const uint8_t* rec = sRec[key];
          codes[it] = 0;
          sc[it] = 127;
          if (rec) {
            codes[it] = key_piece_codes<D>(rec, piece);
            sc[it] = key_piece_scale<D>(rec, piece);
          }
        }
#pragma unroll
        for (int it = 0; it < kIters; ++it) {
          const int i = it * kThreads + tid, key = i / kPieces, piece = i % kPieces;
          *reinterpret_cast<uint4*>(sK + key * L::kPitch + piece * 16) = fp4x8_bf16(codes[it], num::e8m0_to_f32(sc[it]));
        }
      }
      __syncthreads();
      // Q K^T: warp w takes entries [16w, 16w + 16) (two n-tiles) for the span's m-tiles
      float acc[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
      {
        const uint32_t b_addr = smem_u32(sK) + (16 * warp + (lane & 7)) * L::kPitch + (lane >> 3) * 16;
        const uint32_t a_addr = smem_u32(sQ) + frag_row * L::kPitch + (lane >> 4) * 16;
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 32) {
          uint32_t b[2][4];
          ldsm_x4(b[0], b_addr + 2 * k0);
          ldsm_x4(b[1], b_addr + 8 * L::kPitch + 2 * k0);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            if (mt >= mt_run) continue;
            uint32_t a0[4], a1[4];
            ldsm_x4(a0, a_addr + mt * 16 * L::kPitch + 2 * k0);
            ldsm_x4(a1, a_addr + mt * 16 * L::kPitch + 2 * k0 + 32);
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
              mma::mma_bf16(acc[mt][nt], a0, b[nt][0], b[nt][1]);
              mma::mma_bf16(acc[mt][nt], a1, b[nt][2], b[nt][3]);
            }
          }
        }
      }
      // terms: bf16(relu(bf16(dot)) * w) of query row m = mt * 16 + g (+ 8)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float d = num::round_bf16(acc[mt][nt][i]);
            acc[mt][nt][i] = num::round_bf16(mul_rn(d > 0.0f ? d : 0.0f, sW[mt * 16 + g + (i >> 1) * 8]));
          }
      // per row of the span: its heads' terms to shared memory (over the keys: after every warp's
      // reads of them), then the heads in ascending order, one thread per entry
      for (int r = 0; r < nr; ++r) {
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int i = 0; i < 4; i += 2) {
            const int h = mt * 16 + g + (i >> 1) * 8 - r * H;
            if (h < 0 || h >= H) continue;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
              *reinterpret_cast<float2*>(sTerm + h * L::kTermPitch + 16 * warp + 8 * nt + 2 * tq) =
                  make_float2(acc[mt][nt][i], acc[mt][nt][i + 1]);
          }
        __syncthreads();
        if (tid < kTile) {
          const int64_t e = e0 + tid;
          if (e < a.n_cols) {
            uint16_t bits = kBf16NegInf;
            if (e < sVis[r]) {
              float total = 0.0f;
              for (int h = 0; h < H; ++h) total = add_rn(total, sTerm[h * L::kTermPitch + tid]);
              bits = num::f32_to_bf16(total);
              atomicAdd(&sHist[r * 256 + (topk_key16(bits) >> 8)], 1u);
            }
            a.scores[(ta + r) * a.lds + e] = bits;
          }
        }
      }
    }
    if (a.hist) {
      __syncthreads();
      for (int i = tid; i < nr * 256; i += kThreads)
        if (sHist[i]) atomicAdd(&a.hist[(ta + i / 256) * 256 + i % 256], sHist[i]);
    }
    s0 = s1;
  }
  kernels::cuda::pdl_trigger();
}

// ---- the row-group kernel: consecutive rows of one sequence (prefill chunks, verify batches) ----
//
// The same scores as indexer_kernel, bit for bit (each output element is the same operations on
// the same values), laid out for throughput when a block holds several rows:
//  - a block's rows x heads (at most 128 query rows) are 8 m-tiles; warp w takes the m-tile pair
//    w % 4 and the tile's entries [32 (w / 4), + 32), its queries' mma A fragments in registers for
//    the whole span (one load), so a tile's shared-memory traffic is the keys' B fragments only;
//  - tiles of 64 entries: two blocks per multiprocessor, so one block's products overlap the
//    other's decoding and sums;
//  - a tile's key records are loaded into registers one tile ahead (before the current tile's
//    products) and decoded after them into the one bf16 key tile: the e2m1 codes through byte
//    permutes of two 8-entry tables (the bf16 bits of 0, .5, 1, ..., 6 and the sign bits), then the
//    E8M0 scale as one bf16 product (both exact: the values fp4x8_bf16 gives). The records'
//    addresses are computed once per entry, two tiles ahead, into shared memory (the block-table
//    word loaded before a tile's products, used after them): computed per piece, with 64-bit
//    division, they cost a third of the kernel's time;
//  - the terms bf16(relu(bf16(dot)) * w) are formed on bf16 pairs (a bf16 product of two bf16
//    values rounds once, as round_bf16(mul_rn) does) into a [query row][entry] tile, and every
//    thread then adds one row's heads for two entries in ascending order, as indexer_kernel does
//    (one 32-bit load a head for both; at 32 and 64 heads the loop is unrolled: Nsight Compute
//    found the kernel bound by instruction issue, the head sums' loop the largest share).
// Two barriers per tile. Shared memory about 46 KB at dim 128.
constexpr int kGroupRows = 8;              // rows of a block (at most 128 query rows)
constexpr int kGTile = 64;                 // entries per tile of the row-group kernel

template <int D>
struct GroupLayout {
  static constexpr int kPitch = 2 * D + 16;                  // bytes per bf16 key row
  static constexpr int kTPitch = 2 * kGTile + 16;            // bytes per bf16 term row
  static constexpr int kK = 0;                               // [kGTile][kPitch] keys
  static constexpr int kT = kK + kGTile * kPitch;            // [kMaxM][kTPitch] terms
  static constexpr int kW = kT + kMaxM * kTPitch;            // [kMaxM] bf16 pairs (w, w) of the head weights
  static constexpr int kHist = kW + kMaxM * 4;               // [kGroupRows][256] u32
  static constexpr int kVis = kHist + kGroupRows * 256 * 4;  // [kGroupRows] int64
  static constexpr int kRec = kVis + kGroupRows * 8;         // [2][kGTile] record pointers
  static constexpr int kBytes = kRec + 2 * kGTile * 8;
};

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#else
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
  return d;
}
// max(x, 0) per half: NaN -> 0 (max returns the number), as `d > 0 ? d : 0` does.
__device__ __forceinline__ uint32_t bf16x2_relu(uint32_t a) {
  uint32_t d;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(0u));
  return d;
}
// An E8M0 scale as bf16 bits: 2^(b-127) (b = 0: the subnormal 2^-127; 255: NaN).
__device__ __forceinline__ uint32_t e8m0_bf16(uint32_t b) {
  return b == 0 ? 0x0040u : b == 255 ? 0x7fc0u : b << 7;
}
// 8 e2m1 codes (element i in bits 4i..4i+3) as 4 bf16 pairs (exact): the magnitudes' low and high
// bytes from two 8-entry tables (prmt selects by the 3-bit magnitude), interleaved, then each
// element's sign bit moved to its half's bit 15.
__device__ __forceinline__ void e2m1x8_to_bf16x8(uint32_t c, uint32_t (&o)[4]) {
  constexpr uint32_t kLoA = 0xc0800000u, kLoB = 0xc0804000u;  // low bytes of 0, .5, 1, 1.5 | 2, 3, 4, 6
  constexpr uint32_t kHiA = 0x3f3f3f00u, kHiB = 0x40404040u;  // high bytes
  const uint32_t m = c & 0x77777777u;
  const uint32_t l0 = __byte_perm(kLoA, kLoB, m), h0 = __byte_perm(kHiA, kHiB, m);
  const uint32_t l1 = __byte_perm(kLoA, kLoB, m >> 16), h1 = __byte_perm(kHiA, kHiB, m >> 16);
  const uint32_t c4 = c << 4;  // byte i: bit 7 = element 2i's sign; c's byte i: bit 7 = element 2i+1's
  o[0] = __byte_perm(l0, h0, 0x5140) | (__byte_perm(c4, c, 0x4000) & 0x80008000u);
  o[1] = __byte_perm(l0, h0, 0x7362) | (__byte_perm(c4, c, 0x5111) & 0x80008000u);
  o[2] = __byte_perm(l1, h1, 0x5140) | (__byte_perm(c4, c, 0x6222) & 0x80008000u);
  o[3] = __byte_perm(l1, h1, 0x7362) | (__byte_perm(c4, c, 0x7333) & 0x80008000u);
}

// HC: the head count when it is one of the model's (32: a rank of TP=2, 64: TP=1; the head sums'
// loop unrolled), 0 for any other (a.heads).
template <int D, int HC>
__global__ void __launch_bounds__(kThreads, 2) indexer_group_kernel(IndexerArgs a, int R) {
  using L = GroupLayout<D>;
  constexpr int KS = D / 16;                 // k steps of the dot
  constexpr int kPieces = D / 8;             // 8-dim pieces of a key
  constexpr int kIters = kGTile * kPieces / kThreads;  // pieces per thread per tile
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* sK = smem + L::kK;
  uint8_t* sT = smem + L::kT;
  uint32_t* sW = reinterpret_cast<uint32_t*>(smem + L::kW);
  uint32_t* sHist = reinterpret_cast<uint32_t*>(smem + L::kHist);
  int64_t* sVis = reinterpret_cast<int64_t*>(smem + L::kVis);
  const uint8_t** sRec = reinterpret_cast<const uint8_t**>(smem + L::kRec);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  // Warps are 4 m-tile pairs x 2 halves of the tile's entries (measured against 8 m-tiles x all 64
  // entries, half the A registers and twice the B fragment loads: 6.4 against 6.9 ms at 4,096 rows
  // and 160K of context).
  constexpr int WM = 2, MG = 8 / WM, NT = kGTile / 8 / (8 / MG);  // m-tiles per warp, m-groups, n-tiles per warp
  const int mp = warp % MG, nq = warp / MG;  // m-tiles [WM mp, + WM); entries [8 NT nq, + 8 NT)
  kernels::cuda::pdl_wait();
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * R;
  if (t0 >= a.rows) return;
  const int H = HC > 0 ? HC : a.heads;
  const int nr_all = static_cast<int>(a.rows - t0 < R ? a.rows - t0 : R);
  const int64_t ntiles = (a.n_cols + kGTile - 1) / kGTile;
  // B fragments of this warp: keys 8 NT nq + 8 nt + (lane & 7), dims k0 + 8 (lane >> 3)
  const uint32_t b_addr = smem_u32(sK) + (8 * NT * nq + (lane & 7)) * L::kPitch + (lane >> 3) * 16;

  for (int s0 = 0; s0 < nr_all;) {
    const int seq = a.m.row_seq[t0 + s0];
    int s1 = s0 + 1;
    while (s1 < nr_all && a.m.row_seq[t0 + s1] == seq) ++s1;
    const int nr = s1 - s0, mrows = nr * H;
    const int64_t ta = t0 + s0;
    const int32_t* table = a.m.block_tables + static_cast<int64_t>(seq) * a.m.max_blocks;
    int maxvis = 0;  // entries (< 2^29 for any supported context)
    for (int r = 0; r < nr; ++r) {
      const int v = static_cast<int>((a.m.positions[ta + r] + 1) / 4);
      maxvis = v > maxvis ? v : maxvis;
    }
    const bool mma_on = 16 * WM * mp < mrows;
    // this warp's queries as A fragments (rows past the span: zeros)
    uint32_t qa[WM][KS][4];
#pragma unroll
    for (int mt = 0; mt < WM; ++mt)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {
        const int m = 16 * (WM * mp + mt) + g + 8 * hi;
        const float* qrow = a.q + (ta * H + m) * D;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
#pragma unroll
          for (int kh = 0; kh < 2; ++kh) {
            uint32_t v = 0;
            if (m < mrows) {
              const float2 x = *reinterpret_cast<const float2*>(qrow + 16 * ks + 8 * kh + 2 * tq);
              v = mma::f32x2_to_bf16x2(x.x, x.y);
            }
            qa[mt][ks][hi + 2 * kh] = v;
          }
      }
    __syncthreads();  // the previous span's readers of every shared array are done
    if (tid < nr) {
      sVis[tid] = (a.m.positions[ta + tid] + 1) / 4;
      if (blockIdx.x == 0) a.visible[ta + tid] = static_cast<int32_t>(sVis[tid]);
    }
    for (int i = tid; i < kMaxM; i += kThreads) {  // the span's head weights as bf16 pairs (scale_round's values)
      float w = 0.0f;
      if (i < mrows) {
        w = a.w[ta * H + i];
        if (a.w_scale != 0.0f) w = scaled_weight(w, a.w_scale);
      }
      sW[i] = mma::f32x2_to_bf16x2(w, w);
    }
    if (a.hist)
      for (int i = tid; i < kGroupRows * 256; i += kThreads) sHist[i] = 0;

    // Record pointers of a tile's entries (null past the span's visibility), one per entry, computed
    // by threads 0..kGTile-1 two tiles ahead into a double buffer: the block-table word is loaded at
    // the top of one iteration and used after its products.
    const uint32_t bs = static_cast<uint32_t>(a.m.block_size);
    auto table_word = [&](int t) -> int32_t {
      const int e = t * kGTile + tid;
      return e < maxvis ? table[static_cast<uint32_t>(4 * e) / bs] : 0;
    };
    auto store_ptr = [&](int t, int32_t blk, int buf) {
      const int e = t * kGTile + tid;
      const uint8_t* rec = nullptr;
      if (e < maxvis)
        rec = a.pool + static_cast<int64_t>(blk) * a.block_bytes + a.pool_idx +
              static_cast<int64_t>((static_cast<uint32_t>(4 * e) % bs) / 4) * a.key.bytes;
      sRec[buf * kGTile + tid] = rec;
    };
    // This thread's key pieces of a tile: keys it * (kThreads / kPieces) + tid / kPieces, piece tid % kPieces.
    uint32_t codes[kIters], scb[kIters];
    auto load_tile = [&](int buf) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int i = it * kThreads + tid, key = i / kPieces, piece = i % kPieces;
        const uint8_t* rec = sRec[buf * kGTile + key];
        codes[it] = 0;
        scb[it] = 127;
        if (rec) {
          codes[it] = key_piece_codes<D>(rec, piece);
          scb[it] = key_piece_scale<D>(rec, piece);
        }
      }
    };
    auto decode_tile = [&] {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int i = it * kThreads + tid, key = i / kPieces, piece = i % kPieces;
        const uint32_t sc = e8m0_bf16(scb[it]), sc2 = sc | (sc << 16);
        uint32_t v[4];
        e2m1x8_to_bf16x8(codes[it], v);
        *reinterpret_cast<uint4*>(sK + key * L::kPitch + piece * 16) =
            make_uint4(bf16x2_mul(v[0], sc2), bf16x2_mul(v[1], sc2), bf16x2_mul(v[2], sc2), bf16x2_mul(v[3], sc2));
      }
    };

    const int live = (maxvis + kGTile - 1) / kGTile;  // tiles with an entry visible to the span
    const int gx = static_cast<int>(gridDim.x);
    int tile = static_cast<int>(blockIdx.x);
    int buf = 0;  // sRec[buf]: this tile's pointers; sRec[buf ^ 1]: the next tile's
    if (tile < live) {
      if (tid < kGTile) {
        store_ptr(tile, table_word(tile), 0);
        if (tile + gx < live) store_ptr(tile + gx, table_word(tile + gx), 1);
      }
      __syncthreads();
      load_tile(0);
      decode_tile();
      __syncthreads();
    }
    for (; tile < live; tile += gx, buf ^= 1) {
      const int next = tile + gx, next2 = tile + 2 * gx;
      int32_t tw = 0;
      if (tid < kGTile && next2 < live) tw = table_word(next2);  // used after the products
      if (next < live) load_tile(buf ^ 1);  // in flight during the products
      const int64_t e0 = static_cast<int64_t>(tile) * kGTile;
      if (mma_on) {
        float acc[WM][NT][4];
#pragma unroll
        for (int mt = 0; mt < WM; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < D; k0 += 32) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            uint32_t b[4];
            ldsm_x4(b, b_addr + nt * 8 * L::kPitch + 2 * k0);  // b0, b1 of k0 and of k0 + 16
#pragma unroll
            for (int mt = 0; mt < WM; ++mt) {
              mma::mma_bf16(acc[mt][nt], qa[mt][k0 / 16], b[0], b[1]);
              mma::mma_bf16(acc[mt][nt], qa[mt][k0 / 16 + 1], b[2], b[3]);
            }
          }
        }
        // terms bf16(relu(bf16(dot)) * w) of query rows 16 (WM mp + mt) + g (+ 8), entries 8 (NT nq + nt) + 2 tq (+ 1)
#pragma unroll
        for (int mt = 0; mt < WM; ++mt)
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const int m = 16 * (WM * mp + mt) + g + 8 * hi;
            const uint32_t w2 = sW[m];
            uint8_t* trow = sT + m * L::kTPitch + (8 * NT * nq + 2 * tq) * 2;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const uint32_t d = mma::f32x2_to_bf16x2(acc[mt][nt][2 * hi], acc[mt][nt][2 * hi + 1]);
              *reinterpret_cast<uint32_t*>(trow + nt * 16) = bf16x2_mul(bf16x2_relu(d), w2);
            }
          }
      }
      __syncthreads();  // the terms are stored; every warp is done with the key tile
      if (next < live) decode_tile();
      if (tid < kGTile && next2 < live) store_ptr(next2, tw, buf);  // this tile's pointers were read
      // the heads of row r for entries e, e + 1 (ascending head order, fp32, as indexer_kernel): one
      // 32-bit load a head for both, the loop unrolled at the model's head counts
      for (int pidx = tid; pidx < nr * (kGTile / 2); pidx += kThreads) {
        const int r = pidx / (kGTile / 2), j = pidx % (kGTile / 2);
        const uint8_t* col = sT + static_cast<size_t>(r * H) * L::kTPitch + 4 * j;
        float t0s = 0.0f, t1s = 0.0f;
        auto add_head = [&](int h) {
          const uint32_t two = *reinterpret_cast<const uint32_t*>(col + h * L::kTPitch);
          t0s = add_rn(t0s, __uint_as_float(two << 16));
          t1s = add_rn(t1s, __uint_as_float(two & 0xffff0000u));
        };
        if constexpr (HC > 0) {
#pragma unroll
          for (int h = 0; h < HC; ++h) add_head(h);
        } else {
#pragma unroll 4
          for (int h = 0; h < H; ++h) add_head(h);
        }
        const int64_t e = e0 + 2 * j, vis = sVis[r];
        uint16_t bits0 = kBf16NegInf, bits1 = kBf16NegInf;
        if (e < vis) bits0 = num::f32_to_bf16(t0s);
        if (e + 1 < vis) bits1 = num::f32_to_bf16(t1s);
        if (a.hist) {
          if (e < vis) atomicAdd(&sHist[r * 256 + (topk_key16(bits0) >> 8)], 1u);
          if (e + 1 < vis) atomicAdd(&sHist[r * 256 + (topk_key16(bits1) >> 8)], 1u);
        }
        uint16_t* dst = a.scores + (ta + r) * a.lds + e;
        if (e + 1 < a.n_cols)
          *reinterpret_cast<uint32_t*>(dst) = static_cast<uint32_t>(bits0) | (static_cast<uint32_t>(bits1) << 16);
        else if (e < a.n_cols)
          *dst = bits0;
      }
      __syncthreads();  // the next tile's keys are stored; the terms are read
    }
    // tiles past every row's visibility: -inf only
    for (; tile < ntiles; tile += gridDim.x) {
      const int64_t e0 = tile * kGTile;
      for (int i = tid; i < nr * kGTile; i += kThreads) {
        const int64_t e = e0 + i % kGTile;
        if (e < a.n_cols) a.scores[(ta + i / kGTile) * a.lds + e] = kBf16NegInf;
      }
    }
    if (a.hist) {
      __syncthreads();
      for (int i = tid; i < nr * 256; i += kThreads)
        if (sHist[i]) atomicAdd(&a.hist[(ta + i / 256) * 256 + i % 256], sHist[i]);
    }
    s0 = s1;
  }
  kernels::cuda::pdl_trigger();
}

__global__ void scale_round_kernel(ScaleRoundArgs a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.n) a.x[i] = scaled_weight(a.x[i], a.scale);
}

template <int D, int MT>
void launch(const IndexerArgs& a, cudaStream_t s, unsigned grid_x, int R) {
  constexpr size_t smem = Layout<D>::kBytes;
  auto k = indexer_kernel<D, MT>;
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
  const unsigned groups = static_cast<unsigned>((a.rows + R - 1) / R);
  kernels::cuda::launch_pdl(k, dim3(grid_x, groups), dim3(kThreads), smem, s, a, R);
}

template <int D>
void launch_group(const IndexerArgs& a, cudaStream_t s, unsigned grid_x, int R) {
  constexpr size_t smem = GroupLayout<D>::kBytes;
  auto k = a.heads == 32 ? indexer_group_kernel<D, 32> : a.heads == 64 ? indexer_group_kernel<D, 64> : indexer_group_kernel<D, 0>;
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
  const unsigned groups = static_cast<unsigned>((a.rows + R - 1) / R);
  kernels::cuda::launch_pdl(k, dim3(grid_x, groups), dim3(kThreads), smem, s, a, R);
}

template <int D>
void launch_d(const IndexerArgs& a, cudaStream_t s, unsigned grid_x, int R) {
  if (R > 1) {
    if (a.group_kernel)
      launch_group<D>(a, s, grid_x, R);
    else
      launch<D, 8>(a, s, grid_x, R);
    return;
  }
  switch ((a.heads + 15) / 16) {
    case 1: launch<D, 1>(a, s, grid_x, 1); break;
    case 2: launch<D, 2>(a, s, grid_x, 1); break;
    case 3: launch<D, 3>(a, s, grid_x, 1); break;
    default: launch<D, 4>(a, s, grid_x, 1); break;
  }
}

}  // namespace

bool indexer_supports(int heads, int dim) { return heads >= 1 && heads <= kMaxHeads && (dim == 64 || dim == 128); }

void indexer_scores_paged(const IndexerArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  TANDEM_CHECK_MSG(indexer_supports(a.heads, a.dim), "indexer: 1..64 heads of dim 64 or 128");
  TANDEM_CHECK_MSG(a.key.dim == a.dim && a.key.bytes == a.dim / 2 + a.dim / 32, "indexer: key layout");
  TANDEM_CHECK_MSG(a.lds >= a.n_cols && a.lds % 8 == 0, "indexer: score row stride");
  TANDEM_CHECK_MSG(a.rows <= 65535, "indexer launched for more than 65535 rows (chunk the call)");
  int sms = a.sm_count;
  if (sms <= 0) {
    int dev = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  // Rows per block: in steps of 32 rows or more (prefill chunks, verify batches) up to 8 of one
  // sequence share its key tiles on the row-group kernel (at most 128 query rows: 4 at one rank of
  // TP=2's 32 heads, 2 at 64); smaller steps take one row per block (indexer_kernel). A request for
  // more than fits is clamped to what fits, at least 2 for any supported head count: R changes no
  // bit of the result.
  const int fit = a.group_kernel ? std::min(kGroupRows, kMaxM / a.heads)
                                 : std::min(kMaxRows, kMaxM / a.heads);
  const int asked = a.rows_per_block > 0 ? a.rows_per_block : (a.rows >= 32 ? fit : 1);
  const int R = std::clamp(asked, 1, fit);
  // Blocks per row group: enough for about eight per multiprocessor over the step (each loads its
  // queries once), never more than the tiles.
  const int64_t groups = (a.rows + R - 1) / R;
  const int tile = R > 1 && a.group_kernel ? kGTile : kTile;
  const int64_t ntiles = std::max<int64_t>(1, (a.n_cols + tile - 1) / tile);
  const int64_t want = std::max<int64_t>(1, (8 * static_cast<int64_t>(sms) + groups - 1) / groups);
  const unsigned grid_x = static_cast<unsigned>(std::min(ntiles, want));
  if (a.dim == 64)
    launch_d<64>(a, s, grid_x, R);
  else
    launch_d<128>(a, s, grid_x, R);
}

void scale_round(const ScaleRoundArgs& a, cudaStream_t s) {
  if (a.n == 0) return;
  scale_round_kernel<<<ceil_div(a.n, 256), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

std::vector<kernels::cuda::SmemBound> indexer_smem_bounds() {
  return {{"indexer_kernel", Layout<128>::kBytes,
           "head dim 128 (the largest supported), up to " + std::to_string(kMaxM) + " query rows, " +
               std::to_string(kTile) + "-entry tiles, any context length",
           ""},
          {"indexer_group_kernel", GroupLayout<128>::kBytes,
           "head dim 128, " + std::to_string(kMaxM) + " query rows, " + std::to_string(kGTile) +
               "-entry tiles, any context length",
           ""}};
}

}  // namespace tandem::cuda_model
