// Device kernels of the DeepSeek-V4 runner (see model_kernels.h). Correctness first: each mirrors
// the CPU forward's arithmetic per row; speed work (fusion, tensor cores) is tracked in
// docs/PERFORMANCE.md.
#include "model/cuda/model_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "model/cuda/launch_smem.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/sampling_device.cuh"
#include "kernels/sampling.h"

namespace tandem::cuda_model {

using kernels::WeightFormat;
using kernels::WeightRef;
using kernels::cuda::block_max;
using kernels::cuda::block_sum;
using kernels::cuda::ceil_div;
using kernels::cuda::warp_sum;

namespace {

// Element (n, k) of a stored weight (any format).
__device__ __forceinline__ float w_at(const WeightRef& w, int64_t n, int64_t k) {
  switch (w.format) {
    case WeightFormat::kF32:
      return static_cast<const float*>(w.data)[n * w.k + k];
    case WeightFormat::kBf16:
      return num::bf16_to_f32(static_cast<const uint16_t*>(w.data)[n * w.k + k]);
    case WeightFormat::kFp8Block: {
      const int64_t sld = w.scale_ld ? w.scale_ld : (w.k + 127) / 128;
      return num::e4m3_decode(static_cast<const uint8_t*>(w.data)[n * w.k + k]) *
             num::e8m0_to_f32(w.scale[(n / 128) * sld + k / 128]);
    }
    case WeightFormat::kMxfp4: {
      const uint8_t b = static_cast<const uint8_t*>(w.data)[n * (w.k / 2) + k / 2];
      const uint8_t nib = (k & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xf);
      return num::e2m1_decode(nib) * num::e8m0_to_f32(w.scale[n * (w.k / 32) + k / 32]);
    }
  }
  return 0.0f;
}

// Warp dot product of x[0..k) (shared or global fp32) with weight row n, fp32 accumulation.
__device__ __forceinline__ float warp_row_dot(const WeightRef& w, int64_t n, const float* x, int64_t k) {
  const int lane = threadIdx.x & 31;
  float acc = 0.0f;
  if (w.format == WeightFormat::kMxfp4) {
    // 32 consecutive values share a scale: lane handles pairs (2 values per byte).
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + n * (k / 2);
    const uint8_t* sc = w.scale + n * (k / 32);
    for (int64_t b = lane; b < k / 2; b += 32) {
      const uint8_t v = row[b];
      const float s = num::e8m0_to_f32(sc[(2 * b) / 32]);
      acc += x[2 * b] * (num::e2m1_decode(static_cast<uint8_t>(v & 0xf)) * s);
      acc += x[2 * b + 1] * (num::e2m1_decode(static_cast<uint8_t>(v >> 4)) * s);
    }
  } else {
    for (int64_t i = lane; i < k; i += 32) acc += x[i] * w_at(w, n, i);
  }
  return warp_sum(acc);
}

__device__ __forceinline__ uint8_t* slot_base(uint8_t* state, int64_t slot_bytes, int slot) {
  return state + static_cast<int64_t>(slot) * slot_bytes;
}

// ---------------------------------------------------------------- embedding
__global__ void embed_kernel(WeightRef embed, const int32_t* ids, int64_t rows, int hc, int64_t dim, float* h) {
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  const int32_t id = ids[r];
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = w_at(embed, id, d);
    for (int k = 0; k < hc; ++k) h[(r * hc + k) * dim + d] = v;
  }
}

// ---------------------------------------------------------------- KV records
// One block (128 threads) per row.
__global__ void kv_quantize_kernel(float* x, int64_t rows, int64_t ldx, KvRecordLayout l, uint8_t* rec) {
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  float* xr = x + r * ldx;
  uint8_t* out = rec + r * l.bytes;
  __shared__ float s_amax[64];
  if (l.kind == KvRecordKind::kBf16) {
    for (int d = threadIdx.x; d < l.head_dim; d += blockDim.x) {
      const uint16_t h = num::f32_to_bf16(xr[d]);
      out[2 * d] = static_cast<uint8_t>(h & 0xff);
      out[2 * d + 1] = static_cast<uint8_t>(h >> 8);
    }
    return;
  }
  // RoPE dims: bf16 (the values are bf16 already).
  for (int d = l.nope + threadIdx.x; d < l.head_dim; d += blockDim.x) {
    const uint16_t h = num::f32_to_bf16(xr[d]);
    const int off = l.rope_off + 2 * (d - l.nope);
    out[off] = static_cast<uint8_t>(h & 0xff);
    out[off + 1] = static_cast<uint8_t>(h >> 8);
  }
  const int group = l.kind == KvRecordKind::kFp8 ? 64 : 16;
  const int ngroups = l.nope / group;
  // Group maxima (NaN ignored, as the CPU's comparisons do).
  for (int g = threadIdx.x; g < ngroups; g += blockDim.x) {
    float amax = 0.0f;
    for (int i = 0; i < group; ++i) {
      const float a = fabsf(xr[g * group + i]);
      amax = a > amax ? a : amax;
    }
    s_amax[g] = amax;
  }
  // pad bytes between the scales and the RoPE dims
  for (int b = l.scale_off + ngroups + threadIdx.x; b < l.rope_off; b += blockDim.x) out[b] = 0;
  __syncthreads();
  for (int d = threadIdx.x; d < l.nope; d += blockDim.x) {
    const int g = d / group;
    const float xv = xr[d];
    const bool nan = num::is_nan_bits(xv);
    if (l.kind == KvRecordKind::kFp8) {
      const int e = num::ue8m0_scale_exponent(s_amax[g], num::kE4m3Max, num::kFp8ActAmaxFloor);
      const float sc = num::pow2_int(e);
      float v = xv / sc;
      v = fminf(fmaxf(v, -num::kE4m3Max), num::kE4m3Max);
      const uint8_t c = num::f32_to_e4m3(nan ? xv : v);
      out[d] = c;
      if (d % 64 == 0) out[l.scale_off + g] = num::e8m0_from_exponent(e);
      xr[d] = num::e4m3_decode(c) * sc;
    } else {
      const uint8_t sb = num::nvfp4_scale(s_amax[g]);
      const float sc = num::e4m3_decode(sb);
      const float inv = sc != 0.0f ? 1.0f / sc : 0.0f;
      const uint8_t c = num::f32_to_e2m1(xv * inv);
      if (d % 16 == 0) out[l.scale_off + g] = sb;
      xr[d] = nan ? xv : num::e2m1_decode(c) * sc;
    }
  }
  if (l.kind == KvRecordKind::kNvfp4) {
    // Two codes per byte: packed after every element is rewritten. The decoded values are
    // e2m1 * scale exactly, so dividing by the scale gives each code back.
    __syncthreads();
    for (int b = threadIdx.x; b < l.nope / 2; b += blockDim.x) {
      uint8_t nib[2];
      for (int i = 0; i < 2; ++i) {
        const int d = 2 * b + i;
        const float sc = num::e4m3_decode(out[l.scale_off + d / 16]);
        const float v = xr[d];
        nib[i] = (sc != 0.0f && !num::is_nan_bits(v)) ? num::f32_to_e2m1(v / sc) : 0;
      }
      out[b] = static_cast<uint8_t>(nib[0] | (nib[1] << 4));
    }
  }
}

__global__ void index_key_quantize_kernel(float* x, int64_t rows, IndexKeyLayout l, uint8_t* rec) {
  const int64_t r = blockIdx.x;
  if (r >= rows) return;
  float* xr = x + r * l.dim;
  uint8_t* out = rec + r * l.bytes;
  __shared__ int s_e[64];
  const int ng = l.dim / 32;
  for (int g = threadIdx.x; g < ng; g += blockDim.x) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
      const float a = fabsf(xr[g * 32 + i]);
      amax = a > amax ? a : amax;
    }
    s_e[g] = num::ue8m0_scale_exponent(amax, num::kE2m1Max, num::kFp4ActAmaxFloor);
    out[l.dim / 2 + g] = num::e8m0_from_exponent(s_e[g]);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < l.dim / 2; b += blockDim.x) {
    uint8_t nib[2];
    float dec[2];
    for (int i = 0; i < 2; ++i) {
      const int d = 2 * b + i;
      const float sc = num::pow2_int(s_e[d / 32]);
      const float xv = xr[d];
      float v = xv / sc;
      v = fminf(fmaxf(v, -num::kE2m1Max), num::kE2m1Max);
      nib[i] = num::f32_to_e2m1(v);
      dec[i] = num::is_nan_bits(xv) ? xv : num::e2m1_decode(nib[i]) * sc;
    }
    out[b] = static_cast<uint8_t>(nib[0] | (nib[1] << 4));
    xr[2 * b] = dec[0];
    xr[2 * b + 1] = dec[1];
  }
}

