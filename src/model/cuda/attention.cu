// The target's MQA attention (attention.h): flash decoding on the tensor cores over 64-key chunks,
// every KV record decoded once per 16 heads. A chunk's keys are decoded from their records into a
// bf16 tile in shared memory (records: e4m3 x E8M0, e2m1 x e4m3 and bf16 are exact in bf16), then
// S = Q K^T (m16n8k16 bf16 mma, 16 heads x 8 keys per warp), the chunk's max and fp32 softmax
// numerators, p split exactly into three bf16 planes, and O_c = P V (8 warps x hd/8 dims, three mma
// per fragment, key order). The chunks are folded in list order, either in registers by a block
// that walks its row's chunks (prefill, large batches) or, split over the chunks, from each chunk's
// (m_c, z_c, O_c) in `partial` by the last block of the (row, head tile) to finish its chunk
// (counted in AttnArgs::arrivals; short key lists) or by fold_kernel: the same operations on the
// same values, so all give the same bits. A split launch may take 16, 8 or 4 heads per block (a
// 16-row mma tile with zero queries past the block's heads: each head's dots are its own), so a
// batch-1 step spreads its chunks over more multiprocessors and the in-kernel fold reads less.
#include "model/cuda/attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "common/numeric_core.h"
#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {
namespace {

namespace mma = kernels::cuda::mma;
using kernels::cuda::add_rn;
using kernels::cuda::div_rn;
using kernels::cuda::mul_rn;
using kernels::cuda::sub_rn;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = kAttnChunk;        // keys per chunk: one 8-key n-tile per warp in Q K^T
constexpr int kHeads = kAttnHeadTile;     // heads per block: one mma m-tile
constexpr int kPTerms = 3;                // p = p1 + p2 + p3 with each term a bf16 value (exact)
constexpr int kPPitch = kChunk * 2 + 16;  // bytes per row of a P plane (+16: ldmatrix rows in distinct banks)
constexpr int kFoldGroup = 128;           // chunks per pass of fold_kernel's shared arrays
// The in-kernel fold: at most this many chunks per row (its coefficients live in the key tile's
// shared memory), and by default only while one block reads at most kInlineFoldBytes of partials
// (beyond that fold_kernel's blocks per (row, head) read them faster than one multiprocessor).
constexpr int kInlineMaxChunks = kAttnInlineMaxChunks;
// Record loads in flight per thread: a split block runs one chunk (the registers are free), a
// folding block carries its running O through the loads.
constexpr int kSplitBatch = 8;
constexpr int64_t kInlineFoldBytes = 128 << 10;
static_assert(kChunk == 8 * kWarps, "one 8-key n-tile per warp");
static_assert(kHeads == 16, "one m16 tile of heads");

// Shared memory of one block (byte offsets, every one a multiple of 16).
template <int D>
struct Layout {
  static constexpr int kPitch = 2 * D + 16;                     // bytes per bf16 row of K/V and Q
  static constexpr int kK = 0;                                  // [kChunk][kPitch] keys (= values)
  static constexpr int kQ = kK + kChunk * kPitch;               // [kHeads][kPitch] queries
  static constexpr int kP = kQ + kHeads * kPitch;               // [kPTerms][kHeads][kPPitch] p planes
  static constexpr int kPtr = kP + kPTerms * kHeads * kPPitch;  // [kChunk] tagged key pointers
  static constexpr int kMax = kPtr + kChunk * 8;                // [kWarps][kHeads] warp maxima
  static constexpr int kSum = kMax + kWarps * kHeads * 4;       // [kWarps][kHeads] warp sums
  static constexpr int kRow = kSum + kWarps * kHeads * 4;       // the row's RowKeys
  static constexpr int kBytes = kRow + 64;
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
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) { return mma::f32x2_to_bf16x2(lo, hi); }
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// ---- the row's key list ----
struct RowKeys {
  int64_t w0 = 0, start = 0, vis = 0, row0 = 0;
  int nwin = 0, ncomp = 0, nk = 0, seq = 0;
  const uint8_t* slot = nullptr;
  const int32_t* top = nullptr;
};

__device__ __forceinline__ RowKeys row_keys(const AttnArgs& a, int64_t t) {
  RowKeys r;
  const StepMeta& m = a.m;
  const int64_t p = m.positions[t];
  r.seq = m.row_seq[t];
  r.start = m.seq_start[r.seq];
  r.row0 = m.seq_row0[r.seq];
  r.slot = a.slot_state + static_cast<int64_t>(m.seq_slot[r.seq]) * a.slot_bytes;
  r.w0 = p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  r.nwin = static_cast<int>(p - r.w0 + 1);
  if (a.ratio) {
    r.vis = (p + 1) / a.ratio;
    if (a.topk) {
      r.top = a.topk + t * a.topk_ld;
      r.ncomp = static_cast<int>(r.vis < a.topk_k ? r.vis : a.topk_k);
    } else {
      r.ncomp = static_cast<int>(r.vis);
    }
  }
  r.nk = r.nwin + r.ncomp;
  return r;
}

// Key j of the row's list as a pointer with a tag in bit 0 (1 = this step's fp32 row, 0 = a KV
// record); 0 = masked (past the list, or an id the list does not make visible).
__device__ __forceinline__ uint64_t key_ptr(const AttnArgs& a, const RowKeys& r, int j) {
  if (j < r.nwin) {
    const int64_t wp = r.w0 + j;
    if (wp >= r.start) return reinterpret_cast<uint64_t>(a.step_kv + (r.row0 + (wp - r.start)) * a.hd) | 1u;
    return reinterpret_cast<uint64_t>(r.slot + a.win_off + (wp % a.win_ring) * a.rec.bytes);
  }
  const int i = j - r.nwin;
  if (i >= r.ncomp) return 0;
  const int64_t id = r.top ? static_cast<int64_t>(r.top[i]) : i;
  if (id < 0 || id >= r.vis) return 0;
  const int64_t pos = static_cast<int64_t>(a.ratio) * id;
  const int32_t blk = a.m.block_tables[static_cast<int64_t>(r.seq) * a.m.max_blocks + pos / a.m.block_size];
  return reinterpret_cast<uint64_t>(a.pool + static_cast<int64_t>(blk) * a.block_bytes + a.pool_main +
                                    ((pos % a.m.block_size) / a.ratio) * a.rec.bytes);
}

// Every 128-byte line of key kp (key_ptr's tagged pointer) into the L2: the chunk's loads below run
// in rounds of a few per thread, and all but the first then hit the L2 (a hint: bits unchanged).
__device__ __forceinline__ void key_prefetch(const AttnArgs& a, uint64_t kp) {
  if (!kp) return;
  const uint64_t p = kp & ~uint64_t{1};
  const uint64_t end = p + ((kp & 1) ? static_cast<uint64_t>(a.hd) * 4 : static_cast<uint64_t>(a.rec.bytes));
  for (uint64_t line = p & ~uint64_t{127}; line < end; line += 128) prefetch_l2(reinterpret_cast<const void*>(line));
}

// Dims [8 piece, 8 piece + 8) of a key, as loaded (decoded by piece_bf16). Records are 8-byte
// aligned (kv_record.h sizes, 16-byte ring and pool offsets), fp32 rows 16-byte aligned.
struct RawPiece {
  uint4 w0, w1;      // fp32 row: 8 floats; bf16 dims: w0; fp8: w0.xy codes; nvfp4: w0.x codes
  float scale;
  int mode;          // 0 masked, 1 fp32 row, 2 bf16 dims, 3 fp8 codes, 4 nvfp4 codes
};

__device__ __forceinline__ RawPiece load_piece(uint64_t kp, const KvRecordLayout& l, int piece) {
  RawPiece r;
  r.w0 = r.w1 = make_uint4(0, 0, 0, 0);
  r.scale = 0.0f;
  r.mode = 0;
  if (!kp) return r;
  const int d0 = 8 * piece;
  if (kp & 1) {
    const uint4* f = reinterpret_cast<const uint4*>(kp & ~uint64_t{1}) + 2 * piece;
    r.w0 = __ldg(f);
    r.w1 = __ldg(f + 1);
    r.mode = 1;
    return r;
  }
  const uint8_t* rec = reinterpret_cast<const uint8_t*>(kp);
  if (l.kind == KvRecordKind::kBf16 || d0 >= l.nope) {
    const uint8_t* src = l.kind == KvRecordKind::kBf16 ? rec + 2 * d0 : rec + l.rope_off + 2 * (d0 - l.nope);
    const uint2 lo = __ldg(reinterpret_cast<const uint2*>(src)), hi = __ldg(reinterpret_cast<const uint2*>(src + 8));
    r.w0 = make_uint4(lo.x, lo.y, hi.x, hi.y);
    r.mode = 2;
  } else if (l.kind == KvRecordKind::kFp8) {
    const uint2 c = __ldg(reinterpret_cast<const uint2*>(rec + d0));
    r.w0.x = c.x;
    r.w0.y = c.y;
    r.scale = num::e8m0_to_f32(__ldg(rec + l.scale_off + d0 / 64));
    r.mode = 3;
  } else {
    r.w0.x = __ldg(reinterpret_cast<const uint32_t*>(rec + d0 / 2));
    r.scale = num::e4m3_decode(__ldg(rec + l.scale_off + d0 / 16));
    r.mode = 4;
  }
  return r;
}

__device__ __forceinline__ uint32_t e4m3x2_scaled(uint32_t two_codes, float s) {
  const float2 f = mma::f16x2_to_f32x2(mma::e4m3x2_to_f16x2(two_codes));
  return bf16x2(mul_rn(f.x, s), mul_rn(f.y, s));
}
__device__ __forceinline__ uint32_t e2m1x2_scaled(uint32_t codes, int i, float s) {
  return bf16x2(mul_rn(num::e2m1_decode(static_cast<uint8_t>((codes >> (8 * i)) & 0xfu)), s),
                mul_rn(num::e2m1_decode(static_cast<uint8_t>((codes >> (8 * i + 4)) & 0xfu)), s));
}

// The piece as 8 bf16 values: the values kv_record_get decodes (exact products, exact in bf16).
__device__ __forceinline__ uint4 piece_bf16(const RawPiece& r) {
  switch (r.mode) {
    case 1:
      return make_uint4(bf16x2(__uint_as_float(r.w0.x), __uint_as_float(r.w0.y)),
                        bf16x2(__uint_as_float(r.w0.z), __uint_as_float(r.w0.w)),
                        bf16x2(__uint_as_float(r.w1.x), __uint_as_float(r.w1.y)),
                        bf16x2(__uint_as_float(r.w1.z), __uint_as_float(r.w1.w)));
    case 2:
      return r.w0;
    case 3:
      return make_uint4(e4m3x2_scaled(r.w0.x & 0xffffu, r.scale), e4m3x2_scaled(r.w0.x >> 16, r.scale),
                        e4m3x2_scaled(r.w0.y & 0xffffu, r.scale), e4m3x2_scaled(r.w0.y >> 16, r.scale));
    case 4:
      return make_uint4(e2m1x2_scaled(r.w0.x, 0, r.scale), e2m1x2_scaled(r.w0.x, 1, r.scale),
                        e2m1x2_scaled(r.w0.x, 2, r.scale), e2m1x2_scaled(r.w0.x, 3, r.scale));
    default:
      return make_uint4(0, 0, 0, 0);
  }
}

// ---- the fold (the same operations in both launch shapes) ----
__device__ __forceinline__ void fold_coef(float m, float mc, float& mnew, float& alpha, float& beta) {
  mnew = fmaxf(m, mc);
  alpha = m == mnew ? 1.0f : expf(sub_rn(m, mnew));
  beta = mc == mnew ? 1.0f : expf(sub_rn(mc, mnew));
}
__device__ __forceinline__ float fold(float acc, float part, float alpha, float beta) {
  return add_rn(mul_rn(acc, alpha), mul_rn(part, beta));
}
// zt = z + exp(sink - m): out = bf16(o / zt).
__device__ __forceinline__ float finish(float o, float zt) { return num::round_bf16(div_rn(o, zt)); }

// The output's inverse RoPE (AttnArgs::out_inv_freq) of the pair (x[0], x[1]) at dims (dim, dim + 1)
// of a head (dim even), row position pos: rope()'s pair operation where the pair is in the rotated tail.
template <int D>
__device__ __forceinline__ void out_rope(const AttnArgs& a, int dim, int64_t pos, float (&x)[2]) {
  const int r0 = D - a.out_rope_dim;
  if (!a.out_inv_freq || dim < r0) return;
  kernels::cuda::row::rope_pair(x, pos, a.out_inv_freq[(dim - r0) / 2], true, true);
}

// The block's query heads [h0, h0 + ht) of row t as bf16 rows of the 16-row tile (zeros past the
// block's heads and past the last head). Every load of the thread is issued before the first store.
template <int D>
__device__ __forceinline__ void load_q(const AttnArgs& a, int64_t t, int h0, int ht, uint8_t* sQ) {
  constexpr int kPieces = D / 8;
  constexpr int kPer = kHeads * kPieces / kThreads;  // 4, 2, 1
  static_assert(kHeads * kPieces % kThreads == 0, "whole rounds");
  float4 x[kPer], y[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = k * kThreads + threadIdx.x, hl = i / kPieces, piece = i % kPieces;
    x[k] = y[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (hl < ht && h0 + hl < a.heads) {
      const float4* f = reinterpret_cast<const float4*>(a.q + (t * a.heads + h0 + hl) * D) + 2 * piece;
      x[k] = f[0];
      y[k] = f[1];
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = k * kThreads + threadIdx.x, hl = i / kPieces, piece = i % kPieces;
    *reinterpret_cast<uint4*>(sQ + hl * Layout<D>::kPitch + piece * 16) =
        make_uint4(bf16x2(x[k].x, x[k].y), bf16x2(x[k].z, x[k].w), bf16x2(y[k].x, y[k].y), bf16x2(y[k].z, y[k].w));
  }
}

// Chunk c of the row (rk: the row's key list, in shared memory). The chunk's max and sum for heads
// g and g + 8 (g = lane / 4) of this thread, then O_c in parts: consume(part, oc, mc, zc) gets the
// thread's mma fragments of dims [dim0 + part * D/8/kParts, +D/8/kParts) (dim0 = warp * D/8):
// oc[n][0..1] = head g, oc[n][2..3] = head g + 8, at dims + 8n + 2 (lane % 4) + {0, 1}. Parts keep
// the fragments of a fold and of the next part's products from being live at once. Begins with
// __syncthreads(); with kKeysReady the caller has filled the chunk's key pointers (kPtr) and
// synchronized, and rk is not read.
template <int D>
struct Parts {
  static constexpr int NT = D / 64;                // 8-dim n-tiles per warp
  static constexpr int kParts = NT >= 4 ? 2 : 1;
  static constexpr int NTP = NT / kParts;          // n-tiles per part (even: x4.trans loads pairs)
};
template <int D, int kMaxBatch, bool kKeysReady, typename Consume>
__device__ __forceinline__ void attend_chunk(const AttnArgs& a, const RowKeys& rk, int c, uint8_t* smem, float scale,
                                             Consume&& consume) {
  using L = Layout<D>;
  constexpr int kPieces = D / 8;
  constexpr int kIters = kChunk * kPieces / kThreads;
  constexpr int kBatch = kIters < kMaxBatch ? kIters : kMaxBatch;  // loads in flight per thread
  constexpr int NTP = Parts<D>::NTP;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  uint8_t* sK = smem + L::kK;
  uint8_t* sP = smem + L::kP;
  uint64_t* sptr = reinterpret_cast<uint64_t*>(smem + L::kPtr);
  float* smax = reinterpret_cast<float*>(smem + L::kMax);
  float* ssum = reinterpret_cast<float*>(smem + L::kSum);

  if (!kKeysReady) {
    __syncthreads();  // the previous chunk's readers of every shared array are done
    if (tid < kChunk) {
      const uint64_t kp = key_ptr(a, rk, c * kChunk + tid);
      sptr[tid] = kp;
      key_prefetch(a, kp);
    }
    __syncthreads();
  }
  // 1. the chunk's keys as bf16 rows (masked keys as zeros: 0 * 0 in P V)
#pragma unroll 1
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    RawPiece raw[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (i0 + b) * kThreads + tid;
      raw[b] = load_piece(sptr[i / kPieces], a.rec, i % kPieces);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (i0 + b) * kThreads + tid;
      *reinterpret_cast<uint4*>(sK + (i / kPieces) * L::kPitch + (i % kPieces) * 16) = piece_bf16(raw[b]);
    }
  }
  __syncthreads();

  // 2. S = Q K^T for keys [8 warp, 8 warp + 8): k steps alternate between two accumulators
  const uint32_t sK_u = smem_u32(sK);
  float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  {
    const uint32_t b_addr = sK_u + (8 * warp + (lane & 7)) * L::kPitch + (lane >> 3) * 16;
    const uint32_t a_addr = smem_u32(smem + L::kQ) + ((lane & 7) + ((lane >> 3) & 1) * 8) * L::kPitch + (lane >> 4) * 16;
#pragma unroll 4
    for (int k0 = 0; k0 < D; k0 += 32) {
      uint32_t b[4], a0[4], a1[4];
      ldsm_x4(b, b_addr + 2 * k0);        // b0, b1 of k0 and of k0 + 16
      ldsm_x4(a0, a_addr + 2 * k0);
      ldsm_x4(a1, a_addr + 2 * k0 + 32);
      mma::mma_bf16(s0, a0, b[0], b[1]);
      mma::mma_bf16(s1, a1, b[2], b[3]);
    }
  }
  const int key0 = 8 * warp + 2 * tq;  // this thread's keys key0, key0 + 1 (heads g: s[0..1], g+8: s[2..3])
  const bool ok0 = sptr[key0] != 0, ok1 = sptr[key0 + 1] != 0;
  float s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = ((i & 1) ? ok1 : ok0) ? mul_rn(add_rn(s0[i], s1[i]), scale) : -INFINITY;

  // 3. the chunk's max per head (order-free), p = exp(s - m) in fp32, the per-warp sums
  float mx0 = fmaxf(s[0], s[1]), mx1 = fmaxf(s[2], s[3]);
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
  }
  if (tq == 0) {
    smax[warp * kHeads + g] = mx0;
    smax[warp * kHeads + g + 8] = mx1;
  }
  __syncthreads();
  float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    m0 = fmaxf(m0, smax[w * kHeads + g]);
    m1 = fmaxf(m1, smax[w * kHeads + g + 8]);
  }
  float p[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = s[i] == -INFINITY ? 0.0f : expf(sub_rn(s[i], i < 2 ? m0 : m1));
  float z0 = add_rn(p[0], p[1]), z1 = add_rn(p[2], p[3]);
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    z0 = add_rn(z0, __shfl_xor_sync(0xffffffffu, z0, o));
    z1 = add_rn(z1, __shfl_xor_sync(0xffffffffu, z1, o));
  }
  if (tq == 0) {
    ssum[warp * kHeads + g] = z0;
    ssum[warp * kHeads + g + 8] = z1;
  }
  // p = p1 + p2 + p3: each term is the bf16 rounding of what is left (exact: a float has 24
  // significant bits, each term takes at least 8), one plane per term.
  {
    float rem[4] = {p[0], p[1], p[2], p[3]};
#pragma unroll
    for (int j = 0; j < kPTerms; ++j) {
      float hb[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        hb[i] = num::round_bf16(rem[i]);
        rem[i] = sub_rn(rem[i], hb[i]);
      }
      uint8_t* plane = sP + j * kHeads * kPPitch + key0 * 2;
      *reinterpret_cast<uint32_t*>(plane + g * kPPitch) = bf16x2(hb[0], hb[1]);
      *reinterpret_cast<uint32_t*>(plane + (g + 8) * kPPitch) = bf16x2(hb[2], hb[3]);
    }
  }
  __syncthreads();
  float mc[2] = {m0, m1}, zc[2] = {0.0f, 0.0f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    zc[0] = add_rn(zc[0], ssum[w * kHeads + g]);
    zc[1] = add_rn(zc[1], ssum[w * kHeads + g + 8]);
  }

