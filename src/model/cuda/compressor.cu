// The KV compressor kernels (compressor.h): one block per row.
#include "model/cuda/compressor.h"

#include <cuda_runtime.h>

#include "common/check.h"
#include "common/numeric_core.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "model/cuda/compressor.cuh"

namespace tandem::cuda_model {

using kernels::cuda::add_rn;
using kernels::cuda::div_rn;
using kernels::cuda::mul_rn;

namespace {

__global__ void comp_rows_kernel(CompRowsArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = blockIdx.x;
  if (t >= a.rows) return;
  const int64_t C = a.chans;
  const int64_t ph = a.m.positions[t] % a.ratio;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    a.out[t * 2 * C + c] = a.kv[t * C + c];
    a.out[t * 2 * C + C + c] = a.gate[t * C + c] + a.ape[ph * C + c];
  }
}

// Entry t of compress_entries: flag, position and the gated pooling of its candidate rows. A
// candidate's kv values, gate values (+ ape for this step's rows when kFused: the rows' operands, read
// instead of comp_rows' output, with its one add; else ape is null and the gate values are the row's
// sum) and channel offset; kv null = absent (j == 0's previous block). One copy of the arithmetic for
// compress_entries and compress_step, so the two give the same bits.
template <bool kFused>
__device__ __forceinline__ void entry_body(const CompRowsArgs& r, const CompressArgs& a, int64_t t, int64_t p) {
  const int ratio = a.ratio;
  if ((p + 1) % ratio) {
    if (threadIdx.x == 0) {
      a.flag[t] = 0;
      a.entry_pos[t] = 0;
    }
    for (int64_t c = threadIdx.x; c < a.d; c += blockDim.x) a.entry[t * a.d + c] = 0.0f;
    return;
  }
  const int seq = a.m.row_seq[t];
  const int64_t j = (p + 1) / ratio - 1;
  if (threadIdx.x == 0) {
    a.flag[t] = 1;
    a.entry_pos[t] = static_cast<int64_t>(ratio) * j;
  }
  const int64_t C = a.chans;
  const int coff = a.overlap ? 2 : 1;
  const int ncand = coff * ratio;
  __shared__ const float* s_kv[256];
  __shared__ const float* s_gate[256];
  __shared__ const float* s_ape[256];
  __shared__ int64_t s_choff[256];
  for (int c = threadIdx.x; c < ncand; c += blockDim.x) {
    const bool prev = a.overlap && c < ratio;  // the previous block's rows (overlap: channels [0, d))
    const int64_t q = prev ? static_cast<int64_t>(ratio) * (j - 1) + c : ratio * j + (a.overlap ? c - ratio : c);
    s_choff[c] = a.overlap && !prev ? a.d : 0;
    s_ape[c] = nullptr;
    if (prev && j == 0) {
      s_kv[c] = s_gate[c] = nullptr;
      continue;
    }
    const int64_t start = a.m.seq_start[seq];
    if (q >= start) {
      const int64_t row = static_cast<int64_t>(a.m.seq_row0[seq]) + (q - start);  // its position is q
      if (kFused) {
        s_kv[c] = r.kv + row * C;
        s_gate[c] = r.gate + row * C;
        s_ape[c] = r.ape + (q % ratio) * C;
      } else {
        s_kv[c] = a.step_rows + row * 2 * C;
        s_gate[c] = s_kv[c] + C;
      }
    } else {
      const uint8_t* st = a.slot_state + static_cast<int64_t>(a.m.seq_slot[seq]) * a.slot_bytes + a.ring_off;
      s_kv[c] = reinterpret_cast<const float*>(st) + (q % a.ring) * 2 * C;
      s_gate[c] = s_kv[c] + C;
    }
  }
  __syncthreads();
  // kernels::cpu::compress_pool's operations in its order (candidates in list order, products and
  // sums rounded one at a time: no FMA); only expf differs from the host's exp.
  for (int64_t ch = threadIdx.x; ch < a.d; ch += blockDim.x) {
    auto score = [&](int c) {
      const int64_t i = s_choff[c] + ch;
      return s_ape[c] ? add_rn(s_gate[c][i], s_ape[c][i]) : s_gate[c][i];
    };
    float mx = -INFINITY;
    for (int c = 0; c < ncand; ++c) {
      if (!s_kv[c]) continue;
      const float s = score(c);
      mx = s > mx ? s : mx;
    }
    float z = 0.0f;
    for (int c = 0; c < ncand; ++c)
      if (s_kv[c]) z = add_rn(z, expf(score(c) - mx));
    float acc = 0.0f;
    for (int c = 0; c < ncand; ++c) {
      if (!s_kv[c]) continue;
      const float e = expf(score(c) - mx);
      acc = add_rn(acc, mul_rn(s_kv[c][s_choff[c] + ch], div_rn(e, z)));
    }
    a.entry[t * a.d + ch] = num::round_bf16(acc);
  }
}

__global__ void compress_entries_kernel(CompressArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = blockIdx.x;
  if (t >= a.rows) return;
  entry_body<false>(CompRowsArgs{}, a, t, a.m.positions[t]);
}

// comp_rows_kernel's row t, then entry t: one block per row, no block reads another's writes.
__global__ void compress_step_kernel(CompRowsArgs r, CompressArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = blockIdx.x;
  if (t >= a.rows) return;
  const int64_t C = a.chans, p = a.m.positions[t];
  const int64_t ph = p % a.ratio;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    r.out[t * 2 * C + c] = r.kv[t * C + c];
    r.out[t * 2 * C + C + c] = add_rn(r.gate[t * C + c], r.ape[ph * C + c]);
  }
  entry_body<true>(r, a, t, p);
}

__global__ void store_entries_kernel(StoreEntriesArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = blockIdx.x;
  if (t >= a.rows || !a.flag[t]) return;
  uint8_t* dst = entry_slot(a.m, t, a.entry_pos[t], a.ratio, a.pool, a.block_bytes, a.pool_off, a.rec_bytes);
  for (int64_t b = threadIdx.x; b < a.rec_bytes; b += blockDim.x) dst[b] = a.rec[t * a.rec_bytes + b];
}

}  // namespace

void comp_rows_build(const CompRowsArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(comp_rows_kernel, static_cast<unsigned>(a.rows), 256, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void compress_entries(const CompressArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(compress_entries_kernel, static_cast<unsigned>(a.rows), 128, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void compress_step(const CompRowsArgs& rows, const CompressArgs& entries, cudaStream_t s) {
  TANDEM_CHECK(rows.rows == entries.rows && rows.chans == entries.chans && rows.ratio == entries.ratio);
  TANDEM_CHECK(!entries.step_rows || entries.step_rows == rows.out);
  TANDEM_CHECK(entries.ratio > 0 && (entries.overlap ? 2 : 1) * entries.ratio <= 256);  // the candidates' smem
  if (rows.rows == 0) return;
  kernels::cuda::launch_pdl(compress_step_kernel, static_cast<unsigned>(rows.rows), 256, 0, s, rows, entries);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void store_entries(const StoreEntriesArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(store_entries_kernel, static_cast<unsigned>(a.rows), 128, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