// ---------------------------------------------------------------- compressor
__global__ void comp_rows_kernel(const float* kv, const float* gate, const float* ape, StepMeta m, int64_t rows,
                                 int64_t C, int ratio, float* out) {
  const int64_t t = blockIdx.x;
  if (t >= rows) return;
  const int64_t ph = m.positions[t] % ratio;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    out[t * 2 * C + c] = kv[t * C + c];
    out[t * 2 * C + C + c] = gate[t * C + c] + ape[ph * C + c];
  }
}

__device__ __forceinline__ const float* comp_row_ptr(const CompressArgs& a, const StepMeta& m, int seq, int64_t q) {
  const int64_t start = m.seq_start[seq];
  if (q >= start) return a.step_rows + (static_cast<int64_t>(m.seq_row0[seq]) + (q - start)) * 2 * a.chans;
  const uint8_t* st = a.slot_state + static_cast<int64_t>(m.seq_slot[seq]) * a.slot_bytes + a.ring_off;
  return reinterpret_cast<const float*>(st) + (q % a.ring) * 2 * a.chans;
}

__global__ void compress_entries_kernel(CompressArgs a, StepMeta m, int64_t rows, float* entry, int64_t* entry_pos,
                                        int32_t* flag) {
  const int64_t t = blockIdx.x;
  if (t >= rows) return;
  const int64_t p = m.positions[t];
  const int r = a.ratio;
  if ((p + 1) % r) {
    if (threadIdx.x == 0) {
      flag[t] = 0;
      entry_pos[t] = 0;
    }
    for (int64_t c = threadIdx.x; c < a.d; c += blockDim.x) entry[t * a.d + c] = 0.0f;
    return;
  }
  const int seq = m.row_seq[t];
  const int64_t j = (p + 1) / r - 1;
  if (threadIdx.x == 0) {
    flag[t] = 1;
    entry_pos[t] = static_cast<int64_t>(r) * j;
  }
  const int coff = a.overlap ? 2 : 1;
  const int ncand = coff * r;
  // Candidate rows (pointer per candidate; null = absent: j == 0's previous block).
  __shared__ const float* s_rows[256];
  __shared__ int64_t s_choff[256];
  for (int c = threadIdx.x; c < ncand; c += blockDim.x) {
    if (a.overlap && c < r) {
      s_rows[c] = j > 0 ? comp_row_ptr(a, m, seq, r * (j - 1) + c) : nullptr;
      s_choff[c] = 0;
    } else {
      const int i = a.overlap ? c - r : c;
      s_rows[c] = comp_row_ptr(a, m, seq, r * j + i);
      s_choff[c] = a.overlap ? a.d : 0;
    }
  }
  __syncthreads();
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
      if (s_rows[c]) z += expf(s_rows[c][C + s_choff[c] + ch] - mx);
    float acc = 0.0f;
    for (int c = 0; c < ncand; ++c) {
      if (!s_rows[c]) continue;
      const float e = expf(s_rows[c][C + s_choff[c] + ch] - mx);
      acc += s_rows[c][s_choff[c] + ch] * (e / z);
    }
    entry[t * a.d + ch] = num::round_bf16(acc);
  }
}

