// DSpark's draft attention (attention.h): one block per (row, group of G heads). The key list (the
// context ring, then the draft block) is decoded into fp32 rows in shared memory (MQA: every head
// reads the same keys) and read in two passes: the scores of every (head, key), then the
// sink-normalised weighted sums. Where the device's shared memory holds every key's row (the
// built-in model's 133 keys of head dim 128: 68 KB), the list is decoded once, in one pipelined
// pass, before the scores; otherwise (the full size's head dim 512) each pass decodes a chunk of 8 KPW
// keys at a time (8 K elements: 16 keys of head dim 512, 64 of 128), a round of loads and two
// barriers per chunk. Each head's arithmetic is the previous
// one-block-per-(row, head) kernel's, kept here as draft_attention_reference (tests compare the two
// bit for bit): lane-strided dot products and a warp_sum, block_max / block_sum over 256 threads,
// the weighted sum over the keys in order, the bf16 output (optionally rotated back: the output's
// inverse RoPE, DraftAttnArgs::out_inv_freq).
#include "model/cuda/attention.h"

#include <cuda_runtime.h>

#include "common/check.h"
#include "common/numeric_core.h"
#include "kernels/cuda/decode_gemm.h"
#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_math.cuh"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

using kernels::cuda::block_max;
using kernels::cuda::block_sum;
using kernels::cuda::warp_max;
using kernels::cuda::warp_sum;
namespace mma = kernels::cuda::mma;

namespace {

constexpr int kThreads = 256;             // the reference's block: its reductions' shape
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHd = 512;               // one dim pair per thread in the weighted sum
constexpr int kChunkElems = 16 * kMaxHd;  // elements of a chunk's keys: KPW = kChunkElems / (8 hd) keys per warp
constexpr int kMaxPieces = kChunkElems / 8 / kThreads;  // 8-element pieces per thread and chunk (4)
// Keys per warp in a chunk of the score pass for head dim hd: 2 (hd 512), 4 (256), 8 (<= 128).
constexpr int keys_per_warp(int hd) { return hd <= 128 ? 8 : hd <= 256 ? 4 : 2; }

// Key pointers carry a tag in bit 0: 1 = fp32 row (this step's KV), 0 = a KV record.
__device__ __forceinline__ float key_elem(uint64_t kp, const KvRecordLayout& l, int d) {
  if (kp & 1) return reinterpret_cast<const float*>(kp & ~uint64_t(1))[d];
  return kv_record_get(reinterpret_cast<const uint8_t*>(kp), l, d);
}

// The score scale exactly as the CPU's attend: 1.0f / std::sqrt(float(hd)), a correctly rounded
// square root and division (rsqrtf is an approximation that can differ in the last bit, which
// shifts every score of every row the same way).
__device__ __forceinline__ float attn_scale(int hd) { return __fdiv_rn(1.0f, __fsqrt_rn(static_cast<float>(hd))); }

// ---- the row decoder: 8 elements [d0, d0 + 8) of a key (d0 % 8 == 0) ----
// Loaded first (the raw words, so the loads of the next chunk are in flight while this one is used),
// decoded later. Gives kv_record_get's values bit for bit: bf16 bits shifted up; fp8 codes through
// the exact e4m3 -> f16 -> f32 conversion, times the E8M0 scale (the same fp32 product); nvfp4 codes
// through e2m1_decode, times the e4m3 scale. A NaN code or scale gives NaN either way.
struct RawPiece {
  uint4 w0, w1;  // fp32: 8 floats; bf16: w0 = 8 bf16; fp8: w0.x, w0.y = 8 codes; nvfp4: w0.x = 8 nibbles
  uint32_t scale = 0;  // the group's scale byte (fp8, nvfp4)
  int mode = 0;        // 0: none, 1 fp32, 2 bf16, 3 fp8, 4 nvfp4
};

// Records are 8-byte aligned (checked by the launchers), fp32 rows 16-byte aligned.
__device__ __forceinline__ RawPiece load_piece(uint64_t kp, const KvRecordLayout& l, int d0) {
  RawPiece r;
  if (kp & 1) {
    const float4* f = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(kp & ~uint64_t(1)) + d0);
    const float4 x = f[0], y = f[1];
    r.w0 = make_uint4(__float_as_uint(x.x), __float_as_uint(x.y), __float_as_uint(x.z), __float_as_uint(x.w));
    r.w1 = make_uint4(__float_as_uint(y.x), __float_as_uint(y.y), __float_as_uint(y.z), __float_as_uint(y.w));
    r.mode = 1;
    return r;
  }
  const uint8_t* rec = reinterpret_cast<const uint8_t*>(kp);
  if (l.kind == KvRecordKind::kBf16 || d0 >= l.nope) {
    const int off = l.kind == KvRecordKind::kBf16 ? 2 * d0 : l.rope_off + 2 * (d0 - l.nope);
    const uint2 a = *reinterpret_cast<const uint2*>(rec + off), b = *reinterpret_cast<const uint2*>(rec + off + 8);
    r.w0 = make_uint4(a.x, a.y, b.x, b.y);
    r.mode = 2;
  } else if (l.kind == KvRecordKind::kFp8) {
    const uint2 a = *reinterpret_cast<const uint2*>(rec + d0);
    r.w0 = make_uint4(a.x, a.y, 0, 0);
    r.scale = rec[l.scale_off + d0 / 64];
    r.mode = 3;
  } else {
    r.w0 = make_uint4(*reinterpret_cast<const uint32_t*>(rec + d0 / 2), 0, 0, 0);
    r.scale = rec[l.scale_off + d0 / 16];
    r.mode = 4;
  }
  return r;
}

