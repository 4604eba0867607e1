// The target attention's pipelined row kernel (attention.h), for steps whose rows fill the GPU
// (prefill chunks, large batches): persistent blocks over rows, each for up to 32 heads, with 4
// producer warps that decode the next 64-key chunk's records into one of two bf16 tiles while 8
// consumer warps run the current chunk's mma.sync products and fold. Named barriers hand the tiles
// over (full: producers -> consumers, empty: consumers -> producers). Per (row, head) it performs
// attention.cu's operations on the same values in the same order, so its bits equal the folding
// blocks' and the split launch's (tests/cuda/attention_test.cpp checks all three).
//
// Why: the folding blocks run each chunk's key pointers, record loads, products and fold one after
// another, with one block's 16 heads per decode; in a 4,096-token chunk of DeepSeek-V4-Flash they
// took 2 ms a layer, six times their mma work (docs/PERFORMANCE.md).
#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/launch.cuh"
#include "model/cuda/attention_device.cuh"

namespace tandem::cuda_model::attn {
namespace {

constexpr int kConsumerWarps = 8;  // one 8-key n-tile each in Q K^T, D/8 dims each in P V
constexpr int kProducerWarps = 4;
constexpr int kConsumers = 32 * kConsumerWarps;
constexpr int kProducers = 32 * kProducerWarps;
constexpr int kThreads = kConsumers + kProducers;
static_assert(kChunk == 8 * kConsumerWarps, "one 8-key n-tile per consumer warp");
static_assert(kChunk <= kProducers, "a producer thread per key of a chunk looks its record up");

// Named barriers (0 is __syncthreads, unused here).
constexpr int kBarFull = 1;   // + tile: the tile's keys are decoded (producers arrive, consumers wait)
constexpr int kBarEmpty = 3;  // + tile: the consumers are done with the tile (consumers arrive, producers wait)
constexpr int kBarCons = 5;   // the consumers among themselves
constexpr int kBarProd = 6;   // the producers among themselves

__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// Shared memory (byte offsets, multiples of 16): two key tiles, the queries of two rows (the next
// row's are loaded while the current row's last chunks run), the p planes, the keys' mask bytes,
// the consumer warps' maxima and sums. NT head tiles of 16 per block.
template <int D, int NT>
struct RowsLayout {
  static constexpr int kPitch = 2 * D + 16;                       // bytes per bf16 row of K/V and Q
  static constexpr int kHeadsPB = NT * kHeads;
  static constexpr int kK = 0;                                    // [2][kChunk][kPitch]
  static constexpr int kQ = kK + 2 * kChunk * kPitch;             // [2][kHeadsPB][kPitch]
  static constexpr int kP = kQ + 2 * kHeadsPB * kPitch;           // [NT][kPTerms][kHeads][kPPitch]
  static constexpr int kPtr = kP + NT * kPTerms * kHeads * kPPitch;  // [2][kChunk] tagged key pointers
  static constexpr int kOk = kPtr + 2 * kChunk * 8;               // [2][kChunk] key is listed
  static constexpr int kMax = kOk + 2 * kChunk;                   // [kConsumerWarps][kHeadsPB]
  static constexpr int kSum = kMax + kConsumerWarps * kHeadsPB * 4;
  static constexpr int kBytes = kSum + kConsumerWarps * kHeadsPB * 4;
};

// The rows a block walks: blockIdx.x, + gridDim.x, ...; each row's chunk count as attend_chunk's
// callers count it.
__device__ __forceinline__ int row_chunks(const AttnArgs& a, int64_t t, int nchunks) {
  const int nk = row_keys(a, t).nk;
  const int nch = (nk + kChunk - 1) / kChunk;
  return nch < nchunks ? nch : nchunks;
}

// Producers: the NT * 16 query heads [h0, ...) of row t as bf16 rows (zeros past the last head),
// 4 pieces' loads in flight per thread (attention.cu's load_q says why they are hoisted by hand).
template <int D, int NT>
__device__ __forceinline__ void load_q_rows(const AttnArgs& a, int64_t t, int h0, uint8_t* sQ, int ptid) {
  constexpr int kPieces = D / 8, kPer = NT * kHeads * kPieces / kProducers;
  constexpr int kBatch = kPer < 4 ? kPer : 4;
  static_assert(NT * kHeads * kPieces % kProducers == 0 && kPer % kBatch == 0, "whole batches");
#pragma unroll 1
  for (int j0 = 0; j0 < kPer; j0 += kBatch) {
    float4 v[kBatch][2];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (j0 + b) * kProducers + ptid, hl = i / kPieces, piece = i % kPieces;
      v[b][0] = v[b][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h0 + hl < a.heads) {
        const float4* f = reinterpret_cast<const float4*>(a.q + (t * a.heads + h0 + hl) * D) + 2 * piece;
        v[b][0] = __ldg(f);
        v[b][1] = __ldg(f + 1);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (j0 + b) * kProducers + ptid, hl = i / kPieces, piece = i % kPieces;
      const float4 x = v[b][0], y = v[b][1];
      *reinterpret_cast<uint4*>(sQ + hl * RowsLayout<D, NT>::kPitch + piece * 16) =
          make_uint4(bf16x2(x.x, x.y), bf16x2(x.z, x.w), bf16x2(y.x, y.y), bf16x2(y.z, y.w));
    }
  }
}

// A piece of a KV record (load_piece without its fp32-row case: the row kernel runs only where the
// step's own keys come from their records, AttnArgs::step_rec), 5 registers in flight instead of 10.
struct RecPiece {
  uint4 w;      // bf16 dims: w; fp8: w.xy codes; nvfp4: w.x codes
  float scale;
};
__device__ __forceinline__ RecPiece load_rec_piece(uint64_t kp, const KvRecordLayout& l, int piece) {
  RecPiece r;
  r.w = make_uint4(0, 0, 0, 0);
  r.scale = 0.0f;
  if (!kp) return r;
  const int d0 = 8 * piece;
  const uint8_t* rec = reinterpret_cast<const uint8_t*>(kp);
  if (l.kind == KvRecordKind::kBf16 || d0 >= l.nope) {
    const uint8_t* src = l.kind == KvRecordKind::kBf16 ? rec + 2 * d0 : rec + l.rope_off + 2 * (d0 - l.nope);
    const uint2 lo = __ldg(reinterpret_cast<const uint2*>(src)), hi = __ldg(reinterpret_cast<const uint2*>(src + 8));
    r.w = make_uint4(lo.x, lo.y, hi.x, hi.y);
  } else if (l.kind == KvRecordKind::kFp8) {
    const uint2 c = __ldg(reinterpret_cast<const uint2*>(rec + d0));
    r.w.x = c.x;
    r.w.y = c.y;
    r.scale = num::e8m0_to_f32(__ldg(rec + l.scale_off + d0 / 64));
  } else {
    r.w.x = __ldg(reinterpret_cast<const uint32_t*>(rec + d0 / 2));
    r.scale = num::e4m3_decode(__ldg(rec + l.scale_off + d0 / 16));
  }
  return r;
}
// The piece as 8 bf16 values: piece_bf16's values for the same bytes.
__device__ __forceinline__ uint4 rec_piece_bf16(const RecPiece& r, uint64_t kp, const KvRecordLayout& l, int piece) {
  if (!kp) return make_uint4(0, 0, 0, 0);
  if (l.kind == KvRecordKind::kBf16 || 8 * piece >= l.nope) return r.w;
  if (l.kind == KvRecordKind::kFp8)
    return make_uint4(e4m3x2_scaled(r.w.x & 0xffffu, r.scale), e4m3x2_scaled(r.w.x >> 16, r.scale),
                      e4m3x2_scaled(r.w.y & 0xffffu, r.scale), e4m3x2_scaled(r.w.y >> 16, r.scale));
  return make_uint4(e2m1x2_scaled(r.w.x, 0, r.scale), e2m1x2_scaled(r.w.x, 1, r.scale),
                    e2m1x2_scaled(r.w.x, 2, r.scale), e2m1x2_scaled(r.w.x, 3, r.scale));
}

// The producers' walk over the block's (row, chunk) items in order.
struct ItemIter {
  int64_t t = 0;
  int rloc = 0, c = 0, nch = 0;
  RowKeys rk;
  __device__ __forceinline__ void row(const AttnArgs& a, int nchunks) {
    if (t >= a.rows) return;
    rk = row_keys(a, t);
    nch = (rk.nk + kChunk - 1) / kChunk;
    nch = nch < nchunks ? nch : nchunks;
  }
  __device__ __forceinline__ bool valid(const AttnArgs& a) const { return t < a.rows; }
  __device__ __forceinline__ void next(const AttnArgs& a, int nchunks) {
    if (++c < nch) return;
    c = 0;
    t += gridDim.x;
    ++rloc;
    row(a, nchunks);
  }
};

template <int D, int NT>
__device__ void producer(const AttnArgs& a, int nchunks, int h0, uint8_t* smem) {
  using L = RowsLayout<D, NT>;
  constexpr int kPieces = D / 8;                        // pieces of 8 dims per key
  constexpr int kPer = kChunk * kPieces / kProducers;   // pieces per thread per chunk
  constexpr int kBatch = kPer < 16 ? kPer : 16;         // pieces in flight per thread
  static_assert(kPer % kBatch == 0, "whole batches");
  const int ptid = static_cast<int>(threadIdx.x) - kConsumers;
  uint64_t* sptr = reinterpret_cast<uint64_t*>(smem + L::kPtr);
  ItemIter it;
  it.t = blockIdx.x;
  it.row(a, nchunks);
  if (it.valid(a) && ptid < kChunk) sptr[ptid] = key_ptr(a, it.rk, ptid);
  int item = 0;
  for (; it.valid(a); ++item) {
    const int buf = item & 1;
    // The tile's previous chunk (item - 2) is done. Row rloc's queries overwrite row rloc - 2's,
    // whose chunks all precede item - 2 (row rloc - 1 has at least one), so they are done too.
    if (item >= 2) bar_sync(kBarEmpty + buf, kThreads);
    if (it.c == 0) load_q_rows<D, NT>(a, it.t, h0, smem + L::kQ + (it.rloc & 1) * L::kHeadsPB * L::kPitch, ptid);
    bar_sync(kBarProd, kProducers);  // this item's key pointers are in sptr[buf]; item - 1's readers are done
    const uint64_t* ptr = sptr + buf * kChunk;
    if (ptid < kChunk) smem[L::kOk + buf * kChunk + ptid] = ptr[ptid] != 0;
    uint8_t* tile = smem + L::kK + buf * kChunk * L::kPitch;
#pragma unroll 1
    for (int j0 = 0; j0 < kPer; j0 += kBatch) {
      RecPiece raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = (j0 + b) * kProducers + ptid;  // consecutive threads, consecutive pieces of a key
        raw[b] = load_rec_piece(ptr[i / kPieces], a.rec, i % kPieces);
      }
      if (j0 == 0) {  // the next item's key pointers (their list lookups overlap this batch's loads)
        it.next(a, nchunks);
        if (it.valid(a) && ptid < kChunk) sptr[(buf ^ 1) * kChunk + ptid] = key_ptr(a, it.rk, it.c * kChunk + ptid);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = (j0 + b) * kProducers + ptid;
        *reinterpret_cast<uint4*>(tile + (i / kPieces) * L::kPitch + (i % kPieces) * 16) =
            rec_piece_bf16(raw[b], ptr[i / kPieces], a.rec, i % kPieces);
      }
    }
    bar_arrive(kBarFull + buf, kThreads);
  }
  // The consumers' releases of the last two chunks, so every barrier generation completes.
  for (int i = item >= 2 ? item - 2 : 0; i < item; ++i) bar_sync(kBarEmpty + (i & 1), kThreads);
}

template <int D, int NT>
__device__ void consumer(const AttnArgs& a, int nchunks, int h0, float scale, uint8_t* smem) {
  using L = RowsLayout<D, NT>;
  constexpr int NTP = Parts<D>::NTP, kParts = Parts<D>::kParts, kHB = L::kHeadsPB;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  float* smax = reinterpret_cast<float*>(smem + L::kMax);
  float* ssum = reinterpret_cast<float*>(smem + L::kSum);
  const int key0 = 8 * warp + 2 * tq;  // this thread's keys key0, key0 + 1 (heads g: s[0..1], g+8: s[2..3])
  const int frag_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int dim0 = warp * (D / 8) + 2 * tq;
  int item = 0, rloc = 0;
  for (int64_t t = blockIdx.x; t < a.rows; t += gridDim.x, ++rloc) {
    const int nch = row_chunks(a, t, nchunks);
    const uint32_t sQ_u = smem_u32(smem + L::kQ + (rloc & 1) * kHB * L::kPitch);
    float orun[NT][kParts * NTP][4], mrun[NT][2], zrun[NT][2];
#pragma unroll
    for (int ht = 0; ht < NT; ++ht) {
#pragma unroll
      for (int n = 0; n < kParts * NTP; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) orun[ht][n][i] = 0.0f;
      mrun[ht][0] = mrun[ht][1] = -INFINITY;
      zrun[ht][0] = zrun[ht][1] = 0.0f;
    }
#pragma unroll 1
    for (int c = 0; c < nch; ++c, ++item) {
      const int buf = item & 1;
      bar_sync(kBarFull + buf, kThreads);
      const uint32_t sK_u = smem_u32(smem + L::kK + buf * kChunk * L::kPitch);
      // S = Q K^T for keys [8 warp, 8 warp + 8), each head tile: k steps alternate between two
      // accumulators (attend_chunk's order); the keys' fragments are shared by the head tiles.
      float s0[NT][4], s1[NT][4];
#pragma unroll
      for (int ht = 0; ht < NT; ++ht)
#pragma unroll
        for (int i = 0; i < 4; ++i) s0[ht][i] = s1[ht][i] = 0.0f;
      {
        const uint32_t b_addr = sK_u + (8 * warp + (lane & 7)) * L::kPitch + (lane >> 3) * 16;
        const uint32_t a_addr = sQ_u + frag_row * L::kPitch + (lane >> 4) * 16;
#pragma unroll 2
        for (int k0 = 0; k0 < D; k0 += 32) {
          uint32_t b[4];
          ldsm_x4(b, b_addr + 2 * k0);
#pragma unroll
          for (int ht = 0; ht < NT; ++ht) {
            uint32_t a0[4], a1[4];
            ldsm_x4(a0, a_addr + ht * kHeads * L::kPitch + 2 * k0);
            ldsm_x4(a1, a_addr + ht * kHeads * L::kPitch + 2 * k0 + 32);
            mma::mma_bf16(s0[ht], a0, b[0], b[1]);
            mma::mma_bf16(s1[ht], a1, b[2], b[3]);
          }
        }
      }
      const uint8_t* ok = smem + L::kOk + buf * kChunk;
      const bool ok0 = ok[key0] != 0, ok1 = ok[key0 + 1] != 0;
      float s[NT][4];
#pragma unroll
      for (int ht = 0; ht < NT; ++ht) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          s[ht][i] = ((i & 1) ? ok1 : ok0) ? mul_rn(add_rn(s0[ht][i], s1[ht][i]), scale) : -INFINITY;
        float mx0 = fmaxf(s[ht][0], s[ht][1]), mx1 = fmaxf(s[ht][2], s[ht][3]);
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
          mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
          mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
        }
        if (tq == 0) {
          smax[warp * kHB + ht * kHeads + g] = mx0;
          smax[warp * kHB + ht * kHeads + g + 8] = mx1;
        }
      }
      bar_sync(kBarCons, kConsumers);
      float mc[NT][2], zc[NT][2];
#pragma unroll
      for (int ht = 0; ht < NT; ++ht) {
        float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
        for (int w = 0; w < kConsumerWarps; ++w) {
          m0 = fmaxf(m0, smax[w * kHB + ht * kHeads + g]);
          m1 = fmaxf(m1, smax[w * kHB + ht * kHeads + g + 8]);
        }
        mc[ht][0] = m0;
        mc[ht][1] = m1;
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = s[ht][i] == -INFINITY ? 0.0f : expf(sub_rn(s[ht][i], i < 2 ? m0 : m1));
        float z0 = add_rn(p[0], p[1]), z1 = add_rn(p[2], p[3]);
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
          z0 = add_rn(z0, __shfl_xor_sync(0xffffffffu, z0, o));
          z1 = add_rn(z1, __shfl_xor_sync(0xffffffffu, z1, o));
        }
        if (tq == 0) {
          ssum[warp * kHB + ht * kHeads + g] = z0;
          ssum[warp * kHB + ht * kHeads + g + 8] = z1;
        }
        // p = p1 + p2 + p3, each term the bf16 rounding of what is left (attend_chunk's planes)
        float rem[4] = {p[0], p[1], p[2], p[3]};
#pragma unroll
        for (int j = 0; j < kPTerms; ++j) {
          float hb[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            hb[i] = num::round_bf16(rem[i]);
            rem[i] = sub_rn(rem[i], hb[i]);
          }
          uint8_t* plane = smem + L::kP + (ht * kPTerms + j) * kHeads * kPPitch + key0 * 2;
          *reinterpret_cast<uint32_t*>(plane + g * kPPitch) = bf16x2(hb[0], hb[1]);
          *reinterpret_cast<uint32_t*>(plane + (g + 8) * kPPitch) = bf16x2(hb[2], hb[3]);
        }
      }
      bar_sync(kBarCons, kConsumers);
#pragma unroll
      for (int ht = 0; ht < NT; ++ht) {
        zc[ht][0] = zc[ht][1] = 0.0f;
#pragma unroll
        for (int w = 0; w < kConsumerWarps; ++w) {
          zc[ht][0] = add_rn(zc[ht][0], ssum[w * kHB + ht * kHeads + g]);
          zc[ht][1] = add_rn(zc[ht][1], ssum[w * kHB + ht * kHeads + g + 8]);
        }
      }
      // O_c = P V per head tile and part, folded into the row's running state as it is produced
#pragma unroll
      for (int ht = 0; ht < NT; ++ht) {
        const uint32_t p_addr = smem_u32(smem + L::kP + ht * kPTerms * kHeads * kPPitch) + frag_row * kPPitch +
                                (lane >> 4) * 16;
        float al[2], be[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float mnew;
          fold_coef(mrun[ht][i], mc[ht][i], mnew, al[i], be[i]);
          zrun[ht][i] = fold(zrun[ht][i], zc[ht][i], al[i], be[i]);
          mrun[ht][i] = mnew;
        }
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          float oc[NTP][4];
#pragma unroll
          for (int n = 0; n < NTP; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) oc[n][i] = 0.0f;
          const int pdim0 = warp * (D / 8) + part * NTP * 8;
          const uint32_t v_addr = sK_u + frag_row * L::kPitch + (pdim0 + (lane >> 4) * 8) * 2;
#pragma unroll 1
          for (int ks = 0; ks < kChunk / 16; ++ks) {
            uint32_t pa[kPTerms][4];
#pragma unroll
            for (int j = 0; j < kPTerms; ++j) ldsm_x4(pa[j], p_addr + j * kHeads * kPPitch + ks * 32);
#pragma unroll
            for (int n2 = 0; n2 < NTP / 2; ++n2) {
              uint32_t b[4];
              ldsm_x4_trans(b, v_addr + ks * 16 * L::kPitch + n2 * 32);
#pragma unroll
              for (int j = 0; j < kPTerms; ++j) {
                mma::mma_bf16(oc[2 * n2], pa[j], b[0], b[1]);
                mma::mma_bf16(oc[2 * n2 + 1], pa[j], b[2], b[3]);
              }
            }
          }
#pragma unroll
          for (int n = 0; n < NTP; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              orun[ht][part * NTP + n][i] = fold(orun[ht][part * NTP + n][i], oc[n][i], al[i >> 1], be[i >> 1]);
        }
      }
      bar_arrive(kBarEmpty + buf, kThreads);  // the tile, its mask bytes and (for this row) its queries are read
    }
    // the row's outputs (the folding block's epilogue)
    const int64_t pos = a.m.positions[t];