  // 4. O_c = P V: per 16-key step, the three planes in order
  const int frag_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const uint32_t p_addr = smem_u32(sP) + frag_row * kPPitch + (lane >> 4) * 16;
#pragma unroll
  for (int part = 0; part < Parts<D>::kParts; ++part) {
    float oc[NTP][4];
#pragma unroll
    for (int n = 0; n < NTP; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) oc[n][i] = 0.0f;
    const int dim0 = warp * (D / 8) + part * NTP * 8;
    const uint32_t v_addr = sK_u + frag_row * L::kPitch + (dim0 + (lane >> 4) * 8) * 2;
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
    consume(part, oc, mc, zc);
  }
}

// The in-kernel fold of a split launch, run by every block after its chunk's partials are written:
// the block counts itself in (row t, head tile) arrivals; the last of the row's nch blocks resets the
// counter (the next launch finds it zero) and folds the tile's chunks in list order with fold_kernel's
// operations (fold_coef per chunk, then the sink and finish: the same bits). Its coefficients take
// the key tile's shared memory (the chunk is done), the partials are read through the L2 (__ldcg:
// other blocks wrote them during this launch).
template <int D>
__device__ __forceinline__ void fold_in_block(const AttnArgs& a, int64_t t, int h0, int ht, int nch, int nchunks,
                                              uint8_t* smem) {
  using L = Layout<D>;
  const int tid = threadIdx.x, H = a.heads;
  int* s_last = reinterpret_cast<int*>(smem + L::kRow);  // RowKeys' place: unused by a split block
  __threadfence();  // this thread's partials, visible to the GPU before the block's arrival
  __syncthreads();
  if (tid == 0) {
    int* count = a.arrivals + t * gridDim.y + blockIdx.y;
    const int last = atomicAdd(count, 1) == nch - 1;
    if (last) atomicExch(count, 0);  // every block of the tile has arrived: none counts after this
    *s_last = last;
  }
  __syncthreads();
  if (!*s_last) return;
  __threadfence();  // the other blocks' partials (fenced before their arrivals) before the reads below

  float* s_al = reinterpret_cast<float*>(smem + L::kK);  // [ht][nch] m_c, then alpha_c
  float* s_be = s_al + ht * nch;                        // [ht][nch] z_c, then beta_c
  float* s_zt = reinterpret_cast<float*>(smem + L::kMax);  // [ht] z + exp(sink - m)
  const int64_t slot0 = t * nchunks;
  const float* pml = a.partial + a.partial_slots * H * D + slot0 * H * 2;
  for (int i = tid; i < ht * nch; i += kThreads) {
    const int hl = i / nch, c = i % nch, h = h0 + hl;
    const bool ok = h < H;  // past the last head: zeros (never stored)
    s_al[i] = ok ? __ldcg(pml + static_cast<int64_t>(c) * H * 2 + h * 2) : 0.0f;
    s_be[i] = ok ? __ldcg(pml + static_cast<int64_t>(c) * H * 2 + h * 2 + 1) : 0.0f;
  }
  __syncthreads();
  if (tid < ht && h0 + tid < H) {
    float m = -INFINITY, z = 0.0f;
    for (int c = 0; c < nch; ++c) {
      const int i = tid * nch + c;
      float mnew, al, be;
      fold_coef(m, s_al[i], mnew, al, be);
      z = fold(z, s_be[i], al, be);
      m = mnew;
      s_al[i] = al;
      s_be[i] = be;
    }
    s_zt[tid] = add_rn(z, expf(sub_rn(a.sink[h0 + tid], m)));
  }
  __syncthreads();
  // Elements k * kThreads + tid of the tile's [ht][D] outputs, k < per, in groups of kG (a warp's 32
  // elements lie in one head: D is a multiple of 32); heads past the last read the last head's
  // partials and are not stored, so every lane takes part in the pair shuffle.
  constexpr int kG = 8;  // outputs per group: kG * 4 chunks' loads in flight
  const int per = ht * D / kThreads;  // 2 to 32 (ht >= 4, D >= 128): the last group may be short
  const float* po = a.partial + slot0 * H * D;
  const int64_t cstride = static_cast<int64_t>(H) * D;
  const int64_t pos = a.m.positions[t];
#pragma unroll 1
  for (int k0 = 0; k0 < per; k0 += kG) {
    float o[kG];
#pragma unroll
    for (int k = 0; k < kG; ++k) o[k] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < nch; ++c) {
      const float* pc = po + c * cstride;
#pragma unroll
      for (int k = 0; k < kG; ++k) {
        if (k0 + k >= per) break;
        const int e = (k0 + k) * kThreads + tid, hl = e / D;
        const int h = h0 + hl < H ? h0 + hl : H - 1;
        o[k] = fold(o[k], __ldcg(pc + h * D + e % D), s_al[hl * nch + c], s_be[hl * nch + c]);
      }
    }
#pragma unroll
    for (int k = 0; k < kG; ++k) {
      if (k0 + k >= per) break;  // uniform over the block: every lane reaches the shuffle or none
      const int e = (k0 + k) * kThreads + tid, hl = e / D, d = e % D, h = h0 + hl;
      const float v = finish(o[k], s_zt[h < H ? hl : 0]);
      // fold_kernel's epilogue: the inverse RoPE's pair (d & ~1, d | 1) in lanes tid, tid ^ 1 (d and
      // tid have the same parity: kThreads and D are even)
      const float other = __shfl_xor_sync(0xffffffffu, v, 1);
      float pr[2] = {(d & 1) ? other : v, (d & 1) ? v : other};
      out_rope<D>(a, d & ~1, pos, pr);
      if (h < H) a.out[(t * H + h) * D + d] = pr[d & 1];
    }
  }
}