__device__ __forceinline__ void fp8x4(uint32_t codes, float s, float* o) {
  const float2 a = mma::f16x2_to_f32x2(mma::e4m3x2_to_f16x2(codes & 0xffffu));
  const float2 b = mma::f16x2_to_f32x2(mma::e4m3x2_to_f16x2(codes >> 16));
  o[0] = a.x * s;
  o[1] = a.y * s;
  o[2] = b.x * s;
  o[3] = b.y * s;
}

__device__ __forceinline__ void decode_piece(const RawPiece& r, float* o) {
  switch (r.mode) {
    case 1: {
      const uint32_t w[8] = {r.w0.x, r.w0.y, r.w0.z, r.w0.w, r.w1.x, r.w1.y, r.w1.z, r.w1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = __uint_as_float(w[i]);
      break;
    }
    case 2: {
      const uint32_t w[4] = {r.w0.x, r.w0.y, r.w0.z, r.w0.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        o[2 * i] = __uint_as_float(w[i] << 16);
        o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
      break;
    }
    case 3: {
      const float s = num::e8m0_to_f32(static_cast<uint8_t>(r.scale));
      fp8x4(r.w0.x, s, o);
      fp8x4(r.w0.y, s, o + 4);
      break;
    }
    case 4: {
      const float s = num::e4m3_decode(static_cast<uint8_t>(r.scale));
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = num::e2m1_decode(static_cast<uint8_t>((r.w0.x >> (4 * i)) & 0xfu)) * s;
      break;
    }
    default:
      break;
  }
}

// Records [n, l.bytes] decoded to out[n, l.head_dim] by the row decoder (tests).
__global__ void decode_rows_kernel(const uint8_t* recs, int64_t n, KvRecordLayout l, float* out) {
  const int nd = l.head_dim / 8;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n * nd;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = p / nd;
    const int d0 = static_cast<int>(p % nd) * 8;
    float v[8];
    decode_piece(load_piece(reinterpret_cast<uint64_t>(recs + row * l.bytes), l, d0), v);
    for (int i = 0; i < 8; ++i) out[row * l.head_dim + d0 + i] = v[i];
  }
}

// ---- the reference: one block per (row, head) ----

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

// Rows of a stage's context ring: position p at row p % ring_rows (DraftAttnArgs::ring).
__host__ __device__ inline int64_t ring_rows(const DraftAttnArgs& a) { return a.ring > 0 ? a.ring : a.window; }

// The reference's fixed shared memory (tests only; the launcher checks the shape against it).
constexpr int kRefMaxKeys = 512;
constexpr int kRefMaxHd = 1024;

__global__ void __launch_bounds__(kThreads) draft_attention_ref_kernel(DraftAttnArgs a) {
  __shared__ uint64_t s_keys[kRefMaxKeys];
  __shared__ float s_p[kRefMaxKeys];
  __shared__ float s_q[kRefMaxHd];
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
    s_keys[i] = reinterpret_cast<uint64_t>(ring + ((c0 + i) % ring_rows(a)) * a.rec.bytes);
  for (int i = threadIdx.x; i < a.K; i += blockDim.x)
    s_keys[nctx + i] = reinterpret_cast<uint64_t>(a.block_kv + (b * a.K + i) * a.hd) | 1;
  const float* qh = a.q + (r * a.heads + h) * a.hd;
  for (int d = threadIdx.x; d < a.hd; d += blockDim.x) s_q[d] = qh[d];
  __syncthreads();
  attend_keys(s_q, s_keys, s_p, nctx + a.K, a.rec, a.hd, attn_scale(a.hd), a.sink[h],
              a.out + (r * a.heads + h) * a.hd, s_red, a.out_inv_freq, a.out_rope_dim,
              a.out_inv_freq ? a.out_positions[r] : 0);
}

// ---- the kernel: one block per (row, G heads) ----

// Shared memory: key pointers [max_keys] | scores, then weights [G][ldp] | q [G][hd] | keys [chunk][hd]
// (chunk = 8 keys_per_warp(hd): at most kChunkElems floats), or, `whole`, every key's row
// [max_keys][hd].
struct Smem {
  int max_keys, ldp, hd;
  __host__ __device__ Smem(int max_keys_, int hd_) : max_keys(max_keys_), ldp((max_keys_ + 3) / 4 * 4), hd(hd_) {}
  __host__ __device__ int chunk() const { return 8 * keys_per_warp(hd); }
  __host__ __device__ size_t p_off() const { return (static_cast<size_t>(max_keys) * 8 + 15) / 16 * 16; }
  __host__ __device__ size_t q_off(int G) const { return p_off() + static_cast<size_t>(G) * ldp * 4; }
  __host__ __device__ size_t k_off(int G) const { return q_off(G) + static_cast<size_t>(G) * hd * 4; }
  __host__ __device__ size_t bytes(int G, bool whole = false) const {
    return k_off(G) + static_cast<size_t>(whole ? (max_keys + chunk() - 1) / chunk() * chunk() : chunk()) * hd * 4;
  }
};

// Sum of a[p] over the warp's lanes for N pairs p at once, each by warp_sum's butterfly (offsets 16,
// 8, ..., 1; each step's sum the same fp32 addition, a + b == b + a): the first log2(N) steps
// exchange halves of the set instead of all of it. Returns the sum of pair `idx`, held by the lanes
// whose low 5 - log2(N) bits are free.
template <int N>
__device__ __forceinline__ float warp_sum_scatter(float (&a)[N], int lane, int& idx) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N: a power of two <= 32");
  idx = 0;
  int o = 16;
#pragma unroll
  for (int n = N; n > 1; n >>= 1) {
    const bool hi = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < n / 2; ++i) {
      const float send = hi ? a[i] : a[i + n / 2];
      const float keep = hi ? a[i + n / 2] : a[i];
      a[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
    if (hi) idx += n / 2;
    o >>= 1;
  }
  float v = a[0];
  for (; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// kWhole: every key of the list is decoded once, in one pipelined pass before the scores, into its own
// row of shared memory, and both passes read the rows from there (no loads or barriers between
// chunks); else each pass decodes a chunk at a time into one chunk's rows. The arithmetic is the same.
template <int G, int KPW, bool kWhole>
__global__ void __launch_bounds__(kThreads) draft_attention_kernel(DraftAttnArgs a) {
  constexpr int kChunk = 8 * KPW;  // keys a chunk: KPW per warp in the score pass
  kernels::cuda::pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float s_red[2][G][kWarps];
  const int hd = a.hd, nd = hd / 8;
  const Smem lay(a.window + a.K, hd);
  uint64_t* s_keys = reinterpret_cast<uint64_t*>(smem_raw);
  float* s_p = reinterpret_cast<float*>(smem_raw + lay.p_off());
  float* s_q = reinterpret_cast<float*>(smem_raw + lay.q_off(G));
  float* s_k = reinterpret_cast<float*>(smem_raw + lay.k_off(G));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t r = blockIdx.x;  // b*K + t
  const int h0 = blockIdx.y * G;
  const int64_t b = r / a.K;
  const int64_t P = a.req_pos[b];
  const uint8_t* ring = a.ctx + static_cast<int64_t>(a.req_slot[b]) * a.slot_stride + a.stage_off;
  const int64_t c0 = P - a.window > 0 ? P - a.window : 0;
  const int nctx = static_cast<int>(P - c0), nk = nctx + a.K;
  for (int i = tid; i < nctx; i += kThreads)
    s_keys[i] = reinterpret_cast<uint64_t>(ring + ((c0 + i) % ring_rows(a)) * a.rec.bytes);
  for (int i = tid; i < a.K; i += kThreads)
    s_keys[nctx + i] = reinterpret_cast<uint64_t>(a.block_kv + (b * a.K + i) * hd) | 1;
  for (int i = tid; i < G * hd; i += kThreads) {
    const int h = i / hd;
    s_q[i] = h0 + h < a.heads ? a.q[(r * a.heads + h0 + h) * hd + i % hd] : 0.0f;
  }
  __syncthreads();

  // Chunk [k0, k0 + kChunk): each thread's pieces loaded into registers, then decoded into rows.
  RawPiece raw[kMaxPieces], raw2[kWhole ? kMaxPieces : 1];
  auto load_into = [&](RawPiece* rp, int k0) {
    const int n = min(kChunk, nk - k0) * nd;
#pragma unroll
    for (int m = 0; m < kMaxPieces; ++m) {
      const int p = tid + m * kThreads;
      rp[m].mode = 0;
      if (p < n) rp[m] = load_piece(s_keys[k0 + p / nd], a.rec, (p % nd) * 8);
    }
  };
  auto store_from = [&](const RawPiece* rp, float* rows) {
#pragma unroll
    for (int m = 0; m < kMaxPieces; ++m) {
      if (rp[m].mode == 0) continue;
      const int p = tid + m * kThreads;
      float v[8];
      decode_piece(rp[m], v);
      float4* dst = reinterpret_cast<float4*>(rows + (p / nd) * hd + (p % nd) * 8);
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
  };
  // The chunk's rows: chunk k0's own rows (kWhole) or the one chunk's.
  auto rows_of = [&](int k0) -> const float* { return kWhole ? s_k + static_cast<int64_t>(k0) * hd : s_k; };
  if constexpr (kWhole) {
    // Every chunk's loads issued one chunk ahead of its decode, in two register sets.
    load_into(raw, 0);
    for (int k0 = 0; k0 < nk; k0 += 2 * kChunk) {
      if (k0 + kChunk < nk) load_into(raw2, k0 + kChunk);
      store_from(raw, s_k + static_cast<int64_t>(k0) * hd);
      if (k0 + 2 * kChunk < nk) load_into(raw, k0 + 2 * kChunk);
      if (k0 + kChunk < nk) store_from(raw2, s_k + static_cast<int64_t>(k0 + kChunk) * hd);
    }
    __syncthreads();
  }

  // Pass 1: scores. Warp w takes keys k0 + KPW w, ..., k0 + KPW w + KPW - 1 of each chunk for the G
  // heads: lane-strided sums over d = lane, lane + 32, ... (the reference's loop), then warp_sum's
  // butterfly (warp_sum_scatter: the same additions for any number of sums), times the scale.
  const float scale = attn_scale(hd);
  if (!kWhole) load_into(raw, 0);
  for (int k0 = 0; k0 < nk; k0 += kChunk) {
    if (!kWhole) {
      store_from(raw, s_k);
      __syncthreads();
      if (k0 + kChunk < nk) load_into(raw, k0 + kChunk);
    }
    const int i0 = k0 + KPW * warp;
    if (i0 < nk) {
      float acc[KPW * G];
#pragma unroll
      for (int j = 0; j < KPW * G; ++j) acc[j] = 0.0f;
      const float* kr = rows_of(k0) + (KPW * warp) * hd;
#pragma unroll 4
      for (int d = lane; d < hd; d += 32) {
        float x[KPW];
#pragma unroll
        for (int kk = 0; kk < KPW; ++kk) x[kk] = kr[kk * hd + d];
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float qv = s_q[h * hd + d];
#pragma unroll
          for (int kk = 0; kk < KPW; ++kk) acc[KPW * h + kk] += qv * x[kk];
        }
      }
      int idx;
      const float s = warp_sum_scatter<KPW * G>(acc, lane, idx);
      const int i = i0 + idx % KPW;
      if ((lane & (32 / (KPW * G) - 1)) == 0 && i < nk) s_p[(idx / KPW) * lay.ldp + i] = s * scale;
    }
    if (!kWhole) __syncthreads();
  }
  if (kWhole) __syncthreads();

  // Softmax per head, each as the reference's 256 threads: thread t's max and sum over keys t,
  // t + 256, ..., then block_max / block_sum's two warp stages.
  float mx[G], z[G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    mx[h] = -INFINITY;
    for (int i = tid; i < nk; i += kThreads) mx[h] = fmaxf(mx[h], s_p[h * lay.ldp + i]);
    mx[h] = warp_max(mx[h]);
    if (lane == 0) s_red[0][h][warp] = mx[h];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < G; ++h) {
    mx[h] = warp_max(lane < kWarps ? s_red[0][h][lane] : -INFINITY);
    z[h] = 0.0f;
    for (int i = tid; i < nk; i += kThreads) {
      const float e = expf(s_p[h * lay.ldp + i] - mx[h]);
      s_p[h * lay.ldp + i] = e;
      z[h] += e;
    }
    z[h] = warp_sum(z[h]);
    if (lane == 0) s_red[1][h][warp] = z[h];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < G; ++h) {
    z[h] = warp_sum(lane < kWarps ? s_red[1][h][lane] : 0.0f);
    z[h] += expf((h0 + h < a.heads ? a.sink[h0 + h] : 0.0f) - mx[h]);
  }

  // Pass 2: thread t's dims 2t, 2t + 1 for the G heads, adding weight * key over the keys in order.
  const int d0 = 2 * tid;
  float o[G][2];
#pragma unroll
  for (int h = 0; h < G; ++h) o[h][0] = o[h][1] = 0.0f;
  if (!kWhole) load_into(raw, 0);
  for (int k0 = 0; k0 < nk; k0 += kChunk) {
    if (!kWhole) {
      store_from(raw, s_k);
      __syncthreads();
      if (k0 + kChunk < nk) load_into(raw, k0 + kChunk);
    }
    const int n = min(kChunk, nk - k0);
    if (d0 < hd) {
      const float* kr = rows_of(k0) + d0;
      int i = 0;
      for (; i + 4 <= n; i += 4) {
        float4 p4[G];
#pragma unroll
        for (int h = 0; h < G; ++h) p4[h] = *reinterpret_cast<const float4*>(s_p + h * lay.ldp + k0 + i);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float2 x = *reinterpret_cast<const float2*>(kr + (i + u) * hd);
#pragma unroll
          for (int h = 0; h < G; ++h) {
            const float p = u == 0 ? p4[h].x : u == 1 ? p4[h].y : u == 2 ? p4[h].z : p4[h].w;
            o[h][0] += p * x.x;
            o[h][1] += p * x.y;
          }
        }
      }
      for (; i < n; ++i) {
        const float2 x = *reinterpret_cast<const float2*>(kr + i * hd);
#pragma unroll
        for (int h = 0; h < G; ++h) {
          const float p = s_p[h * lay.ldp + k0 + i];
          o[h][0] += p * x.x;
          o[h][1] += p * x.y;
        }
      }
    }
    if (!kWhole) __syncthreads();
  }
  if (d0 >= hd) return;
  const int r0 = hd - a.out_rope_dim;
  const int64_t pos = a.out_inv_freq ? a.out_positions[r] : 0;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h0 + h >= a.heads) break;
    float v[2] = {nk > 0 ? num::round_bf16(o[h][0] / z[h]) : 0.0f, nk > 0 ? num::round_bf16(o[h][1] / z[h]) : 0.0f};
    if (a.out_inv_freq && d0 >= r0)
      kernels::cuda::row::rope_pair(v, pos, a.out_inv_freq[(d0 - r0) / 2], true, true);
    *reinterpret_cast<float2*>(a.out + (r * a.heads + h0 + h) * hd + d0) = make_float2(v[0], v[1]);
  }
}