__global__ void store_entries_kernel(const uint8_t* rec, int64_t rec_bytes, const int32_t* flag,
                                     const int64_t* entry_pos, StepMeta m, int64_t rows, int ratio, uint8_t* pool,
                                     int64_t block_bytes, int64_t pool_off) {
  const int64_t t = blockIdx.x;
  if (t >= rows || !flag[t]) return;
  const int seq = m.row_seq[t];
  const int64_t pos = entry_pos[t];
  const int32_t blk = m.block_tables[static_cast<int64_t>(seq) * m.max_blocks + pos / m.block_size];
  const int64_t in_blk = (pos % m.block_size) / ratio;
  uint8_t* dst = pool + static_cast<int64_t>(blk) * block_bytes + pool_off + in_blk * rec_bytes;
  for (int64_t b = threadIdx.x; b < rec_bytes; b += blockDim.x) dst[b] = rec[t * rec_bytes + b];
}

__global__ void ring_commit_kernel(const uint8_t* src, int64_t bpr, StepMeta m, int64_t rows, uint8_t* state,
                                   int64_t slot_bytes, int64_t ring_off, int ring) {
  const int64_t t = blockIdx.x;
  if (t >= rows) return;
  const int seq = m.row_seq[t];
  const int64_t t_in = t - m.seq_row0[seq];
  if (t_in < static_cast<int64_t>(m.seq_len[seq]) - ring) return;
  const int64_t p = m.positions[t];
  uint8_t* dst = slot_base(state, slot_bytes, m.seq_slot[seq]) + ring_off + (p % ring) * bpr;
  for (int64_t b = threadIdx.x; b < bpr; b += blockDim.x) dst[b] = src[t * bpr + b];
}