// grid: split (chunks, head tiles of ht heads, rows) -> partials, then the in-kernel fold when
// inline_fold; else (rows, head tiles of 16), folding in registers.
template <int D, bool kSplit>
__global__ void __launch_bounds__(kThreads, 2) mqa_kernel(AttnArgs a, int nchunks, float scale, int ht, int inline_fold) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int NTP = Parts<D>::NTP, kParts = Parts<D>::kParts;
  const int64_t t = kSplit ? blockIdx.z : blockIdx.x;
  const int h0 = static_cast<int>(blockIdx.y) * ht;
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int dim0 = (threadIdx.x >> 5) * (D / 8) + 2 * tq;
  if (kSplit) {
    if (t >= a.rows) {
      kernels::cuda::pdl_wait();
      return;
    }
    // Before the wait (the previous kernel may still run): the row's key list (AttnArgs::m is
    // written before the step's first kernel), the chunk's key pointers that this step's kernels do
    // not choose (the window's and the every-entry list's; a prefetch reads nothing into the
    // program) and their L2 prefetch. Every thread: the chunk count without a barrier.
    const RowKeys rk = row_keys(a, t);
    int nch = (rk.nk + kChunk - 1) / kChunk;
    nch = nch < nchunks ? nch : nchunks;
    const int c0 = static_cast<int>(blockIdx.x);
    const int j = c0 * kChunk + static_cast<int>(threadIdx.x);
    const bool early = j < rk.nwin || !rk.top;  // the top-k list is the previous kernels' output
    uint64_t kp = 0;
    if (c0 < nch && threadIdx.x < kChunk && early) {
      kp = key_ptr(a, rk, j);
      key_prefetch(a, kp);
    }
    kernels::cuda::pdl_wait();
    if (c0 >= nch) return;
    // The rest of the chunk's key pointers and their prefetch, then the queries' loads, one barrier.
    if (threadIdx.x < kChunk) {
      if (!early) {
        kp = key_ptr(a, rk, j);
        key_prefetch(a, kp);
      }
      reinterpret_cast<uint64_t*>(smem + Layout<D>::kPtr)[threadIdx.x] = kp;
    }
    load_q<D>(a, t, h0, ht, smem + Layout<D>::kQ);
    // The next kernel's blocks may be scheduled once every block has come here (or exited) and
    // prefetch (the output projection's weights) while the chunks run; they wait for this grid.
    kernels::cuda::pdl_trigger();
    __syncthreads();
    const int64_t slot = t * nchunks + c0;
    float* po = a.partial + slot * a.heads * D;
    float* pml = a.partial + a.partial_slots * a.heads * D + slot * a.heads * 2;
    attend_chunk<D, kSplitBatch, true>(a, rk, c0, smem, scale, [&](int part, float (&oc)[NTP][4], const float (&mc)[2], const float (&zc)[2]) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int h = h0 + g + 8 * i;
        if (g + 8 * i >= ht || h >= a.heads) continue;
#pragma unroll
        for (int n = 0; n < NTP; ++n)
          *reinterpret_cast<float2*>(po + h * D + dim0 + 8 * (part * NTP + n)) = make_float2(oc[n][2 * i], oc[n][2 * i + 1]);
        if (part == 0 && threadIdx.x < 32 && tq == 0) {
          pml[h * 2] = mc[i];
          pml[h * 2 + 1] = zc[i];
        }
      }
    });
    if (inline_fold) fold_in_block<D>(a, t, h0, ht, nch, nchunks, smem);
    return;
  }
  kernels::cuda::pdl_wait();
  if (t >= a.rows) return;
  RowKeys& rk = *reinterpret_cast<RowKeys*>(smem + Layout<D>::kRow);
  const int nk = row_keys(a, t).nk;  // every thread: the block's chunk count without a barrier
  int nch = (nk + kChunk - 1) / kChunk;
  nch = nch < nchunks ? nch : nchunks;
  if (nch <= 0) return;
  if (threadIdx.x == 0) rk = row_keys(a, t);  // read after attend_chunk's first barrier
  load_q<D>(a, t, h0, kHeads, smem + Layout<D>::kQ);

  float orun[kParts * NTP][4], mrun[2] = {-INFINITY, -INFINITY}, zrun[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < kParts * NTP; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) orun[n][i] = 0.0f;
