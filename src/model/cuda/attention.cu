// The target's MQA attention (attention.h): flash decoding on the tensor cores over 64-key chunks,
// every KV record decoded once per 16 heads. A chunk's keys are decoded from their records into a
// bf16 tile in shared memory (records: e4m3 x E8M0, e2m1 x e4m3 and bf16 are exact in bf16), then
// S = Q K^T (m16n8k16 bf16 mma, 16 heads x 8 keys per warp), the chunk's max and fp32 softmax
// numerators, p split exactly into three bf16 planes, and O_c = P V (8 warps x hd/8 dims, three mma
// per fragment, key order). The chunks are folded in list order, either in registers by a block
// that walks its row's chunks (prefill, large batches) or, split over the chunks, by fold_kernel
// from each chunk's (m_c, z_c, O_c) in `partial`: the same operations on the same values, so both
// give the same bits. A split block gets its chunk's keys in one round of loads (copy_records: every
// record byte copied into the tile at once by cp.async; finish_keys: this step's fp32 rows loaded,
// the records decoded there in place), its key pointers computed before the grid-dependency wait
// (split_block_one_round). A folding block computes the next chunk's pointers while the current
// chunk's loads fly, and, with the key-row scratch (AttnArgs::key_rows: the step's rows and the
// compressed entries decoded once per step by key_rows_kernel), copies a chunk of bf16 rows by
// cp.async; any other chunk in rounds of loads through registers (attend_chunk).
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
constexpr int kFoldPre = 16;              // chunks whose partials fold_kernel loads before its scan
static_assert(kChunk == 8 * kWarps, "one 8-key n-tile per warp");
static_assert(kFoldPre <= kFoldGroup, "the preloaded chunks are one group");
static_assert(kHeads == 16, "one m16 tile of heads");