__global__ void ring_write_kernel(const uint8_t* src, int64_t bpr, int64_t first, int64_t n, int64_t pos0,
                                  uint8_t* ring_base, int ring) {
  const int64_t t = first + blockIdx.x;
  if (t >= n) return;
  uint8_t* dst = ring_base + ((pos0 + t) % ring) * bpr;
  for (int64_t b = threadIdx.x; b < bpr; b += blockDim.x) dst[b] = src[t * bpr + b];
}

// ---------------------------------------------------------------- indexer
// Block: one row t, a chunk of 8 entries per iteration (one warp per entry). q[t] in shared memory.
__global__ void indexer_kernel(const float* q, const float* w, StepMeta m, int64_t rows, int heads, int dim,
                               const uint8_t* pool, int64_t block_bytes, int64_t pool_idx, IndexKeyLayout kl,
                               float* scores, int64_t n_cols, int32_t* visible) {
  extern __shared__ float smem[];
  float* sq = smem;                   // [heads * dim]
  float* sw = smem + heads * dim;     // [heads]
  const int64_t t = blockIdx.y;
  if (t >= rows) return;
  const int64_t p = m.positions[t];
  const int64_t vis = (p + 1) / 4;
  if (blockIdx.x == 0 && threadIdx.x == 0) visible[t] = static_cast<int32_t>(vis);
  for (int i = threadIdx.x; i < heads * dim; i += blockDim.x) sq[i] = q[t * heads * dim + i];
  for (int i = threadIdx.x; i < heads; i += blockDim.x) sw[i] = w[t * heads + i];
  __syncthreads();
  const int seq = m.row_seq[t];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int64_t per_block = static_cast<int64_t>(nw) * 16;
  const int64_t e0 = blockIdx.x * per_block;
  for (int64_t e = e0 + warp; e < e0 + per_block && e < n_cols; e += nw) {
    float total = -INFINITY;
    if (e < vis) {
      const int64_t pos = 4 * e;
      const int32_t blk = m.block_tables[static_cast<int64_t>(seq) * m.max_blocks + pos / m.block_size];
      const uint8_t* rec = pool + static_cast<int64_t>(blk) * block_bytes + pool_idx + ((pos % m.block_size) / 4) * kl.bytes;
      // Each lane holds dims lane, lane+32, ... of the key.
      float kreg[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) kreg[i] = (lane + 32 * i < dim) ? index_key_get(rec, kl, lane + 32 * i) : 0.0f;
      total = 0.0f;
      for (int h = 0; h < heads; ++h) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (lane + 32 * i < dim) acc += sq[h * dim + lane + 32 * i] * kreg[i];
        acc = warp_sum(acc);
        const float dot = num::round_bf16(acc);
        const float term = num::round_bf16((dot > 0.0f ? dot : 0.0f) * sw[h]);
        total += term;
      }
      total = num::round_bf16(total);
    }
    if (lane == 0) scores[t * n_cols + e] = total;
  }
}

// ---------------------------------------------------------------- attention
// Key pointers carry a tag in bit 0: 1 = fp32 row (this step's KV), 0 = a KV record.
__device__ __forceinline__ float key_elem(uint64_t kp, const KvRecordLayout& l, int d) {
  if (kp & 1) return reinterpret_cast<const float*>(kp & ~uint64_t(1))[d];
  return kv_record_get(reinterpret_cast<const uint8_t*>(kp), l, d);
}

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

__global__ void attention_kernel(AttnArgs a, StepMeta m, int64_t rows) {
  extern __shared__ unsigned char smem_raw[];
  uint64_t* s_keys = reinterpret_cast<uint64_t*>(smem_raw);
  float* s_p = reinterpret_cast<float*>(s_keys + a.max_keys);
  float* s_q = s_p + a.max_keys;
  __shared__ float s_red[32];
  __shared__ int s_nk;
  const int64_t t = blockIdx.x;  // rows can exceed gridDim.y's 65535 (prefill)
  const int h = blockIdx.y;
  if (t >= rows) return;
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
  attend_keys(s_q, s_keys, s_p, nk, a.rec, a.hd, rsqrtf(static_cast<float>(a.hd)), a.sink[h],
              a.out + (t * a.heads + h) * a.hd, s_red);
}