#pragma unroll 1
  for (int c = 0; c < nch; ++c) {
    float al[2], be[2];
    attend_chunk<D, 4, false>(a, rk, c, smem, scale, [&](int part, float (&oc)[NTP][4], const float (&mc)[2], const float (&zc)[2]) {
      if (part == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float mnew;
          fold_coef(mrun[i], mc[i], mnew, al[i], be[i]);
          zrun[i] = fold(zrun[i], zc[i], al[i], be[i]);
          mrun[i] = mnew;
        }
      }
#pragma unroll
      for (int n = 0; n < NTP; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          orun[part * NTP + n][i] = fold(orun[part * NTP + n][i], oc[n][i], al[i >> 1], be[i >> 1]);
    });
  }
  kernels::cuda::pdl_trigger();
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int h = h0 + g + 8 * i;
    if (h >= a.heads) continue;
    const float zt = add_rn(zrun[i], expf(sub_rn(a.sink[h], mrun[i])));
    float* o = a.out + (t * a.heads + h) * D + dim0;
#pragma unroll
    for (int n = 0; n < kParts * NTP; ++n) {
      float pr[2] = {finish(orun[n][2 * i], zt), finish(orun[n][2 * i + 1], zt)};
      out_rope<D>(a, dim0 + 8 * n, a.m.positions[t], pr);  // dim0 is even: the pair is this thread's
      *reinterpret_cast<float2*>(o + 8 * n) = make_float2(pr[0], pr[1]);
    }
  }
}

