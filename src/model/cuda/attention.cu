// Attention kernels (attention.h): one block per (row, head). The key list (window, then the
// compressed entries or the draft block) is gathered as pointers into shared memory, then
// attend_keys scores every key, normalises with the sink and writes the bf16 output.
#include "model/cuda/attention.h"

#include <cuda_runtime.h>

#include "common/numeric_core.h"
#include "kernels/cuda/device.cuh"

namespace tandem::cuda_model {

using kernels::cuda::block_max;
using kernels::cuda::block_sum;
using kernels::cuda::warp_sum;

namespace {

// Key pointers carry a tag in bit 0: 1 = fp32 row (this step's KV), 0 = a KV record.
__device__ __forceinline__ float key_elem(uint64_t kp, const KvRecordLayout& l, int d) {
  if (kp & 1) return reinterpret_cast<const float*>(kp & ~uint64_t(1))[d];
  return kv_record_get(reinterpret_cast<const uint8_t*>(kp), l, d);
}

// The score scale exactly as the CPU's attend: 1.0f / std::sqrt(float(hd)), a correctly rounded
// square root and division (rsqrtf is an approximation that can differ in the last bit, which
// shifts every score of every row the same way).
__device__ __forceinline__ float attn_scale(int hd) { return __fdiv_rn(1.0f, __fsqrt_rn(static_cast<float>(hd))); }

// Scores of the listed keys for head h of query qh, then the sink-normalised weighted sum, written
// (bf16-rounded) to out[hd]. s_keys/s_p in shared memory, nk keys. blockDim.x threads.
__device__ void attend_keys(const float* qh, const uint64_t* s_keys, float* s_p, int nk, const KvRecordLayout& l,
                            int hd, float scale, float sink, float* out, float* s_red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int i = warp; i < nk; i += nw) {
    float acc = 0.0f;
    for (int d = lane; d < hd; d += 32) acc += qh[d] * key_elem(s_keys[i], l, d);
    acc = warp_sum(acc);
    if (lane == 0) s_p[i] = acc * scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < nk; i += blockDim.x) mx = fmaxf(mx, s_p[i]);
  mx = block_max(mx, s_red);
  __syncthreads();
  float z = 0.0f;
  for (int i = threadIdx.x; i < nk; i += blockDim.x) {
    const float e = expf(s_p[i] - mx);
    s_p[i] = e;
    z += e;
  }
  z = block_sum(z, s_red);
  z += expf(sink - mx);
  __syncthreads();
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < nk; ++i) acc += s_p[i] * key_elem(s_keys[i], l, d);
    out[d] = nk > 0 ? num::round_bf16(acc / z) : 0.0f;
  }
}

