// Device pieces shared by the target attention's kernels (attention.cu: split over chunks and
// folding blocks; attention_rows.cu: the pipelined row kernel of prefill-sized steps): the row's key
// list, the KV record decoder, the fold's operations. One copy, so every launch shape gives equal bits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/numeric_core.h"
#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/row_math.cuh"
#include "model/cuda/attention.h"

namespace tandem::cuda_model::attn {

namespace mma = kernels::cuda::mma;
using kernels::cuda::add_rn;
using kernels::cuda::div_rn;
using kernels::cuda::mul_rn;
using kernels::cuda::sub_rn;

constexpr int kChunk = kAttnChunk;        // keys per chunk: one 8-key n-tile per warp in Q K^T
constexpr int kHeads = kAttnHeadTile;     // heads per block: one mma m-tile
constexpr int kPTerms = 3;                // p = p1 + p2 + p3 with each term a bf16 value (exact)
constexpr int kPPitch = kChunk * 2 + 16;  // bytes per row of a P plane (+16: ldmatrix rows in distinct banks)

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

// Key j of the row's list as a pointer with a tag in bit 0 (1 = this step's fp32 row, 0 = a KV
// record); 0 = masked (past the list, or an id the list does not make visible).
__device__ __forceinline__ uint64_t key_ptr(const AttnArgs& a, const RowKeys& r, int j) {
  if (j < r.nwin) {
    const int64_t wp = r.w0 + j;
    if (wp >= r.start) {
      const int64_t row = r.row0 + (wp - r.start);
      if (a.step_rec) return reinterpret_cast<uint64_t>(a.step_rec + row * a.rec.bytes);
      return reinterpret_cast<uint64_t>(a.step_kv + row * a.hd) | 1u;
    }
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

// 8-dim n-tiles of the P V product per warp (dims [warp * D/8, +D/8)), done in kParts parts so the
// fragments of a fold and of the next part's products are not live at once.
template <int D>
struct Parts {
  static constexpr int NT = D / 64;                // 8-dim n-tiles per warp
  static constexpr int kParts = NT >= 4 ? 2 : 1;
  static constexpr int NTP = NT / kParts;          // n-tiles per part (even: x4.trans loads pairs)
};

// The pipelined row kernel (attention_rows.cu): dynamic shared memory it needs at head dim hd, and
// its launch (false when the device cannot give that much shared memory to a block, or when the
// step's keys are fp32 rows: a.step_rec is null).
size_t rows_kernel_smem(int hd);
bool launch_rows_kernel(const AttnArgs& a, cudaStream_t s, float scale);

}  // namespace tandem::cuda_model::attn