// Heads per block: 1 while a block per (row, head) fits on the multiprocessors at once (measured
// faster for the built-in model's draft, docs/PERFORMANCE.md "Twenty-first session"), 2 while blocks
// of two do, else 4 (fewer key decodes).
int heads_per_block(const DraftAttnArgs& a) {
  const int64_t rows = a.B * a.K, sms = kernels::cuda::decode_launch_limits().sms;
  if (rows * a.heads <= sms) return 1;
  return rows * ((a.heads + 1) / 2) <= sms ? 2 : 4;
}

void check_args(const DraftAttnArgs& a) {
  TANDEM_CHECK(a.K >= 1 && a.window >= 1 && (a.ring == 0 || a.ring >= a.window) && a.heads >= 1 && a.hd > 0 &&
               a.rec.head_dim == a.hd);
  if (a.out_inv_freq)
    TANDEM_CHECK(a.out_positions && a.out_rope_dim > 0 && a.out_rope_dim % 2 == 0 && a.out_rope_dim <= a.hd &&
                 a.hd % 64 == 0);
}

// Every key's row in shared memory (kWhole) where the device's per-block shared memory holds them
// (the built-in model's 133 keys of head dim 128: 68 KB; not the 512-dim heads of the full size).
template <int G, int KPW>
void launch(const DraftAttnArgs& a, cudaStream_t s, bool whole_list) {
  const Smem lay(a.window + a.K, a.hd);
  const auto whole_kern = draft_attention_kernel<G, KPW, true>;
  const bool whole =
      whole_list && lay.bytes(G, true) <= kernels::cuda::dynamic_smem_room(reinterpret_cast<const void*>(whole_kern));
  const size_t smem = lay.bytes(G, whole);
  auto kern = whole ? whole_kern : draft_attention_kernel<G, KPW, false>;
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(kern), smem);
  dim3 grid(static_cast<unsigned>(a.B * a.K), static_cast<unsigned>((a.heads + G - 1) / G));
  kernels::cuda::launch_pdl(kern, grid, kThreads, smem, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

template <int G>
void launch_g(const DraftAttnArgs& a, cudaStream_t s, bool whole_list) {
  switch (keys_per_warp(a.hd)) {
    case 8: return launch<G, 8>(a, s, whole_list);
    case 4: return launch<G, 4>(a, s, whole_list);
    default: return launch<G, 2>(a, s, whole_list);
  }
}

}  // namespace

