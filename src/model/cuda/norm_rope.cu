// norm_rope (norm_rope.h): one 256-thread block per query head (the blocks [0, tokens * heads)), per
// indexer query head (the next tokens * iheads) and per key row (the last tokens), each chaining the
// ops' row bodies with a barrier between steps.
#include "model/cuda/norm_rope.h"

#include <cmath>

#include "common/check.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"
#include "model/cuda/compressor.cuh"
#include "model/cuda/kv_record.cuh"

namespace tandem::cuda_model {
namespace {

namespace row = kernels::cuda::row;
using kernels::RmsNormMode;

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
  const int64_t blocks = a.tokens * (a.heads + a.iheads + (keys ? 1 : 0));
  if (blocks == 0) return;
  TANDEM_CHECK(blocks <= 0x7fffffff);
  kernels::cuda::launch_pdl(norm_rope_kernel, static_cast<unsigned>(blocks), kThreads, 0, s, a, iq_scale, k_scale);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