__global__ void draft_attention_kernel(DraftAttnArgs a, int64_t B) {
  extern __shared__ unsigned char smem_raw[];
  const int max_keys = a.window + a.K;
  uint64_t* s_keys = reinterpret_cast<uint64_t*>(smem_raw);
  float* s_p = reinterpret_cast<float*>(s_keys + max_keys);
  float* s_q = s_p + max_keys;
  __shared__ float s_red[32];
  const int64_t r = blockIdx.x;  // b*K + t
  const int h = blockIdx.y;
  const int64_t b = r / a.K;
  if (b >= B) return;
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
  attend_keys(s_q, s_keys, s_p, nctx + a.K, a.rec, a.hd, rsqrtf(static_cast<float>(a.hd)), a.sink[h],
              a.out + (r * a.heads + h) * a.hd, s_red);
}

// ---------------------------------------------------------------- MoE
// Block: one pair, 8 warps; each warp computes output columns n = warp, warp + 8, ...
__global__ void moe_up_kernel(const float* xq, const int32_t* eids, const float* weights, int64_t pairs, int topk,
                              WeightRef w1, WeightRef w3, int64_t inter, int64_t dim, float limit, float* gact) {
  extern __shared__ float sx[];
  const int64_t i = blockIdx.x;  // pairs can exceed gridDim.y's 65535
  if (i >= pairs) return;
  const int64_t t = i / topk;
  for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) sx[k] = xq[t * dim + k];
  __syncthreads();
  const int64_t e = eids[i];
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * nw * 4;
  for (int64_t n = n0 + warp; n < n0 + nw * 4 && n < inter; n += nw) {
    const float g = warp_row_dot(w1, e * inter + n, sx, dim);
    const float u = warp_row_dot(w3, e * inter + n, sx, dim);
    if ((threadIdx.x & 31) == 0) {
      // bf16 outputs of the two linears (round_out), then the clamped SwiGLU times the route weight.
      float gg = num::round_bf16(g), uu = num::round_bf16(u);
      if (limit > 0.0f) {
        uu = fminf(fmaxf(uu, -limit), limit);
        gg = fminf(gg, limit);
      }
      const float silu = gg / (1.0f + expf(-gg));
      gact[i * inter + n] = num::round_bf16(silu * uu * weights[i]);
    }
  }
}

__global__ void moe_down_kernel(const float* gq, const int32_t* eids, int64_t pairs, WeightRef w2, int64_t inter,
                                int64_t dim, float* out) {
  extern __shared__ float sx[];
  const int64_t i = blockIdx.x;
  if (i >= pairs) return;
  for (int64_t k = threadIdx.x; k < inter; k += blockDim.x) sx[k] = gq[i * inter + k];
  __syncthreads();
  const int64_t e = eids[i];
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * nw * 4;
  for (int64_t n = n0 + warp; n < n0 + nw * 4 && n < dim; n += nw) {
    const float y = warp_row_dot(w2, e * dim + n, sx, inter);
    if ((threadIdx.x & 31) == 0) out[i * dim + n] = num::round_bf16(y);
  }
}

__global__ void moe_combine_kernel(const float* pair_out, const int32_t* eids, const float* shared, int64_t tokens,
                                   int topk, int64_t dim, float* y) {
  const int64_t t = blockIdx.x;
  if (t >= tokens) return;
  int order[16];
  for (int k = 0; k < topk; ++k) order[k] = k;
  // ascending expert id (insertion sort; ids are distinct within a token)
  for (int a = 1; a < topk; ++a) {
    const int v = order[a];
    int b = a - 1;
    while (b >= 0 && eids[t * topk + order[b]] > eids[t * topk + v]) {
      order[b + 1] = order[b];
      --b;
    }
    order[b + 1] = v;
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < topk; ++k) acc += pair_out[(t * topk + order[k]) * dim + d];
    y[t * dim + d] = num::round_bf16(acc + shared[t * dim + d]);
  }
}