void draft_attention(const DraftAttnArgs& a, cudaStream_t s, bool whole_list) {
  if (a.B == 0) return;
  check_args(a);
  // The decoder's pieces: 8 dims in one scale group and one side of the NoPE/RoPE split; records
  // 8-byte aligned, fp32 rows 16-byte aligned.
  TANDEM_CHECK(a.hd % 64 == 0 && a.hd <= kMaxHd && a.rec.nope % 16 == 0);
  TANDEM_CHECK(reinterpret_cast<uintptr_t>(a.ctx) % 8 == 0 && a.slot_stride % 8 == 0 && a.stage_off % 8 == 0 &&
               a.rec.bytes % 8 == 0 && a.rec.rope_off % 8 == 0 && reinterpret_cast<uintptr_t>(a.block_kv) % 16 == 0);
  switch (heads_per_block(a)) {
    case 1: return launch_g<1>(a, s, whole_list);
    case 2: return launch_g<2>(a, s, whole_list);
    default: return launch_g<4>(a, s, whole_list);
  }
}

void draft_attention_reference(const DraftAttnArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  check_args(a);
  TANDEM_CHECK(a.window + a.K <= kRefMaxKeys && a.hd <= kRefMaxHd);
  dim3 grid(static_cast<unsigned>(a.B * a.K), static_cast<unsigned>(a.heads));
  draft_attention_ref_kernel<<<grid, kThreads, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void draft_kv_decode_rows(const uint8_t* recs, int64_t n, const KvRecordLayout& l, float* out, cudaStream_t s) {
  if (n == 0) return;
  TANDEM_CHECK(l.head_dim % 64 == 0 && l.nope % 16 == 0 && l.bytes % 8 == 0 && l.rope_off % 8 == 0 &&
               reinterpret_cast<uintptr_t>(recs) % 8 == 0);
  decode_rows_kernel<<<kernels::cuda::grid_for(n * (l.head_dim / 8), 256), 256, 0, s>>>(recs, n, l, out);
  TANDEM_CUDA_LAUNCH_CHECK();
}

kernels::cuda::SmemBound draft_attention_smem_bound(int window, int block, int hd) {
  return {"draft_attention_kernel", static_cast<int64_t>(Smem(window + block, hd).bytes(4)),
          "window " + std::to_string(window) + " + " + std::to_string(block) + " block rows, 4 heads, " +
              std::to_string(Smem(window + block, hd).chunk()) + " decoded keys of head dim " + std::to_string(hd),
          ""};
}

}  // namespace tandem::cuda_model