// The fold of a split launch: one block per (row, head), one thread per dim, the chunks in order.
template <int D>
__global__ void __launch_bounds__(512) fold_kernel(AttnArgs a, int nchunks) {
  __shared__ float s_m[kFoldGroup], s_z[kFoldGroup], s_alpha[kFoldGroup], s_beta[kFoldGroup];
  __shared__ float s_mrun, s_zrun;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, H = a.heads, tid = threadIdx.x, lane = tid & 31;
  if (t >= a.rows) {
    kernels::cuda::pdl_wait();
    return;
  }
  // Before the wait: the row's key count (AttnArgs::m is written before the step's first kernel);
  // after it the next kernel may start its prefetch.
  const int nk = row_keys(a, t).nk;
  kernels::cuda::pdl_wait();
  kernels::cuda::pdl_trigger();
  int nch = (nk + kChunk - 1) / kChunk;
  nch = nch < nchunks ? nch : nchunks;
  const int64_t slot0 = t * nchunks;
  const float* __restrict__ po = a.partial + slot0 * H * D + static_cast<int64_t>(h) * D + tid;
  const float* __restrict__ pml = a.partial + a.partial_slots * H * D + slot0 * H * 2 + h * 2;
  const int64_t ostride = static_cast<int64_t>(H) * D;
  float o = 0.0f, carry = -INFINITY, zrun = 0.0f;  // carry: warp 0's running max
  for (int c0 = 0; c0 < nch; c0 += kFoldGroup) {
    const int ng = nch - c0 < kFoldGroup ? nch - c0 : kFoldGroup;
    __syncthreads();  // the previous group's readers are done
    for (int i = tid; i < ng; i += blockDim.x) {
      s_m[i] = pml[(c0 + i) * H * 2];
      s_z[i] = pml[(c0 + i) * H * 2 + 1];
    }
    __syncthreads();
    if (tid < 32) {
      // running max m_c' = max(m_0..m_c) by an inclusive scan (max is order-free), the coefficients
      // of each chunk against the running max before it (fold_coef's formulas)
      for (int i0 = 0; i0 < ng; i0 += 32) {
        const int i = i0 + lane;
        const float mc = i < ng ? s_m[i] : -INFINITY;
        float v = mc;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const float y = __shfl_up_sync(0xffffffffu, v, off);
          if (lane >= off) v = fmaxf(v, y);
        }
        v = fmaxf(v, carry);
        float prev = __shfl_up_sync(0xffffffffu, v, 1);
        if (lane == 0) prev = carry;
        if (i < ng) {
          s_alpha[i] = prev == v ? 1.0f : expf(sub_rn(prev, v));
          s_beta[i] = mc == v ? 1.0f : expf(sub_rn(mc, v));
        }
        carry = __shfl_sync(0xffffffffu, v, 31);
      }
    }
    __syncthreads();
    if (tid == 0)
      for (int i = 0; i < ng; ++i) zrun = fold(zrun, s_z[i], s_alpha[i], s_beta[i]);
#pragma unroll 16
    for (int i = 0; i < ng; ++i) o = fold(o, po[(c0 + i) * ostride], s_alpha[i], s_beta[i]);
  }
  if (tid == 0) {
    s_mrun = carry;
    s_zrun = zrun;
  }
  __syncthreads();
  const float v = finish(o, add_rn(s_zrun, expf(sub_rn(a.sink[h], s_mrun))));
  // The inverse RoPE's pair (tid & ~1, tid | 1) lives in two lanes of a warp (blockDim = D, full
  // warps): both compute it, each keeps its half. Every thread shuffles (no divergence around it).
  const float other = __shfl_xor_sync(0xffffffffu, v, 1);
  float pr[2] = {(tid & 1) ? other : v, (tid & 1) ? v : other};
  out_rope<D>(a, tid & ~1, a.m.positions[t], pr);
  a.out[(t * H + h) * D + tid] = pr[tid & 1];
}

