// DSpark's draft attention (attention.h): one block per (row, head). The key list (the context
// ring, then the draft block) is gathered as pointers into shared memory, then attend_keys scores
// every key, takes one global max, normalises with the sink and writes the bf16 output (optionally
// rotated back: the output's inverse RoPE, DraftAttnArgs::out_inv_freq).
#include "model/cuda/attention.h"

#include <cuda_runtime.h>

#include "common/numeric_core.h"
#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/row_math.cuh"
#include "model/cuda/smem_bounds.h"

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
// (bf16-rounded) to out[hd], with inv_freq its inverse RoPE at pos on the last rope_dim dims (rope()'s
// pair operation; the pair (d, d + 1) is in lanes d, d + 1 of one warp: hd is a multiple of 64, so
// every lane of a warp runs the same iterations). s_keys/s_p in shared memory, nk keys. blockDim.x
// threads (a multiple of 32).
__device__ void attend_keys(const float* qh, const uint64_t* s_keys, float* s_p, int nk, const KvRecordLayout& l,
                            int hd, float scale, float sink, float* out, float* s_red, const float* inv_freq,
                            int rope_dim, int64_t pos) {
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
    float v = nk > 0 ? num::round_bf16(acc / z) : 0.0f;
    if (inv_freq) {
      const float other = __shfl_xor_sync(0xffffffffu, v, 1);
      const int r0 = hd - rope_dim;
      if (d >= r0) {
        float pr[2] = {(d & 1) ? other : v, (d & 1) ? v : other};
        kernels::cuda::row::rope_pair(pr, pos, inv_freq[(d - r0) / 2], true, true);
        v = pr[d & 1];
      }
    }
    out[d] = v;
  }
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
              a.out + (r * a.heads + h) * a.hd, s_red, a.out_inv_freq, a.out_rope_dim,
              a.out_inv_freq ? a.out_positions[r] : 0);
}

size_t attn_smem(int max_keys, int hd) {
  return static_cast<size_t>(max_keys) * (sizeof(uint64_t) + sizeof(float)) + sizeof(float) * hd;
}

}  // namespace

void draft_attention(const DraftAttnArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  if (a.out_inv_freq)
    TANDEM_CHECK(a.out_positions && a.out_rope_dim > 0 && a.out_rope_dim % 2 == 0 && a.out_rope_dim <= a.hd &&
                 a.hd % 64 == 0);
  const size_t smem = attn_smem(a.window + a.K, a.hd);
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(draft_attention_kernel), smem);
  dim3 grid(static_cast<unsigned>(a.B * a.K), static_cast<unsigned>(a.heads));
  draft_attention_kernel<<<grid, 256, smem, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

kernels::cuda::SmemBound draft_attention_smem_bound(int window, int block, int hd) {
  return {"draft_attention_kernel", static_cast<int64_t>(attn_smem(window + block, hd)),
          "window " + std::to_string(window) + " + " + std::to_string(block) + " block rows, head dim " +
              std::to_string(hd),
          ""};
}

}  // namespace tandem::cuda_model