// ---------------------------------------------------------------- small helpers
__global__ void taps_kernel(const float* h, const int32_t* dst_row, int64_t rows, int hc, int64_t dim, float* taps,
                            int64_t td, int64_t col_off) {
  const int64_t t = blockIdx.x;
  if (t >= rows || dst_row[t] < 0) return;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < hc; ++k) acc += h[(t * hc + k) * dim + d];
    taps[static_cast<int64_t>(dst_row[t]) * td + col_off + d] = num::round_bf16(acc / static_cast<float>(hc));
  }
}

__global__ void scale_round_kernel(float* x, int64_t n, float scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = num::round_bf16(x[i] * scale);
}

__global__ void block_positions_kernel(const int64_t* base, int64_t count, int per, int64_t* pos) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) pos[i] = base[i / per] + i % per;
}

__global__ void iota_positions_kernel(int64_t start, int64_t count, int64_t* pos) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) pos[i] = start + i;
}

__global__ void draft_ids_kernel(const int32_t* anchor, int64_t B, int K, int32_t noise, int32_t* ids) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < B * K) ids[i] = (i % K == 0) ? anchor[i / K] : noise;
}

__global__ void markov_gather_kernel(WeightRef w1, const int32_t* prev, int64_t B, int64_t rank, float* e) {
  const int64_t b = blockIdx.x;
  if (b >= B) return;
  for (int64_t d = threadIdx.x; d < rank; d += blockDim.x) e[b * rank + d] = w_at(w1, prev[b], d);
}

// One block per request. The greedy token is the first maximum (NaN first, as torch.argmax); a
// sampled token is an inverse-CDF draw over softmax(z / T) in id order with the uniform
// rng_uniform(seed, position of the drafted token, kDraft), the key the CPU draft uses.
__global__ void markov_step_kernel(MarkovStepArgs a, int64_t B) {
  __shared__ float s_red[32];
  __shared__ kernels::cuda::BlockReduceScratch s_scr;
  const int64_t b = blockIdx.x;
  if (b >= B) return;
  const int64_t row = b * a.K + a.i;
  const float* base = a.base + row * a.V;
  const float* bias = a.bias + b * a.V;
  float* z = a.logits + row * a.V;
  unsigned long long best = 0;
  for (int64_t v = threadIdx.x; v < a.V; v += blockDim.x) {
    const float zv = base[v] + bias[v];
    z[v] = zv;
    const unsigned long long k = kernels::cuda::select_key(zv, static_cast<uint32_t>(v));
    best = k > best ? k : best;
  }
  // confidence: dot([y, e], conf_w)
  float c = 0.0f;
  for (int64_t d = threadIdx.x; d < a.dim + a.rank; d += blockDim.x) {
    const float f = d < a.dim ? a.y[row * a.dim + d] : a.e[b * a.rank + (d - a.dim)];
    c += f * a.conf_w[d];
  }
  c = block_sum(c, s_red);
  const int argmax = static_cast<int>(kernels::cuda::select_key_index(kernels::cuda::block_argmax_key(best, s_scr)));
  const double T = a.temperature ? a.temperature[b] : 0.0;
  int token = argmax;
  if (T > 0.0) {
    // softmax(z / T) in double; z is visible block-wide after the reductions' __syncthreads()
    const double mx = static_cast<double>(z[argmax]) / T;
    auto mass = [&](int64_t v) { return exp(static_cast<double>(z[v]) / T - mx); };
    const kernels::cuda::ChunkScan cs = kernels::cuda::block_chunk_scan(a.V, mass, s_scr);
    const double u = rng_uniform(a.seed[b], a.pos[b] + 1 + a.i, RngStream::kDraft);
    const int64_t t = kernels::cuda::block_chunk_find(cs, mass, u * cs.total, s_scr);
    token = t >= 0 ? static_cast<int>(t) : static_cast<int>(a.V - 1);
    if (a.probs)
      for (int64_t v = threadIdx.x; v < a.V; v += blockDim.x) a.probs[row * a.V + v] = static_cast<float>(mass(v) / cs.total);
  } else if (a.probs) {
    for (int64_t v = threadIdx.x; v < a.V; v += blockDim.x) a.probs[row * a.V + v] = v == argmax ? 1.0f : 0.0f;
  }
  if (threadIdx.x == 0) {
    a.tokens[b * a.K + a.i] = token;
    a.prev[b] = token;
    a.conf[b * a.K + a.i] = c;
  }
}

}  // namespace

// ================================================================ launchers