// How attention() launches (plan_of): split or folding blocks, heads per block, where a split folds.
struct Plan {
  bool split = false, inline_fold = false;
  int nchunks = 1, ht = kHeads;
};

template <int D>
void launch(const AttnArgs& a, cudaStream_t s, const Plan& p, float scale) {
  constexpr size_t smem = Layout<D>::kBytes;
  const unsigned tiles = static_cast<unsigned>((a.heads + p.ht - 1) / p.ht);
  if (p.split) {
    auto k = mqa_kernel<D, true>;
    kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
    kernels::cuda::launch_pdl(k, dim3(static_cast<unsigned>(p.nchunks), tiles, static_cast<unsigned>(a.rows)),
                              dim3(kThreads), smem, s, a, p.nchunks, scale, p.ht, p.inline_fold ? 1 : 0);
    if (!p.inline_fold)
      kernels::cuda::launch_pdl(fold_kernel<D>, dim3(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.heads)),
                                dim3(D), 0, s, a, p.nchunks);
  } else {
    auto k = mqa_kernel<D, false>;
    kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
    kernels::cuda::launch_pdl(k, dim3(static_cast<unsigned>(a.rows), tiles), dim3(kThreads), smem, s, a, p.nchunks,
                              scale, kHeads, 0);
  }
}