// Shared memory of one block (byte offsets, every one a multiple of 16).
template <int D>
struct Layout {
  static constexpr int kPitch = 2 * D + 16;                     // bytes per bf16 row of K/V and Q
  static constexpr int kK = 0;                                  // [kChunk][kPitch] keys (= values)
  static constexpr int kQ = kK + kChunk * kPitch;               // [kHeads][kPitch] queries
  static constexpr int kP = kQ + kHeads * kPitch;               // [kPTerms][kHeads][kPPitch] p planes
  static constexpr int kPtr = kP + kPTerms * kHeads * kPPitch;  // [2][kChunk] tagged key pointers (a folding
                                                                // block: this chunk's and the next one's)
  static constexpr int kMax = kPtr + 2 * kChunk * 8;            // [kWarps][kHeads] warp maxima
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

// Key j of the row's list as a pointer with a tag in bits 0-1 (1 = this step's fp32 row, 2 = a
// bf16 row of the key-row scratch, 0 = a KV record); 0 = masked (past the list, or an id the list
// does not make visible).
constexpr uint64_t kTagF32 = 1, kTagBf16 = 2, kTags = 3;
__device__ __forceinline__ uint64_t key_ptr(const AttnArgs& a, const RowKeys& r, int j) {
  if (j < r.nwin) {
    const int64_t wp = r.w0 + j;
    if (wp >= r.start) {
      const int64_t row = r.row0 + (wp - r.start);
      if (a.kr_step) return reinterpret_cast<uint64_t>(a.key_rows + row * a.hd) | kTagBf16;
      return reinterpret_cast<uint64_t>(a.step_kv + row * a.hd) | kTagF32;
    }
    return reinterpret_cast<uint64_t>(r.slot + a.win_off + (wp % a.win_ring) * a.rec.bytes);
  }
  const int i = j - r.nwin;
  if (i >= r.ncomp) return 0;
  const int64_t id = r.top ? static_cast<int64_t>(r.top[i]) : i;
  if (id < 0 || id >= r.vis) return 0;
  if (r.seq < a.kr_seqs)  // the entry decoded once for the step (key_rows_kernel)
    return reinterpret_cast<uint64_t>(a.key_rows + (a.rows + r.seq * a.kr_comp + id) * a.hd) | kTagBf16;
  const int64_t pos = static_cast<int64_t>(a.ratio) * id;
  const int32_t blk = a.m.block_tables[static_cast<int64_t>(r.seq) * a.m.max_blocks + pos / a.m.block_size];
  return reinterpret_cast<uint64_t>(a.pool + static_cast<int64_t>(blk) * a.block_bytes + a.pool_main +
                                    ((pos % a.m.block_size) / a.ratio) * a.rec.bytes);
}

// Dims [8 piece, 8 piece + 8) of a key, as loaded (decoded by piece_bf16). Records are 8-byte
// aligned (kv_record.h sizes, 16-byte ring and pool offsets), fp32 rows 16-byte aligned.
struct RawPiece {
  uint4 w0, w1;      // fp32 row: 8 floats; bf16 dims: w0; fp8: w0.xy codes; nvfp4: w0.x codes
  float scale;
  int mode;          // 0 masked, 1 fp32 row, 2 bf16 dims, 3 fp8 codes, 4 nvfp4 codes
};

// The piece of a KV record (no fp32 row): from global memory through the read-only path (kLdg),
// or from the record's bytes in shared memory (the split launch's one-round loads).
template <bool kLdg, typename T>
__device__ __forceinline__ T ld_at(const uint8_t* p) {
  if constexpr (kLdg) return __ldg(reinterpret_cast<const T*>(p));
  else return *reinterpret_cast<const T*>(p);
}
template <bool kLdg>
__device__ __forceinline__ RawPiece record_piece(const uint8_t* rec, const KvRecordLayout& l, int piece) {
  RawPiece r;
  r.w0 = r.w1 = make_uint4(0, 0, 0, 0);
  r.scale = 0.0f;
  const int d0 = 8 * piece;
  if (l.kind == KvRecordKind::kBf16 || d0 >= l.nope) {
    const uint8_t* src = l.kind == KvRecordKind::kBf16 ? rec + 2 * d0 : rec + l.rope_off + 2 * (d0 - l.nope);
    const uint2 lo = ld_at<kLdg, uint2>(src), hi = ld_at<kLdg, uint2>(src + 8);
    r.w0 = make_uint4(lo.x, lo.y, hi.x, hi.y);
    r.mode = 2;
  } else if (l.kind == KvRecordKind::kFp8) {
    const uint2 c = ld_at<kLdg, uint2>(rec + d0);
    r.w0.x = c.x;
    r.w0.y = c.y;
    r.scale = num::e8m0_to_f32(ld_at<kLdg, uint8_t>(rec + l.scale_off + d0 / 64));
    r.mode = 3;
  } else {
    r.w0.x = ld_at<kLdg, uint32_t>(rec + d0 / 2);
    r.scale = num::e4m3_decode(ld_at<kLdg, uint8_t>(rec + l.scale_off + d0 / 16));
    r.mode = 4;
  }
  return r;
}

__device__ __forceinline__ RawPiece load_piece(uint64_t kp, const KvRecordLayout& l, int piece) {
  if (kp & kTagBf16) {
    RawPiece r;
    r.w0 = __ldg(reinterpret_cast<const uint4*>(kp & ~kTags) + piece);
    r.w1 = make_uint4(0, 0, 0, 0);
    r.scale = 0.0f;
    r.mode = 2;
    return r;
  }
  if (kp & kTagF32) {
    RawPiece r;
    const uint4* f = reinterpret_cast<const uint4*>(kp & ~uint64_t{1}) + 2 * piece;
    r.w0 = __ldg(f);
    r.w1 = __ldg(f + 1);
    r.scale = 0.0f;
    r.mode = 1;
    return r;
  }
  if (!kp) {
    RawPiece r;
    r.w0 = r.w1 = make_uint4(0, 0, 0, 0);
    r.scale = 0.0f;
    r.mode = 0;
    return r;
  }
  return record_piece<true>(reinterpret_cast<const uint8_t*>(kp), l, piece);
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

// The block's 16 query heads [h0, h0 + 16) of row t as bf16 rows (zeros past the last head).
template <int D>
__device__ __forceinline__ void load_q(const AttnArgs& a, int64_t t, int h0, uint8_t* sQ) {
  constexpr int kPieces = D / 8;
  for (int i = threadIdx.x; i < kHeads * kPieces; i += kThreads) {
    const int hl = i / kPieces, piece = i % kPieces;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + hl < a.heads) {
      const float4* f = reinterpret_cast<const float4*>(a.q + (t * a.heads + h0 + hl) * D) + 2 * piece;
      const float4 x = f[0], y = f[1];
      v = make_uint4(bf16x2(x.x, x.y), bf16x2(x.z, x.w), bf16x2(y.x, y.y), bf16x2(y.z, y.w));
    }
    *reinterpret_cast<uint4*>(sQ + hl * Layout<D>::kPitch + piece * 16) = v;
  }
}

template <int D>
struct Parts {
  static constexpr int NT = D / 64;                // 8-dim n-tiles per warp
  static constexpr int kParts = NT >= 4 ? 2 : 1;
  static constexpr int NTP = NT / kParts;          // n-tiles per part (even: x4.trans loads pairs)
};
// Phases 2-4 of a chunk whose keys are in the tile as bf16 rows (masked keys: zeros, sptr[k] 0),
// after a barrier that follows their stores: S, the softmax's max and sums, O_c in parts.
template <int D, typename Consume>
__device__ __forceinline__ void chunk_math(uint8_t* smem, const uint64_t* sptr, float scale, Consume&& consume) {
  using L = Layout<D>;
  constexpr int NTP = Parts<D>::NTP;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  uint8_t* sK = smem + L::kK;
  uint8_t* sP = smem + L::kP;
  float* smax = reinterpret_cast<float*>(smem + L::kMax);
  float* ssum = reinterpret_cast<float*>(smem + L::kSum);

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

// ---- a chunk's keys into the tile ----
// Each thread handles one 16-byte bf16 piece (dims [8 piece, 8 piece + 8)) of keys kslot,
// kslot + kKeysPerPass, ... (kThreads is a multiple of the pieces per key): the split launch's one
// round (copy_records, finish_keys) and the folding blocks' copies and rounds (attend_chunk).
template <int D>
struct Round {
  static constexpr int kPieces = D / 8;                         // 16-byte bf16 pieces per key
  static constexpr int kKeysPerPass = kThreads / kPieces;       // keys a pass of the block covers (4, 8, 16)
  static constexpr int kPasses = kChunk / kKeysPerPass;         // passes per chunk (16, 8, 4)
  static constexpr int kDecodeBatch = kPasses < 8 ? kPasses : 8;  // rows decoded between two barriers
  static_assert(kThreads % kPieces == 0 && kPasses % 4 == 0 && kPasses % kDecodeBatch == 0);
};

// 1. The records' bytes, all at once: cp.async of 8-byte words (records are 8-byte aligned) into
// each key's row of the tile (a record's bytes, at most 2 D, fit its 2 D + 16 byte row), committed
// as one group. Keys whose pointers are fp32 rows or masked are finish_keys' work.
template <int D>
__device__ __forceinline__ void copy_records(const AttnArgs& a, uint8_t* sK, const uint64_t* sptr) {
  using R = Round<D>;
  const int piece = threadIdx.x % R::kPieces, kslot = threadIdx.x / R::kPieces;
  const int words = a.rec.bytes / 8;  // words piece, piece + kPieces, ... (<= 2: at most 2 D bytes)
#pragma unroll 4
  for (int p = 0; p < R::kPasses; ++p) {
    const int k = p * R::kKeysPerPass + kslot;
    const uint64_t kp = sptr[k];
    if (!kp || (kp & kTags)) continue;
    const uint8_t* rec = reinterpret_cast<const uint8_t*>(kp);
    for (int w = piece; w < words; w += R::kPieces)
      mma::cp_async8(sK + k * Layout<D>::kPitch + 8 * w, rec + 8 * w);
  }
  mma::cp_async_commit();
}

// The records of the tile decoded in place (finish_keys), kind K (= rec.kind).
template <int D, KvRecordKind K>
__device__ __forceinline__ void decode_rows(const KvRecordLayout& rec, uint8_t* sK, const uint64_t* sptr) {
  using L = Layout<D>;
  using R = Round<D>;
  const int piece = threadIdx.x % R::kPieces, kslot = threadIdx.x / R::kPieces;
  KvRecordLayout l = rec;
  l.kind = K;
#pragma unroll 1
  for (int p0 = 0; p0 < R::kPasses; p0 += R::kDecodeBatch) {
    uint4 v[R::kDecodeBatch];
    bool is_rec[R::kDecodeBatch];
#pragma unroll
    for (int b = 0; b < R::kDecodeBatch; ++b) {
      const int k = (p0 + b) * R::kKeysPerPass + kslot;
      const uint64_t kp = sptr[k];
      is_rec[b] = kp && !(kp & kTags);
      v[b] = is_rec[b] ? piece_bf16(record_piece<false>(sK + k * L::kPitch, l, piece)) : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();  // every piece of these rows read
#pragma unroll
    for (int b = 0; b < R::kDecodeBatch; ++b)
      if (is_rec[b]) *reinterpret_cast<uint4*>(sK + ((p0 + b) * R::kKeysPerPass + kslot) * L::kPitch + piece * 16) = v[b];
  }
}

// 2. This step's fp32 rows and the masked keys (zeros) straight into their rows, 4 pieces in
// flight; then the copies' wait and every record decoded in place (decode_rows): each row read
// whole by its key's threads before a barrier and written after it (a row's bytes are read and
// written by the same kPieces threads: no other row is touched). The same decoded values as
// load_piece's (the same record_piece and piece_bf16). Ends with a barrier: the tile is complete.
template <int D>
__device__ __forceinline__ void finish_keys(const AttnArgs& a, uint8_t* sK, const uint64_t* sptr) {
  using L = Layout<D>;
  using R = Round<D>;
  const int piece = threadIdx.x % R::kPieces, kslot = threadIdx.x / R::kPieces;
#pragma unroll 1
  for (int p0 = 0; p0 < R::kPasses; p0 += 4) {
    RawPiece raw[4];
    bool direct[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint64_t kp = sptr[(p0 + b) * R::kKeysPerPass + kslot];
      direct[b] = !kp || (kp & kTags);
      raw[b] = load_piece(direct[b] ? kp : 0, a.rec, piece);
    }
#pragma unroll
    for (int b = 0; b < 4; ++b)
      if (direct[b])
        *reinterpret_cast<uint4*>(sK + ((p0 + b) * R::kKeysPerPass + kslot) * L::kPitch + piece * 16) = piece_bf16(raw[b]);
  }
  mma::cp_async_wait(0);
  __syncthreads();  // every copy of the block landed (a batch's rows are not another batch's)
  switch (a.rec.kind) {  // the kind as a constant inside each loop
    case KvRecordKind::kBf16: break;  // a bf16 record is its row: piece p's bytes are at 16 p already
    case KvRecordKind::kNvfp4: decode_rows<D, KvRecordKind::kNvfp4>(a.rec, sK, sptr); break;
    default: decode_rows<D, KvRecordKind::kFp8>(a.rec, sK, sptr); break;
  }
  __syncthreads();
}

// The L2 lines of a KV record (a prefetch reads nothing into the program).
__device__ __forceinline__ void prefetch_record(const AttnArgs& a, uint64_t kp) {
  if (!kp || (kp & kTags)) return;
  const uintptr_t first = kp & ~uint64_t{127}, end = kp + static_cast<uint64_t>(a.rec.bytes);
  for (uintptr_t line = first; line < end; line += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
}

// Chunk c of nch of the row (rk: the row's key list, in shared memory) in a folding block. The
// chunk's key pointers are in buffer c % 2 of the block's two (written before the previous barrier:
// by the block's prologue for chunk 0, else during chunk c - 1); while its keys' loads fly, the
// next chunk's pointers go to the other buffer (its readers, chunk c - 1's, are past this chunk's
// first barrier) and their records are L2-prefetched. The keys: a chunk of bf16 rows only (the
// key-row scratch: the step's rows, the entries decoded for the step) by one cp.async of 16 bytes a
// piece; any other in rounds of kBatch pieces a thread through registers (load_piece, piece_bf16).
// Then the chunk's max and sum for heads g and g + 8 (g = lane / 4) of this thread, and O_c in parts
// (chunk_math): consume(part, oc, mc, zc) gets the thread's mma fragments of dims [dim0 + part *
// D/8/kParts, +D/8/kParts) (dim0 = warp * D/8): oc[n][0..1] = head g, oc[n][2..3] = head g + 8, at
// dims + 8n + 2 (lane % 4) + {0, 1}. Parts keep the fragments of a fold and of the next part's
// products from being live at once.
template <int D, typename Consume>
__device__ __forceinline__ void attend_chunk(const AttnArgs& a, const RowKeys& rk, int c, int nch, uint8_t* smem,
                                             float scale, Consume&& consume) {
  using L = Layout<D>;
  using R = Round<D>;
  constexpr int kBatch = 4;  // pieces in flight per thread in the rounds
  const int tid = threadIdx.x, piece = tid % R::kPieces, kslot = tid / R::kPieces;
  uint8_t* sK = smem + L::kK;
  uint64_t* sptr = reinterpret_cast<uint64_t*>(smem + L::kPtr);
  const uint64_t* cur = sptr + (c & 1) * kChunk;
  // the previous chunk's readers of every shared array are done; is every key a bf16 row?
  const bool rows_only = __syncthreads_and(tid >= kChunk || (cur[tid] & kTags) == kTagBf16);
  if (rows_only) {
#pragma unroll
    for (int p = 0; p < R::kPasses; ++p) {
      const int k = p * R::kKeysPerPass + kslot;
      mma::cp_async16(sK + k * L::kPitch + piece * 16, reinterpret_cast<const uint4*>(cur[k] & ~kTags) + piece);
    }
    mma::cp_async_commit();
  }
  if (tid < kChunk && c + 1 < nch) {
    const uint64_t kp = key_ptr(a, rk, (c + 1) * kChunk + tid);
    sptr[((c + 1) & 1) * kChunk + tid] = kp;
    prefetch_record(a, kp);
  }
  if (rows_only) {
    mma::cp_async_wait(0);
  } else {
#pragma unroll 1
    for (int p0 = 0; p0 < R::kPasses; p0 += kBatch) {
      RawPiece raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) raw[b] = load_piece(cur[(p0 + b) * R::kKeysPerPass + kslot], a.rec, piece);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        *reinterpret_cast<uint4*>(sK + ((p0 + b) * R::kKeysPerPass + kslot) * L::kPitch + piece * 16) = piece_bf16(raw[b]);
    }
  }
  __syncthreads();
  chunk_math<D>(smem, cur, scale, consume);
}

// A split block's chunk partials (consume of chunk_math): O_c of its heads to partial[slot], m_c
// and z_c to the (m, z) array after the partials.
template <int D>
struct PartialStore {
  float* po;   // [heads, D] of the slot
  float* pml;  // [heads, 2] of the slot
  int h0, heads, g, tq, dim0;
  template <int NTP>
  __device__ __forceinline__ void operator()(int part, float (&oc)[NTP][4], const float (&mc)[2],
                                             const float (&zc)[2]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int h = h0 + g + 8 * i;
      if (h >= heads) continue;
#pragma unroll
      for (int n = 0; n < NTP; ++n)
        *reinterpret_cast<float2*>(po + h * D + dim0 + 8 * (part * NTP + n)) = make_float2(oc[n][2 * i], oc[n][2 * i + 1]);
      if (part == 0 && threadIdx.x < 32 && tq == 0) {
        pml[h * 2] = mc[i];
        pml[h * 2 + 1] = zc[i];
      }
    }
  }
};

// A block of the split launch: chunk blockIdx.x of row t, heads
// [h0, h0 + 16), to its partial slot; every thread of the block calls it first thing.
//  - Before the grid-dependency wait (launch.cuh, rule 1): the row's key list and the key pointers
//    of the chunk that no kernel of the step chooses (the window's, the every-entry list's), read
//    from StepMeta and AttnArgs' scalars only: the step's metadata is copied in before the step's
//    first kernel and no kernel writes it. The records they point to are only L2-prefetched there
//    (a prefetch reads nothing into the program: whatever a kernel before this one still writes,
//    the loads after the wait see it, the L2 being the point of coherence). The top-k entries'
//    pointers (the list is this step's indexer's), the queries and this step's fp32 rows: after it.
//  - The chunk's keys in one round (copy_records, finish_keys), the queries' stores between the
//    records' copies and the direct pieces.
template <int D>
__device__ __forceinline__ void split_block_one_round(const AttnArgs& a, int64_t t, int h0, int nchunks, float scale,
                                                      uint8_t* smem) {
  using L = Layout<D>;
  constexpr int kPieces = Round<D>::kPieces;
  constexpr int kQIters = kHeads * kPieces / kThreads;   // query pieces per thread (4, 2, 1)
  static_assert(kQIters >= 1);
  const int tid = threadIdx.x;
  uint8_t* sK = smem + L::kK;
  uint8_t* sQ = smem + L::kQ;
  uint64_t* sptr = reinterpret_cast<uint64_t*>(smem + L::kPtr);

  const RowKeys rk = row_keys(a, t);  // every thread: the block's chunk count without a barrier
  int nch = (rk.nk + kChunk - 1) / kChunk;
  nch = nch < nchunks ? nch : nchunks;
  const int c0 = static_cast<int>(blockIdx.x);
  if (c0 >= nch) {
    kernels::cuda::pdl_wait();  // rule 2
    return;
  }
  const int j = c0 * kChunk + tid;
  const bool chosen = a.topk != nullptr && j >= rk.nwin;  // a top-k entry: its pointer after the wait
  if (tid < kChunk && !chosen) {
    const uint64_t kp = key_ptr(a, rk, j);
    sptr[tid] = kp;
    prefetch_record(a, kp);
  }
  kernels::cuda::pdl_wait();
  // The dependent (fold_kernel) reads only StepMeta and the sink before its own wait.
  kernels::cuda::pdl_trigger();
  if (tid < kChunk && chosen) sptr[tid] = key_ptr(a, rk, j);
  // the queries' loads, all issued before the barrier (their stores after the records' copies)
  float4 qv[kQIters][2];
#pragma unroll
  for (int k = 0; k < kQIters; ++k) {
    const int i = k * kThreads + tid, hl = i / kPieces, qp = i % kPieces;
    if (h0 + hl < a.heads) {
      const float4* f = reinterpret_cast<const float4*>(a.q + (t * a.heads + h0 + hl) * D) + 2 * qp;
      qv[k][0] = f[0];
      qv[k][1] = f[1];
    } else {
      qv[k][0] = qv[k][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  __syncthreads();  // sptr
  copy_records<D>(a, sK, sptr);
#pragma unroll
  for (int k = 0; k < kQIters; ++k) {
    const int i = k * kThreads + tid, hl = i / kPieces, qp = i % kPieces;
    const float4 x = qv[k][0], y = qv[k][1];
    *reinterpret_cast<uint4*>(sQ + hl * L::kPitch + qp * 16) =
        make_uint4(bf16x2(x.x, x.y), bf16x2(x.z, x.w), bf16x2(y.x, y.y), bf16x2(y.z, y.w));
  }
  finish_keys<D>(a, sK, sptr);
  const int64_t slot = t * nchunks + c0;
  const int lane = tid & 31, tq = lane & 3;
  chunk_math<D>(smem, sptr, scale,
                PartialStore<D>{a.partial + slot * a.heads * D, a.partial + a.partial_slots * a.heads * D + slot * a.heads * 2,
                                h0, a.heads, lane >> 2, tq, (tid >> 5) * (D / 8) + 2 * tq});
}


// grid: split (chunks, head tiles, rows) -> partials (split_block_one_round); else (rows, head
// tiles), folding in registers.
template <int D, bool kSplit>
__global__ void __launch_bounds__(kThreads, 2) mqa_kernel(AttnArgs a, int nchunks, float scale) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int NTP = Parts<D>::NTP, kParts = Parts<D>::kParts;
  const int64_t t = kSplit ? blockIdx.z : blockIdx.x;
  const int h0 = static_cast<int>(blockIdx.y) * kHeads;
  if constexpr (kSplit) {
    if (t >= a.rows) {
      kernels::cuda::pdl_wait();
      return;
    }
    split_block_one_round<D>(a, t, h0, nchunks, scale, smem);
    return;
  }
  kernels::cuda::pdl_wait();
  if (t >= a.rows) return;
  RowKeys& rk = *reinterpret_cast<RowKeys*>(smem + Layout<D>::kRow);
  const int nk = row_keys(a, t).nk;  // every thread: the block's chunk count without a barrier
  int nch = (nk + kChunk - 1) / kChunk;
  nch = nch < nchunks ? nch : nchunks;
  if (nch == 0) return;
  if (threadIdx.x == 0) rk = row_keys(a, t);
  load_q<D>(a, t, h0, smem + Layout<D>::kQ);
  __syncthreads();  // rk
  if (threadIdx.x < kChunk)  // chunk 0's key pointers (read after attend_chunk's first barrier)
    reinterpret_cast<uint64_t*>(smem + Layout<D>::kPtr)[threadIdx.x] = key_ptr(a, rk, static_cast<int>(threadIdx.x));

  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int dim0 = (threadIdx.x >> 5) * (D / 8) + 2 * tq;
  float orun[kParts * NTP][4], mrun[2] = {-INFINITY, -INFINITY}, zrun[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < kParts * NTP; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) orun[n][i] = 0.0f;
#pragma unroll 1
  for (int c = 0; c < nch; ++c) {
    float al[2], be[2];
    attend_chunk<D>(a, rk, c, nch, smem, scale, [&](int part, float (&oc)[NTP][4], const float (&mc)[2], const float (&zc)[2]) {
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
// The row's key count from StepMeta before the wait (as split_block_one_round: no kernel of the
// step writes it).
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
  const int nk = row_keys(a, t).nk;
  kernels::cuda::pdl_wait();
  int nch = (nk + kChunk - 1) / kChunk;
  nch = nch < nchunks ? nch : nchunks;
  const int64_t slot0 = t * nchunks;
  const float* __restrict__ po = a.partial + slot0 * H * D + static_cast<int64_t>(h) * D + tid;
  const float* __restrict__ pml = a.partial + a.partial_slots * H * D + slot0 * H * 2 + h * 2;
  const int64_t ostride = static_cast<int64_t>(H) * D;
  // Up to kFoldPre chunks (decode at short contexts): this thread's partials requested now, beside
  // the (m, z) loads and the scan below, not after them.
  const bool pre = nch <= kFoldPre;
  float pv[kFoldPre];
  if (pre) {
#pragma unroll
    for (int i = 0; i < kFoldPre; ++i) pv[i] = i < nch ? po[i * ostride] : 0.0f;
  }
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
    if (pre) {  // one group (kFoldPre <= kFoldGroup): c0 == 0
#pragma unroll
      for (int i = 0; i < kFoldPre; ++i)
        if (i < ng) o = fold(o, pv[i], s_alpha[i], s_beta[i]);
    } else {
#pragma unroll 16
      for (int i = 0; i < ng; ++i) o = fold(o, po[(c0 + i) * ostride], s_alpha[i], s_beta[i]);
    }
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

// The key-row scratch (AttnArgs::key_rows): row r < a.rows is this step's fp32 row r rounded to
// bf16 (piece_bf16 of the fp32 piece), row a.rows + s * kr_comp + id the decoded entry id of
// sequence s (written for id < (last position of s + 1) / ratio, the most any of its rows sees).
// One 16-byte piece a thread, kRowsPerBlock rows a block.
template <int D>
__global__ void __launch_bounds__(kThreads) key_rows_kernel(AttnArgs a) {
  constexpr int kPieces = D / 8, kRowsPerBlock = kThreads / kPieces;
  kernels::cuda::pdl_enter();
  const int piece = threadIdx.x % kPieces;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kPieces;
  const int64_t nrows = a.rows + a.kr_seqs * a.kr_comp;
  if (r >= nrows) return;
  uint4 v;
  if (r < a.rows) {
    v = piece_bf16(load_piece(reinterpret_cast<uint64_t>(a.step_kv + r * D) | kTagF32, a.rec, piece));
  } else {
    const int64_t e = r - a.rows, s = e / a.kr_comp, id = e % a.kr_comp;
    const int len = a.m.seq_len[s];
    if (len <= 0) return;
    const int64_t vis = (a.m.positions[a.m.seq_row0[s] + len - 1] + 1) / a.ratio;
    if (id >= vis) return;
    const int64_t pos = static_cast<int64_t>(a.ratio) * id;
    const int32_t blk = a.m.block_tables[s * a.m.max_blocks + pos / a.m.block_size];
    const uint8_t* rec = a.pool + static_cast<int64_t>(blk) * a.block_bytes + a.pool_main +
                         ((pos % a.m.block_size) / a.ratio) * a.rec.bytes;
    v = piece_bf16(record_piece<true>(rec, a.rec, piece));
  }
  reinterpret_cast<uint4*>(a.key_rows + r * D)[piece] = v;
}

template <int D>
void launch(const AttnArgs& a, cudaStream_t s, int nchunks, unsigned tiles, float scale, bool split) {
  constexpr size_t smem = Layout<D>::kBytes;
  if (split) {
    auto k = mqa_kernel<D, true>;
    kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
    kernels::cuda::launch_pdl(k, dim3(static_cast<unsigned>(nchunks), tiles, static_cast<unsigned>(a.rows)),
                              dim3(kThreads), smem, s, a, nchunks, scale);
    kernels::cuda::launch_pdl(fold_kernel<D>, dim3(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.heads)),
                              dim3(D), 0, s, a, nchunks);
  } else {
    if (a.kr_step) {
      constexpr int kRowsPerBlock = kThreads / (D / 8);
      const int64_t nrows = a.rows + a.kr_seqs * a.kr_comp;
      kernels::cuda::launch_pdl(key_rows_kernel<D>, dim3(static_cast<unsigned>((nrows + kRowsPerBlock - 1) / kRowsPerBlock)),
                                dim3(kThreads), 0, s, a);
    }
    auto k = mqa_kernel<D, false>;
    kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(k), smem);
    kernels::cuda::launch_pdl(k, dim3(static_cast<unsigned>(a.rows), tiles), dim3(kThreads), smem, s, a, nchunks,
                              scale);
  }
}

int chunks_of(const AttnArgs& a) { return std::max(1, (a.max_keys + kChunk - 1) / kChunk); }

}  // namespace

bool attention_supports_head_dim(int hd) { return hd == 128 || hd == 256 || hd == 512; }

int64_t attn_partial_floats(int heads, int hd, int64_t slots) {
  return slots * static_cast<int64_t>(heads) * (hd + 2);
}

bool attention_splits(const AttnArgs& a) {
  const int64_t nchunks = chunks_of(a), tiles = (a.heads + kHeads - 1) / kHeads;
  if (!a.partial || nchunks < 2 || a.rows * nchunks > a.partial_slots) return false;
  int sms = a.sm_count;
  if (sms <= 0) {
    int dev = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  // Folding blocks fill the GPU by themselves from one block per multiprocessor on.
  return a.rows * tiles < sms && a.rows <= 65535;
}

void attention(const AttnArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  TANDEM_CHECK_MSG(attention_supports_head_dim(a.hd), "attention: head_dim must be 128, 256 or 512");
  TANDEM_CHECK(a.heads > 0 && a.max_keys >= 0);
  if (a.out_inv_freq) TANDEM_CHECK(a.out_rope_dim > 0 && a.out_rope_dim % 2 == 0 && a.out_rope_dim <= a.hd);
  const int nchunks = chunks_of(a);
  const unsigned tiles = static_cast<unsigned>((a.heads + kHeads - 1) / kHeads);
  // The CPU's score scale: fl(1 / fl(sqrt(hd))) (model::attend).
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.hd));
  const bool split = attention_splits(a);
  AttnArgs b = a;
  b.kr_step = 0;
  b.kr_seqs = 0;
  b.kr_comp = 0;
  if (!split && a.key_rows && a.rows <= a.key_rows_cap) {
    b.kr_step = 1;
    const int64_t comp = a.entries_bound > 0 ? a.entries_bound : a.topk ? 0 : a.max_keys - a.window;
    if (a.ratio && comp > 0 && a.seqs > 0 && a.rows >= 4 * a.seqs)
      b.kr_seqs = static_cast<int>(std::min<int64_t>(a.seqs, (a.key_rows_cap - a.rows) / comp));
    b.kr_comp = b.kr_seqs ? comp : 0;
  }
  switch (a.hd) {
    case 128: launch<128>(b, s, nchunks, tiles, scale, split); break;
    case 256: launch<256>(b, s, nchunks, tiles, scale, split); break;
    default: launch<512>(b, s, nchunks, tiles, scale, split); break;
  }
}

std::vector<kernels::cuda::SmemBound> attention_smem_bounds() {
  // One 64-key chunk, the 16 heads' queries, p planes and the row's key pointers: fixed by the head
  // dim, whatever the context (longer contexts walk more chunks, split over blocks or folded in one).
  return {{"mqa_kernel", Layout<512>::kBytes, "head dim 512 (the largest supported), any context length",
           "one chunk of " + std::to_string(kChunk) + " keys in shared memory: independent of the context"}};
}

}  // namespace tandem::cuda_model
