// norm_rope (norm_rope.h). Decode rows: one 256-thread block per query head (the blocks [0, tokens *
// heads)), per indexer query head (the next tokens * iheads) and per key row (the last tokens), each
// chaining the ops' row bodies with a barrier between steps. Prefill rows: the query heads and the
// indexer's query heads get their own kernels (several rows per block, see below) before that one.
#include "model/cuda/norm_rope.h"

#include <cmath>

#include "common/check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"
#include "model/cuda/compressor.cuh"
#include "model/cuda/kv_record.cuh"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {
namespace {

namespace row = kernels::cuda::row;
using kernels::RmsNormMode;
using kernels::cuda::add_rn;
using kernels::cuda::div_rn;
using kernels::cuda::mul_rn;
using kernels::cuda::round_bf16;
using kernels::cuda::sub_rn;

constexpr int kThreads = row::kNormThreads;  // the RMSNorm's block: its fp64 sum's order

// The FP4 round trip's blocks of the indexer's query heads.
constexpr int kFp4Block = 32;

__global__ void __launch_bounds__(kThreads) norm_rope_kernel(NormRopeArgs a, float iq_scale, float k_scale) {
  kernels::cuda::pdl_enter();
  __shared__ row::NormSmem sm;
  __shared__ rec::RecSmem rs;
  const int64_t q_rows = a.tokens * a.heads, iq_rows = a.tokens * a.iheads;
  int64_t b = blockIdx.x;
  if (b < q_rows) {  // query head b = (token b / heads, head b % heads)
    float* x = a.q + b * a.q_dim;
    row::rms_norm_row(x, x, a.q_dim, nullptr, nullptr, a.eps, RmsNormMode::kBf16Chain, false, sm);  // ends with a barrier
    row::rope_row(x + (a.q_dim - a.rope_dim), a.positions[b / a.heads], a.inv_freq, a.rope_dim, false, true);
    return;
  }
  b -= q_rows;
  if (b < iq_rows) {  // indexer query head b = (token b / iheads, head b % iheads)
    float* x = a.iq + b * a.iq_dim;
    row::rope_row(x + (a.iq_dim - a.rope_dim), a.positions[b / a.iheads], a.inv_freq, a.rope_dim, false, true);
    __syncthreads();  // the rotated dims are read by other threads below
    row::hadamard_row(x, a.iq_dim, iq_scale, true, sm.sq);  // ends with a barrier
    const int warp = threadIdx.x / kernels::cuda::kWarp, lane = threadIdx.x % kernels::cuda::kWarp;
    for (int blk = warp; blk < a.iq_dim / kFp4Block; blk += kThreads / kernels::cuda::kWarp)
      row::fp4_block_warp(x + blk * kFp4Block, x + blk * kFp4Block, kFp4Block, lane, nullptr, nullptr);
    return;
  }
  const int64_t t = b - iq_rows;  // key row
  float* x = a.k + t * a.k_dim;
  row::rms_norm_row(x, x, a.k_dim, a.k_norm, nullptr, a.eps, RmsNormMode::kF32, true, sm);  // ends with a barrier
  row::rope_row(x + (a.k_dim - a.rope_dim), a.positions[t], a.inv_freq, a.rope_dim, false, true);
  __syncthreads();  // the rotated dims are read by other threads below
  const int64_t bytes = a.rotate ? a.key.bytes : a.rec.bytes;
  uint8_t* record = a.records + t * bytes;
  if (a.rotate) {
    row::hadamard_row(x, a.k_dim, k_scale, true, sm.sq);  // ends with a barrier
    rec::index_key_quantize_row(x, record, a.key, rs);    // ends with a barrier
  } else {
    rec::kv_quantize_row(x, record, a.rec, rs);  // ends with a barrier: the record's bytes are the block's
  }
  // The compressor's store (store_entries_kernel's copy): the block's row, a uniform branch.
  if (a.pool && a.store_flag[t]) {
    uint8_t* dst = entry_slot(a.m, t, a.positions[t], a.ratio, a.pool, a.block_bytes, a.pool_off, bytes);
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = record[i];
  }
}

// ---- Prefill rows. One block per query head serializes the bf16 chain's index-order sum of 512
// squares in one thread while the block's other 255 wait, ~130k times per layer at 4,096 tokens; one
// block per indexer query head runs a 128-wide Hadamard through 7 block barriers. Instead:
//  * query heads: R rows per block. All threads load the R rows (contiguous, float4) into registers
//    and stage their rounded squares in shared memory; lane r of warp 0 then sums row r's squares in
//    index order (the same fp32 adds as rms_norm_row, R chains at once); every thread scales its
//    elements and rotates the RoPE pairs it holds, with (cos, sin) from a table shared by the heads
//    of a token.
//  * indexer query heads: one warp per row, kE = iq_dim / 32 consecutive elements per lane: RoPE,
//    the Hadamard's butterflies in registers (distance < kE) and by shuffles (the rest), the same
//    add/sub per output in the same stage order as hadamard_row, then FP4 blocks of 32 (32 / kE lanes).

constexpr int kQVec = 8;     // float4s per thread of the query-head kernel: R * q_dim <= 4 * kThreads * kQVec
constexpr int kMaxQRows = 32;  // R <= the lanes of warp 0
constexpr size_t kQSmemMax = 48 * 1024;  // no opt-in needed
constexpr int kIqRows = kThreads / kernels::cuda::kWarp;  // indexer rows per block, a warp each
constexpr int kIqMaxHalf = 128;                            // rope_dim / 2 of the indexer kernel's table

// Shared memory of the query-head kernel: the squares (R rows of q_dim + 4 floats: float4 stores and
// the summing lanes' float4 loads are free of bank conflicts), the rows' scales, the RoPE table.
size_t q_smem_bytes(int rows, int q_dim, int rope_dim) {
  return static_cast<size_t>(rows) * (q_dim + 4) * sizeof(float) + kMaxQRows * sizeof(float) +
         static_cast<size_t>(rows) * (rope_dim / 2) * sizeof(float2);
}

__global__ void __launch_bounds__(kThreads) q_rows_kernel(NormRopeArgs a, int rows_per_block) {
  kernels::cuda::pdl_enter();
  extern __shared__ float4 q_smem[];
  const int R = rows_per_block, D = a.q_dim, S = D + 4, half = a.rope_dim / 2, off = D - a.rope_dim;
  float* sq = reinterpret_cast<float*>(q_smem);
  float* rs = sq + R * S;
  float2* cs = reinterpret_cast<float2*>(rs + kMaxQRows);
  const int64_t q_rows = a.tokens * a.heads;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
  const int nrows = static_cast<int>(q_rows - row0 < R ? q_rows - row0 : R);
  const int64_t tok0 = row0 / a.heads;
  const int ntok = static_cast<int>((row0 + nrows - 1) / a.heads - tok0 + 1);  // <= R
  for (int i = threadIdx.x; i < ntok * half; i += kThreads)
    cs[i] = row::rope_cos_sin(a.positions[tok0 + i / half], a.inv_freq[i % half]);
  const int nvec = nrows * (D / 4);
  float4* x = reinterpret_cast<float4*>(a.q + row0 * D);
  float4 v[kQVec];
#pragma unroll
  for (int j = 0; j < kQVec; ++j) {
    const int f = threadIdx.x + j * kThreads;
    if (f < nvec) v[j] = x[f];
  }
#pragma unroll
  for (int j = 0; j < kQVec; ++j) {
    const int f = threadIdx.x + j * kThreads;
    if (f < nvec) {
      const int r = f / (D / 4), c = 4 * (f % (D / 4));
      *reinterpret_cast<float4*>(sq + r * S + c) =
          make_float4(round_bf16(mul_rn(v[j].x, v[j].x)), round_bf16(mul_rn(v[j].y, v[j].y)),
                      round_bf16(mul_rn(v[j].z, v[j].z)), round_bf16(mul_rn(v[j].w, v[j].w)));
    }
  }
  __syncthreads();
  if (threadIdx.x < nrows) {  // lane r of warp 0: row r's sum in index order, as rms_norm_row
    const float4* s4 = reinterpret_cast<const float4*>(sq + threadIdx.x * S);
    float sum = 0.0f;
    for (int i = 0; i < D / 4; ++i) {
      const float4 e = s4[i];
      sum = add_rn(sum, e.x);
      sum = add_rn(sum, e.y);
      sum = add_rn(sum, e.z);
      sum = add_rn(sum, e.w);
    }
    rs[threadIdx.x] = row::bf16_chain_rs(sum, D, a.eps);
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kQVec; ++j) {
    const int f = threadIdx.x + j * kThreads;
    if (f < nvec) {
      const int r = f / (D / 4), c = 4 * (f % (D / 4));
      const float k = rs[r];
      float y0 = round_bf16(mul_rn(v[j].x, k)), y1 = round_bf16(mul_rn(v[j].y, k));
      float y2 = round_bf16(mul_rn(v[j].z, k)), y3 = round_bf16(mul_rn(v[j].w, k));
      if (c >= off) {  // two whole RoPE pairs (off and c are multiples of 4)
        const float2* t = cs + ((row0 + r) / a.heads - tok0) * half + (c - off) / 2;
        row::rope_rotate(y0, y1, t[0], false, true);
        row::rope_rotate(y2, y3, t[1], false, true);
      }
      x[f] = make_float4(y0, y1, y2, y3);
    }
  }
}

template <int kE>  // iq_dim = 32 * kE
__global__ void __launch_bounds__(kThreads) iq_rows_kernel(NormRopeArgs a, float iq_scale) {
  kernels::cuda::pdl_enter();
  __shared__ float2 cs[kIqRows * kIqMaxHalf];
  constexpr int kGroup = kFp4Block / kE;  // lanes per FP4 block
  const int half = a.rope_dim / 2, off = a.iq_dim - a.rope_dim;
  const int64_t iq_rows = a.tokens * a.iheads;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kIqRows;
  const int nrows = static_cast<int>(iq_rows - row0 < kIqRows ? iq_rows - row0 : kIqRows);
  const int64_t tok0 = row0 / a.iheads;
  const int ntok = static_cast<int>((row0 + nrows - 1) / a.iheads - tok0 + 1);  // <= kIqRows
  for (int i = threadIdx.x; i < ntok * half; i += kThreads)
    cs[i] = row::rope_cos_sin(a.positions[tok0 + i / half], a.inv_freq[i % half]);
  __syncthreads();
  const int warp = threadIdx.x / kernels::cuda::kWarp, lane = threadIdx.x % kernels::cuda::kWarp;
  if (warp >= nrows) return;  // the ragged last block's spare warps (after the only barrier)
  const int64_t r = row0 + warp;
  float2* x = reinterpret_cast<float2*>(a.iq + r * a.iq_dim + lane * kE);
  float v[kE];
#pragma unroll
  for (int k = 0; k < kE / 2; ++k) {
    const float2 p = x[k];
    v[2 * k] = p.x;
    v[2 * k + 1] = p.y;
  }
  const float2* t = cs + (r / a.iheads - tok0) * half;
#pragma unroll
  for (int k = 0; k < kE; k += 2) {
    const int i = lane * kE + k;
    if (i >= off) row::rope_rotate(v[k], v[k + 1], t[(i - off) / 2], false, true);
  }
  // Hadamard: stage h pairs i (bit h clear) with i + h: v[i] = a + b, v[i + h] = a - b.
#pragma unroll
  for (int h = 1; h < kE; h *= 2)
#pragma unroll
    for (int k = 0; k < kE; ++k)
      if ((k & h) == 0) {
        const float p = v[k], q = v[k + h];
        v[k] = add_rn(p, q);
        v[k + h] = sub_rn(p, q);
      }
#pragma unroll
  for (int m = 1; m < kernels::cuda::kWarp; m *= 2) {  // h = m * kE: the partner is lane ^ m
    const bool low = (lane & m) == 0;
#pragma unroll
    for (int k = 0; k < kE; ++k) {
      const float o = __shfl_xor_sync(0xffffffffu, v[k], m);
      v[k] = low ? add_rn(v[k], o) : sub_rn(o, v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kE; ++k) v[k] = round_bf16(mul_rn(v[k], iq_scale));
  // FP4 round trip of the block of 32 this lane's elements belong to (fp4_block_warp's arithmetic;
  // the maximum of non-NaN magnitudes is one value in any order).
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kE; ++k) {
    const float m = fabsf(v[k]);
    amax = m > amax ? m : amax;  // NaN compares false: ignored
  }
#pragma unroll
  for (int o = 1; o < kGroup; o *= 2) {
    const float m = __shfl_xor_sync(0xffffffffu, amax, o);
    amax = m > amax ? m : amax;
  }
  const int e = num::ue8m0_scale_exponent(amax, num::kE2m1Max, num::kFp4ActAmaxFloor);
  const float sc = num::pow2_int(e);
#pragma unroll
  for (int k = 0; k < kE; ++k) {
    const float xv = v[k];
    const uint8_t c = num::f32_to_e2m1(kernels::cuda::clamp_std(div_rn(xv, sc), -num::kE2m1Max, num::kE2m1Max));
    v[k] = kernels::cuda::is_nan(xv) ? xv : mul_rn(num::e2m1_decode(c), sc);
  }
#pragma unroll
  for (int k = 0; k < kE / 2; ++k) x[k] = make_float2(v[2 * k], v[2 * k + 1]);
}

// 1/sqrt(n) rounded to float, as hadamard() scales.
float hadamard_scale(int n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

bool hadamard_fits(int n) { return n > 0 && n <= row::kNormChunk && (n & (n - 1)) == 0; }  // in NormSmem::sq

}  // namespace

void norm_rope(const NormRopeArgs& a, cudaStream_t s) {
  TANDEM_CHECK(a.tokens >= 0 && a.heads >= 0 && a.iheads >= 0 && a.rope_dim > 0 && a.rope_dim % 2 == 0 &&
               a.positions && a.inv_freq);
  if (a.heads > 0) TANDEM_CHECK(a.q && a.q_dim >= a.rope_dim);
  float iq_scale = 0.0f, k_scale = 0.0f;
  if (a.iheads > 0) {
    TANDEM_CHECK(a.iq && a.iq_dim >= a.rope_dim && hadamard_fits(a.iq_dim) && a.iq_dim % kFp4Block == 0);
    iq_scale = hadamard_scale(a.iq_dim);
  }
  const bool keys = a.k != nullptr;
  if (a.pool) TANDEM_CHECK(keys && a.store_flag && a.ratio > 0 && a.block_bytes > 0);
  if (keys) {
    TANDEM_CHECK(a.k_norm && a.records && a.k_dim >= a.rope_dim);
    if (a.rotate) {  // the key groups are 32 wide, their exponents in RecSmem
      TANDEM_CHECK(a.key.dim == a.k_dim && hadamard_fits(a.k_dim) && a.k_dim % 32 == 0 && a.k_dim / 32 <= 64);
      k_scale = hadamard_scale(a.k_dim);
    } else {
      TANDEM_CHECK(a.rec.head_dim == a.k_dim && a.rec.nope / 16 <= 64);  // the group maxima's smem
    }
  }
  TANDEM_CHECK(a.rows_per_block >= 0 && a.rows_per_block <= kMaxQRows);
  // Prefill rows: the query heads and the indexer's query heads by their own kernels (where their
  // shapes fit them); what is left (and every decode row) by norm_rope_kernel.
  const bool prefill = a.rows_per_block > 1 || (a.rows_per_block == 0 && a.tokens >= kNormRopePrefillTokens);
  NormRopeArgs rest = a;
  if (prefill && a.heads > 0 && a.tokens > 0) {
    const int R = norm_rope_q_rows_per_block(a);
    if (R > 1) {
      const int64_t qb = (a.tokens * a.heads + R - 1) / R;
      TANDEM_CHECK(qb <= 0x7fffffff);
      kernels::cuda::launch_pdl(q_rows_kernel, static_cast<unsigned>(qb), kThreads, q_smem_bytes(R, a.q_dim, a.rope_dim),
                                s, a, R);
      TANDEM_CUDA_LAUNCH_CHECK();
      rest.heads = 0;
    }
  }
  if (prefill && a.iheads > 0 && a.tokens > 0 && norm_rope_iq_warp_fits(a)) {
    const int64_t ib = (a.tokens * a.iheads + kIqRows - 1) / kIqRows;
    TANDEM_CHECK(ib <= 0x7fffffff);
    switch (a.iq_dim) {
      case 64: kernels::cuda::launch_pdl(iq_rows_kernel<2>, static_cast<unsigned>(ib), kThreads, 0, s, a, iq_scale); break;
      case 128: kernels::cuda::launch_pdl(iq_rows_kernel<4>, static_cast<unsigned>(ib), kThreads, 0, s, a, iq_scale); break;
      default: kernels::cuda::launch_pdl(iq_rows_kernel<8>, static_cast<unsigned>(ib), kThreads, 0, s, a, iq_scale); break;
    }
    TANDEM_CUDA_LAUNCH_CHECK();
    rest.iheads = 0;
  }
  const int64_t blocks = rest.tokens * (rest.heads + rest.iheads + (keys ? 1 : 0));
  if (blocks == 0) return;
  TANDEM_CHECK(blocks <= 0x7fffffff);
  kernels::cuda::launch_pdl(norm_rope_kernel, static_cast<unsigned>(blocks), kThreads, 0, s, rest, iq_scale, k_scale);
  TANDEM_CUDA_LAUNCH_CHECK();
}

kernels::cuda::SmemBound norm_rope_smem_bound() {
  return {"q_rows_kernel", static_cast<int64_t>(kQSmemMax),
          "any query-head shape: norm_rope_q_rows_per_block caps the rows per block to fit this", ""};
}

int norm_rope_q_rows_per_block(const NormRopeArgs& a) {
  if (a.heads <= 0 || a.q_dim % 4 != 0 || a.rope_dim % 4 != 0 || (reinterpret_cast<uintptr_t>(a.q) & 15) != 0)
    return 1;
  int r = a.rows_per_block > 1 ? a.rows_per_block : kMaxQRows;
  while (r > 1 && (static_cast<int64_t>(r) * a.q_dim > 4 * kThreads * kQVec || q_smem_bytes(r, a.q_dim, a.rope_dim) > kQSmemMax))
    --r;
  return r;
}

bool norm_rope_iq_warp_fits(const NormRopeArgs& a) {
  return (a.iq_dim == 64 || a.iq_dim == 128 || a.iq_dim == 256) && a.rope_dim / 2 <= kIqMaxHalf &&
         (reinterpret_cast<uintptr_t>(a.iq) & 7) == 0;
}

}  // namespace tandem::cuda_model