void embed_rows(const WeightRef& embed, const int32_t* ids, int64_t rows, int hc, int64_t dim, float* h,
                cudaStream_t s) {
  if (rows == 0) return;
  embed_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(embed, ids, rows, hc, dim, h);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void kv_quantize(float* x, int64_t rows, int64_t ldx, const KvRecordLayout& l, uint8_t* rec, cudaStream_t s) {
  if (rows == 0) return;
  kv_quantize_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(x, rows, ldx, l, rec);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void index_key_quantize(float* x, int64_t rows, const IndexKeyLayout& l, uint8_t* rec, cudaStream_t s) {
  if (rows == 0) return;
  index_key_quantize_kernel<<<static_cast<unsigned>(rows), 64, 0, s>>>(x, rows, l, rec);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void comp_rows_build(const float* kv, const float* gate, const float* ape, const StepMeta& m, int64_t rows,
                     int64_t chans, int ratio, float* rows_out, cudaStream_t s) {
  if (rows == 0) return;
  comp_rows_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(kv, gate, ape, m, rows, chans, ratio, rows_out);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void compress_entries(const CompressArgs& a, const StepMeta& m, int64_t rows, float* entry, int64_t* entry_pos,
                      int32_t* flag, cudaStream_t s) {
  if (rows == 0) return;
  compress_entries_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(a, m, rows, entry, entry_pos, flag);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void store_entries(const uint8_t* rec, int64_t rec_bytes, const int32_t* flag, const int64_t* entry_pos,
                   const StepMeta& m, int64_t rows, int ratio, uint8_t* pool, int64_t block_bytes, int64_t pool_off,
                   cudaStream_t s) {
  if (rows == 0) return;
  store_entries_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(rec, rec_bytes, flag, entry_pos, m, rows, ratio,
                                                                    pool, block_bytes, pool_off);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void ring_commit(const uint8_t* src, int64_t bytes_per_row, const StepMeta& m, int64_t rows, uint8_t* slot_state,
                 int64_t slot_bytes, int64_t ring_off, int ring, cudaStream_t s) {
  if (rows == 0) return;
  ring_commit_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(src, bytes_per_row, m, rows, slot_state, slot_bytes,
                                                                  ring_off, ring);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void ring_write(const uint8_t* src, int64_t bytes_per_row, int64_t first, int64_t n, int64_t pos0, uint8_t* ring_base,
                int ring, cudaStream_t s) {
  if (n <= first) return;
  ring_write_kernel<<<static_cast<unsigned>(n - first), 128, 0, s>>>(src, bytes_per_row, first, n, pos0, ring_base, ring);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void indexer_scores_paged(const float* q, const float* w, const StepMeta& m, int64_t rows, int heads, int dim,
                          const uint8_t* pool, int64_t block_bytes, int64_t pool_idx, const IndexKeyLayout& kl,
                          float* scores, int64_t n_cols, int32_t* visible, cudaStream_t s) {
  if (rows == 0) return;
  TANDEM_CHECK_MSG(dim <= 256, "indexer head dim above 256");
  const int threads = 256;
  const int64_t per_block = (threads / 32) * 16;
  const size_t smem = indexer_smem(heads, dim);
  static bool attr_set = false;
  if (!attr_set) {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(indexer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    attr_set = true;
  }
  TANDEM_CHECK_MSG(smem <= 96 * 1024, "indexer query too large for shared memory");
  TANDEM_CHECK_MSG(rows <= 65535, "indexer launched for more than 65535 rows (chunk the call)");
  dim3 grid(std::max<unsigned>(1, ceil_div(n_cols, per_block)), static_cast<unsigned>(rows));
  indexer_kernel<<<grid, threads, smem, s>>>(q, w, m, rows, heads, dim, pool, block_bytes, pool_idx, kl, scores,
                                             n_cols, visible);
  TANDEM_CUDA_LAUNCH_CHECK();
}

namespace {
void set_attn_smem_limit(const void* fn) {
  int dev = 0, optin = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - 1024));
}
}  // namespace

void attention(const AttnArgs& a, const StepMeta& m, int64_t rows, cudaStream_t s) {
  if (rows == 0) return;
  static bool attr_set = false;
  if (!attr_set) {
    set_attn_smem_limit(reinterpret_cast<const void*>(attention_kernel));
    attr_set = true;
  }
  dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(a.heads));
  attention_kernel<<<grid, 256, attn_smem(a.max_keys, a.hd), s>>>(a, m, rows);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void draft_attention(const DraftAttnArgs& a, int64_t B, cudaStream_t s) {
  if (B == 0) return;
  static bool attr_set = false;
  if (!attr_set) {
    set_attn_smem_limit(reinterpret_cast<const void*>(draft_attention_kernel));
    attr_set = true;
  }
  dim3 grid(static_cast<unsigned>(B * a.K), static_cast<unsigned>(a.heads));
  draft_attention_kernel<<<grid, 256, attn_smem(a.window + a.K, a.hd), s>>>(a, B);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void moe_pairs_up(const float* xq, const int32_t* expert_ids, const float* weights, int64_t pairs, int topk,
                  const WeightRef& w1_all, const WeightRef& w3_all, int64_t inter, int64_t dim, float limit,
                  float* gact, cudaStream_t s) {
  if (pairs == 0) return;
  const int threads = 256, per_block = (threads / 32) * 4;
  static bool attr_set = false;
  if (!attr_set) {
    set_attn_smem_limit(reinterpret_cast<const void*>(moe_up_kernel));
    attr_set = true;
  }
  dim3 grid(static_cast<unsigned>(pairs), ceil_div(inter, per_block));
  moe_up_kernel<<<grid, threads, moe_up_smem(dim), s>>>(xq, expert_ids, weights, pairs, topk, w1_all, w3_all,
                                                           inter, dim, limit, gact);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void moe_pairs_down(const float* gq, const int32_t* expert_ids, int64_t pairs, const WeightRef& w2_all,
                    int64_t inter, int64_t dim, float* out, cudaStream_t s) {
  if (pairs == 0) return;
  const int threads = 256, per_block = (threads / 32) * 4;
  static bool attr_set = false;
  if (!attr_set) {
    set_attn_smem_limit(reinterpret_cast<const void*>(moe_down_kernel));
    attr_set = true;
  }
  dim3 grid(static_cast<unsigned>(pairs), ceil_div(dim, per_block));
  moe_down_kernel<<<grid, threads, moe_down_smem(inter), s>>>(gq, expert_ids, pairs, w2_all, inter, dim, out);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void moe_combine(const float* pair_out, const int32_t* expert_ids, const float* shared, int64_t tokens, int topk,
                 int64_t dim, float* y, cudaStream_t s) {
  if (tokens == 0) return;
  TANDEM_CHECK(topk <= 16);
  moe_combine_kernel<<<static_cast<unsigned>(tokens), 256, 0, s>>>(pair_out, expert_ids, shared, tokens, topk, dim, y);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void taps_mean(const float* h, const int32_t* dst_row, int64_t rows, int hc, int64_t dim, float* taps, int64_t td,
               int64_t col_off, cudaStream_t s) {
  if (rows == 0) return;
  taps_kernel<<<static_cast<unsigned>(rows), 256, 0, s>>>(h, dst_row, rows, hc, dim, taps, td, col_off);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void scale_round(float* x, int64_t n, float scale, cudaStream_t s) {
  if (n == 0) return;
  scale_round_kernel<<<ceil_div(n, 256), 256, 0, s>>>(x, n, scale);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void block_positions(const int64_t* base, int64_t count, int per, int64_t* positions, cudaStream_t s) {
  if (count == 0) return;
  block_positions_kernel<<<ceil_div(count, 256), 256, 0, s>>>(base, count, per, positions);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void iota_positions(int64_t start, int64_t count, int64_t* positions, cudaStream_t s) {
  if (count == 0) return;
  iota_positions_kernel<<<ceil_div(count, 256), 256, 0, s>>>(start, count, positions);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void draft_block_ids(const int32_t* anchor, int64_t B, int K, int32_t noise, int32_t* ids, cudaStream_t s) {
  if (B == 0) return;
  draft_ids_kernel<<<ceil_div(B * K, 256), 256, 0, s>>>(anchor, B, K, noise, ids);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void markov_gather(const WeightRef& w1, const int32_t* prev, int64_t B, int64_t rank, float* e, cudaStream_t s) {
  if (B == 0) return;
  markov_gather_kernel<<<static_cast<unsigned>(B), 128, 0, s>>>(w1, prev, B, rank, e);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void markov_step(const MarkovStepArgs& a, int64_t B, cudaStream_t s) {
  if (B == 0) return;
  markov_step_kernel<<<static_cast<unsigned>(B), 512, 0, s>>>(a, B);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