__global__ void attention_kernel(AttnArgs a) {
  extern __shared__ unsigned char smem_raw[];
  uint64_t* s_keys = reinterpret_cast<uint64_t*>(smem_raw);
  float* s_p = reinterpret_cast<float*>(s_keys + a.max_keys);
  float* s_q = s_p + a.max_keys;
  __shared__ float s_red[32];
  __shared__ int s_nk;
  const StepMeta& m = a.m;
  const int64_t t = blockIdx.x;  // rows can exceed gridDim.y's 65535 (prefill)
  const int h = blockIdx.y;
  if (t >= a.rows) return;
  const int seq = m.row_seq[t];
  const int64_t p = m.positions[t];
  const int64_t start = m.seq_start[seq];
  const int slot = m.seq_slot[seq];
  const uint8_t* st = a.slot_state + static_cast<int64_t>(slot) * a.slot_bytes;
  const int64_t w0 = p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  const int nwin = static_cast<int>(p - w0 + 1);
  for (int i = threadIdx.x; i < nwin; i += blockDim.x) {
    const int64_t wp = w0 + i;
    uint64_t kp;
    if (wp >= start)
      kp = reinterpret_cast<uint64_t>(a.step_kv + (static_cast<int64_t>(m.seq_row0[seq]) + (wp - start)) * a.hd) | 1;
    else
      kp = reinterpret_cast<uint64_t>(st + a.win_off + (wp % a.win_ring) * a.rec.bytes);
    s_keys[i] = kp;
  }
  int ncomp = 0;
  if (a.ratio) {
    const int64_t vis = (p + 1) / a.ratio;
    auto entry_ptr = [&](int64_t j) {
      const int64_t pos = static_cast<int64_t>(a.ratio) * j;
      const int32_t blk = m.block_tables[static_cast<int64_t>(seq) * m.max_blocks + pos / m.block_size];
      return reinterpret_cast<uint64_t>(a.pool + static_cast<int64_t>(blk) * a.block_bytes + a.pool_main +
                                        ((pos % m.block_size) / a.ratio) * a.rec.bytes);
    };
    if (a.topk) {
      const int k = static_cast<int>(vis < a.topk_k ? vis : a.topk_k);
      const int32_t* top = a.topk + t * a.topk_ld;
      if (threadIdx.x == 0) {
        // Selected entries (valid ids only), in the list's order.
        int n = 0;
        for (int i = 0; i < k; ++i)
          if (top[i] >= 0 && top[i] < vis) s_keys[nwin + n++] = entry_ptr(top[i]);
        s_nk = n;
      }
      __syncthreads();
      ncomp = s_nk;
    } else {
      ncomp = static_cast<int>(vis);
      for (int i = threadIdx.x; i < ncomp; i += blockDim.x) s_keys[nwin + i] = entry_ptr(i);
    }
  }
  const float* qh = a.q + (t * a.heads + h) * a.hd;
  for (int d = threadIdx.x; d < a.hd; d += blockDim.x) s_q[d] = qh[d];
  __syncthreads();
  const int nk = nwin + ncomp;
  attend_keys(s_q, s_keys, s_p, nk, a.rec, a.hd, attn_scale(a.hd), a.sink[h],
              a.out + (t * a.heads + h) * a.hd, s_red);
}

__global__ void draft_attention_kernel(DraftAttnArgs a) {
  extern __shared__ unsigned char smem_raw[];
  const int max_keys = a.window + a.K;
  uint64_t* s_keys = reinterpret_cast<uint64_t*>(smem_raw);
  float* s_p = reinterpret_cast<float*>(s_keys + max_keys);
  float* s_q = s_p + max_keys;
  __shared__ float s_red[32];
  const int64_t r = blockIdx.x;  // b*K + t
  const int h = blockIdx.y;
  const int64_t b = r / a.K;
  if (b >= a.B) return;
  const int64_t P = a.req_pos[b];
  const uint8_t* ring = a.ctx + static_cast<int64_t>(a.req_slot[b]) * a.slot_stride + a.stage_off;
  const int64_t c0 = P - a.window > 0 ? P - a.window : 0;
  const int nctx = static_cast<int>(P - c0);
  for (int i = threadIdx.x; i < nctx; i += blockDim.x)
    s_keys[i] = reinterpret_cast<uint64_t>(ring + ((c0 + i) % a.window) * a.rec.bytes);
  for (int i = threadIdx.x; i < a.K; i += blockDim.x)
    s_keys[nctx + i] = reinterpret_cast<uint64_t>(a.block_kv + (b * a.K + i) * a.hd) | 1;
  const float* qh = a.q + (r * a.heads + h) * a.hd;
  for (int d = threadIdx.x; d < a.hd; d += blockDim.x) s_q[d] = qh[d];
  __syncthreads();
  attend_keys(s_q, s_keys, s_p, nctx + a.K, a.rec, a.hd, attn_scale(a.hd), a.sink[h],
              a.out + (r * a.heads + h) * a.hd, s_red);
}

size_t attn_smem(int max_keys, int hd) {
  return static_cast<size_t>(max_keys) * (sizeof(uint64_t) + sizeof(float)) + sizeof(float) * hd;
}

}  // namespace

void attention(const AttnArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  const size_t smem = attn_smem(a.max_keys, a.hd);
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(attention_kernel), smem);
  dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(a.heads));
  attention_kernel<<<grid, 256, smem, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void draft_attention(const DraftAttnArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  const size_t smem = attn_smem(a.window + a.K, a.hd);
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(draft_attention_kernel), smem);
  dim3 grid(static_cast<unsigned>(a.B * a.K), static_cast<unsigned>(a.heads));
  draft_attention_kernel<<<grid, 256, smem, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