#pragma unroll
    for (int ht = 0; ht < NT; ++ht)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int h = h0 + ht * kHeads + g + 8 * i;
        if (h >= a.heads) continue;
        const float zt = add_rn(zrun[ht][i], expf(sub_rn(a.sink[h], mrun[ht][i])));
        float* o = a.out + (t * a.heads + h) * D + dim0;
#pragma unroll
        for (int n = 0; n < kParts * NTP; ++n) {
          float pr[2] = {finish(orun[ht][n][2 * i], zt), finish(orun[ht][n][2 * i + 1], zt)};
          out_rope<D>(a, dim0 + 8 * n, pos, pr);
          *reinterpret_cast<float2*>(o + 8 * n) = make_float2(pr[0], pr[1]);
        }
      }
  }
}

// grid (row blocks, head groups of NT * 16); 384 threads: consumer warps 0-7, producer warps 8-11.
template <int D, int NT>
__global__ void __launch_bounds__(kThreads, 1) rows_kernel(AttnArgs a, int nchunks, float scale) {
  extern __shared__ __align__(16) uint8_t smem[];
  kernels::cuda::pdl_wait();
  const int h0 = static_cast<int>(blockIdx.y) * NT * kHeads;
  if (threadIdx.x >= kConsumers) producer<D, NT>(a, nchunks, h0, smem);
  else consumer<D, NT>(a, nchunks, h0, scale, smem);
  kernels::cuda::pdl_trigger();
}