int chunks_of(const AttnArgs& a) { return std::max(1, (a.max_keys + kChunk - 1) / kChunk); }

int sm_count_of(const AttnArgs& a) {
  int sms = a.sm_count;
  if (sms <= 0) {
    int dev = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return sms;
}

Plan plan_of(const AttnArgs& a) {
  Plan p;
  p.nchunks = chunks_of(a);
  const int64_t tiles16 = (a.heads + kHeads - 1) / kHeads;
  if (!a.partial || p.nchunks < 2 || a.rows * p.nchunks > a.partial_slots || a.rows > 65535) return p;
  const int sms = sm_count_of(a);
  // Folding blocks fill the GPU by themselves from one block per multiprocessor on.
  if (a.rows * tiles16 >= sms) return p;
  p.split = true;
  // Heads per block: halved while the blocks of the smaller tile still fit one wave (a batch-1 step's
  // chunks over more multiprocessors; the per-block work is the chunk's decode either way).
  if (a.head_tile) {
    TANDEM_CHECK_MSG(a.head_tile == 16 || a.head_tile == 8 || a.head_tile == 4, "attention: head_tile must be 16, 8 or 4");
    p.ht = a.head_tile;
  } else {
    while (p.ht > 4 && a.rows * p.nchunks * ((a.heads + p.ht / 2 - 1) / (p.ht / 2)) <= sms) p.ht /= 2;
  }
  const int64_t tiles = (a.heads + p.ht - 1) / p.ht;
  if (a.arrivals && a.rows * tiles <= a.arrival_slots && p.nchunks <= kInlineMaxChunks && a.fold_inline != 0)
    p.inline_fold = a.fold_inline == 1 ||
                    static_cast<int64_t>(p.ht) * a.hd * 4 * p.nchunks <= kInlineFoldBytes;  // one block's partials
  return p;
}

}  // namespace

