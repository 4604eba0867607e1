// The KV compressor kernels (compressor.h): one block per row.
#include "model/cuda/compressor.h"

#include <cuda_runtime.h>

#include "common/numeric_core.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"

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

__device__ __forceinline__ const float* comp_row_ptr(const CompressArgs& a, int seq, int64_t q) {
  const int64_t start = a.m.seq_start[seq];
  if (q >= start) return a.step_rows + (static_cast<int64_t>(a.m.seq_row0[seq]) + (q - start)) * 2 * a.chans;
  const uint8_t* st = a.slot_state + static_cast<int64_t>(a.m.seq_slot[seq]) * a.slot_bytes + a.ring_off;
  return reinterpret_cast<const float*>(st) + (q % a.ring) * 2 * a.chans;
}

__global__ void compress_entries_kernel(CompressArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = blockIdx.x;
  if (t >= a.rows) return;
  const int64_t p = a.m.positions[t];
  const int r = a.ratio;
  if ((p + 1) % r) {
    if (threadIdx.x == 0) {
      a.flag[t] = 0;
      a.entry_pos[t] = 0;
    }
    for (int64_t c = threadIdx.x; c < a.d; c += blockDim.x) a.entry[t * a.d + c] = 0.0f;
    return;
  }
  const int seq = a.m.row_seq[t];
  const int64_t j = (p + 1) / r - 1;
  if (threadIdx.x == 0) {
    a.flag[t] = 1;
    a.entry_pos[t] = static_cast<int64_t>(r) * j;
  }
  const int coff = a.overlap ? 2 : 1;
  const int ncand = coff * r;
  // Candidate rows (pointer per candidate; null = absent: j == 0's previous block).
  __shared__ const float* s_rows[256];
  __shared__ int64_t s_choff[256];
  for (int c = threadIdx.x; c < ncand; c += blockDim.x) {
    if (a.overlap && c < r) {
      s_rows[c] = j > 0 ? comp_row_ptr(a, seq, r * (j - 1) + c) : nullptr;
      s_choff[c] = 0;
    } else {
      const int i = a.overlap ? c - r : c;
      s_rows[c] = comp_row_ptr(a, seq, r * j + i);
      s_choff[c] = a.overlap ? a.d : 0;
    }
  }
  __syncthreads();
  // kernels::cpu::compress_pool's operations in its order (candidates in list order, products and
  // sums rounded one at a time: no FMA); only expf differs from the host's exp.
  const int64_t C = a.chans;
  for (int64_t ch = threadIdx.x; ch < a.d; ch += blockDim.x) {
    float mx = -INFINITY;
    for (int c = 0; c < ncand; ++c) {
      if (!s_rows[c]) continue;
      const float s = s_rows[c][C + s_choff[c] + ch];
      mx = s > mx ? s : mx;
    }
    float z = 0.0f;
    for (int c = 0; c < ncand; ++c)
      if (s_rows[c]) z = add_rn(z, expf(s_rows[c][C + s_choff[c] + ch] - mx));
    float acc = 0.0f;
    for (int c = 0; c < ncand; ++c) {
      if (!s_rows[c]) continue;
      const float e = expf(s_rows[c][C + s_choff[c] + ch] - mx);
      acc = add_rn(acc, mul_rn(s_rows[c][s_choff[c] + ch], div_rn(e, z)));
    }
    a.entry[t * a.d + ch] = num::round_bf16(acc);
  }
}

__global__ void store_entries_kernel(StoreEntriesArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = blockIdx.x;
  if (t >= a.rows || !a.flag[t]) return;
  const int seq = a.m.row_seq[t];
  const int64_t pos = a.entry_pos[t];
  const int32_t blk = a.m.block_tables[static_cast<int64_t>(seq) * a.m.max_blocks + pos / a.m.block_size];
  const int64_t in_blk = (pos % a.m.block_size) / a.ratio;
  uint8_t* dst = a.pool + static_cast<int64_t>(blk) * a.block_bytes + a.pool_off + in_blk * a.rec_bytes;
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

void store_entries(const StoreEntriesArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(store_entries_kernel, static_cast<unsigned>(a.rows), 128, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