template <int D, int NT>
bool launch(const AttnArgs& a, cudaStream_t s, float scale) {
  constexpr size_t smem = RowsLayout<D, NT>::kBytes;
  const kernels::cuda::DecodeLaunchLimits& lim = kernels::cuda::decode_launch_limits();
  if (static_cast<size_t>(lim.smem_per_block) < smem) return false;
  const int nchunks = std::max(1, (a.max_keys + kChunk - 1) / kChunk);
  const int groups = (a.heads + NT * kHeads - 1) / (NT * kHeads);
  const int sms = a.sm_count > 0 ? a.sm_count : lim.sms;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(a.rows, std::max(1, sms / groups)));
  auto k = rows_kernel<D, NT>;
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
  kernels::cuda::launch_pdl(k, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(groups)), dim3(kThreads),
                            smem, s, a, nchunks, scale);
  return true;
}

template <int D>
bool launch_d(const AttnArgs& a, cudaStream_t s, float scale) {
  return a.heads <= kHeads ? launch<D, 1>(a, s, scale) : launch<D, 2>(a, s, scale);
}

}  // namespace

size_t rows_kernel_smem(int hd) {
  switch (hd) {
    case 128: return RowsLayout<128, 2>::kBytes;
    case 256: return RowsLayout<256, 2>::kBytes;
    default: return RowsLayout<512, 2>::kBytes;
  }
}

bool launch_rows_kernel(const AttnArgs& a, cudaStream_t s, float scale) {
  if (!a.step_rec) return false;  // its producers read records only
  switch (a.hd) {
    case 128: return launch_d<128>(a, s, scale);
    case 256: return launch_d<256>(a, s, scale);
    default: return launch_d<512>(a, s, scale);
  }
}

}  // namespace tandem::cuda_model::attn