bool attention_supports_head_dim(int hd) { return hd == 128 || hd == 256 || hd == 512; }

int64_t attn_partial_floats(int heads, int hd, int64_t slots) {
  return slots * static_cast<int64_t>(heads) * (hd + 2);
}

int64_t attn_arrival_slots(int heads, int64_t rows) { return rows * ((heads + 3) / 4); }

bool attention_splits(const AttnArgs& a) { return plan_of(a).split; }

AttnLaunchInfo attention_launch_info(const AttnArgs& a) {
  const Plan p = plan_of(a);
  return {p.split, p.inline_fold, p.split ? p.ht : kHeads, p.nchunks};
}

void attention(const AttnArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  TANDEM_CHECK_MSG(attention_supports_head_dim(a.hd), "attention: head_dim must be 128, 256 or 512");
  TANDEM_CHECK(a.heads > 0 && a.max_keys >= 0);
  if (a.out_inv_freq) TANDEM_CHECK(a.out_rope_dim > 0 && a.out_rope_dim % 2 == 0 && a.out_rope_dim <= a.hd);
  const Plan p = plan_of(a);
  // The CPU's score scale: fl(1 / fl(sqrt(hd))) (model::attend).
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.hd));
  switch (a.hd) {
    case 128: launch<128>(a, s, p, scale); break;
    case 256: launch<256>(a, s, p, scale); break;
    default: launch<512>(a, s, p, scale); break;
  }
}

std::vector<kernels::cuda::SmemBound> attention_smem_bounds() {
  // One 64-key chunk, the 16 heads' queries, p planes and the row's key pointers: fixed by the head
  // dim, whatever the context (longer contexts walk more chunks, split over blocks or folded in one).
  return {{"mqa_kernel", Layout<512>::kBytes, "head dim 512 (the largest supported), any context length",
           "one chunk of " + std::to_string(kChunk) + " keys in shared memory: independent of the context"}};
}

}  // namespace tandem::cuda_model
