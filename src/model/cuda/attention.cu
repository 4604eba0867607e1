// The target's MQA attention (attention.h): flash decoding on the tensor cores over 64-key chunks,
// every KV record decoded once per 16 heads. A chunk's keys are decoded from their records into a
// bf16 tile in shared memory (records: e4m3 x E8M0, e2m1 x e4m3 and bf16 are exact in bf16), then
// S = Q K^T (m16n8k16 bf16 mma, 16 heads x 8 keys per warp), the chunk's max and fp32 softmax
// numerators, p split exactly into three bf16 planes, and O_c = P V (8 warps x hd/8 dims, three mma
// per fragment, key order). The chunks are folded in list order, either in registers by a block
// that walks its row's chunks (prefill, large batches) or, split over the chunks, by fold_kernel
// from each chunk's (m_c, z_c, O_c) in `partial`: the same operations on the same values, so both
// give the same bits.
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
#include "model/cuda/attention_device.cuh"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {
namespace {

using namespace attn;  // NOLINT: the shared device pieces (attention_device.cuh)

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kFoldGroup = 128;           // chunks per pass of fold_kernel's shared arrays
static_assert(kChunk == 8 * kWarps, "one 8-key n-tile per warp");
static_assert(kHeads == 16, "one m16 tile of heads");

// Shared memory of one block (byte offsets, every one a multiple of 16).
template <int D>
struct Layout {
  static constexpr int kPitch = 2 * D + 16;                     // bytes per bf16 row of K/V and Q
  static constexpr int kK = 0;                                  // [kChunk][kPitch] keys (= values)
  static constexpr int kQ = kK + kChunk * kPitch;               // [kHeads][kPitch] queries
  static constexpr int kP = kQ + kHeads * kPitch;               // [kPTerms][kHeads][kPPitch] p planes
  static constexpr int kPtr = kP + kPTerms * kHeads * kPPitch;  // [kChunk] tagged key pointers
  static constexpr int kMax = kPtr + kChunk * 8;                // [kWarps][kHeads] warp maxima
  static constexpr int kSum = kMax + kWarps * kHeads * 4;       // [kWarps][kHeads] warp sums
  static constexpr int kRow = kSum + kWarps * kHeads * 4;       // the row's RowKeys
  static constexpr int kBytes = kRow + 64;
};

// The block's 16 query heads [h0, h0 + 16) of row t as bf16 rows (zeros past the last head): every
// load of the thread issued before the first store (stores to shared memory would otherwise keep
// the compiler from hoisting the next piece's loads: one memory latency per piece).
template <int D>
__device__ __forceinline__ void load_q(const AttnArgs& a, int64_t t, int h0, uint8_t* sQ) {
  constexpr int kPieces = D / 8, kPer = kHeads * kPieces / kThreads;
  static_assert(kHeads * kPieces % kThreads == 0, "whole pieces per thread");
  float4 v[kPer][2];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = j * kThreads + threadIdx.x, hl = i / kPieces, piece = i % kPieces;
    v[j][0] = v[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h0 + hl < a.heads) {
      const float4* f = reinterpret_cast<const float4*>(a.q + (t * a.heads + h0 + hl) * D) + 2 * piece;
      v[j][0] = __ldg(f);
      v[j][1] = __ldg(f + 1);
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = j * kThreads + threadIdx.x, hl = i / kPieces, piece = i % kPieces;
    const float4 x = v[j][0], y = v[j][1];
    *reinterpret_cast<uint4*>(sQ + hl * Layout<D>::kPitch + piece * 16) =
        make_uint4(bf16x2(x.x, x.y), bf16x2(x.z, x.w), bf16x2(y.x, y.y), bf16x2(y.z, y.w));
  }
}

// Chunk c of the row (rk: the row's key list, in shared memory). The chunk's max and sum for heads
// g and g + 8 (g = lane / 4) of this thread, then O_c in parts: consume(part, oc, mc, zc) gets the
// thread's mma fragments of dims [dim0 + part * D/8/kParts, +D/8/kParts) (dim0 = warp * D/8):
// oc[n][0..1] = head g, oc[n][2..3] = head g + 8, at dims + 8n + 2 (lane % 4) + {0, 1}. Parts keep
// the fragments of a fold and of the next part's products from being live at once. Begins with
// __syncthreads().
template <int D, int kMaxBatch, typename Consume>
__device__ __forceinline__ void attend_chunk(const AttnArgs& a, const RowKeys& rk, int c, uint8_t* smem, float scale,
                                             Consume&& consume) {
  using L = Layout<D>;
  constexpr int kPieces = D / 8;
  constexpr int kIters = kChunk * kPieces / kThreads;
  constexpr int kBatch = kIters < kMaxBatch ? kIters : kMaxBatch;  // loads in flight per thread
  constexpr int NTP = Parts<D>::NTP;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  uint8_t* sK = smem + L::kK;
  uint8_t* sP = smem + L::kP;
  uint64_t* sptr = reinterpret_cast<uint64_t*>(smem + L::kPtr);
  float* smax = reinterpret_cast<float*>(smem + L::kMax);
  float* ssum = reinterpret_cast<float*>(smem + L::kSum);

  __syncthreads();  // the previous chunk's readers of every shared array are done
  if (tid < kChunk) sptr[tid] = key_ptr(a, rk, c * kChunk + tid);
  __syncthreads();
  // 1. the chunk's keys as bf16 rows (masked keys as zeros: 0 * 0 in P V)
#pragma unroll 1
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    RawPiece raw[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (i0 + b) * kThreads + tid;
      raw[b] = load_piece(sptr[i / kPieces], a.rec, i % kPieces);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = (i0 + b) * kThreads + tid;
      *reinterpret_cast<uint4*>(sK + (i / kPieces) * L::kPitch + (i % kPieces) * 16) = piece_bf16(raw[b]);
    }
  }
  __syncthreads();

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

// grid: split (chunks, head tiles, rows) -> partials; else (rows, head tiles), folding in registers.
template <int D, bool kSplit>
__global__ void __launch_bounds__(kThreads, 2) mqa_kernel(AttnArgs a, int nchunks, float scale) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int NTP = Parts<D>::NTP, kParts = Parts<D>::kParts;
  kernels::cuda::pdl_wait();
  const int64_t t = kSplit ? blockIdx.z : blockIdx.x;
  const int h0 = static_cast<int>(blockIdx.y) * kHeads;
  if (t >= a.rows) return;
  RowKeys& rk = *reinterpret_cast<RowKeys*>(smem + Layout<D>::kRow);
  const int nk = row_keys(a, t).nk;  // every thread: the block's chunk count without a barrier
  int nch = (nk + kChunk - 1) / kChunk;
  nch = nch < nchunks ? nch : nchunks;
  const int c0 = kSplit ? static_cast<int>(blockIdx.x) : 0;
  if (c0 >= nch) return;
  if (threadIdx.x == 0) rk = row_keys(a, t);  // read after attend_chunk's first barrier
  load_q<D>(a, t, h0, smem + Layout<D>::kQ);

  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int dim0 = (threadIdx.x >> 5) * (D / 8) + 2 * tq;
  if (kSplit) {
    const int64_t slot = t * nchunks + c0;
    float* po = a.partial + slot * a.heads * D;
    float* pml = a.partial + a.partial_slots * a.heads * D + slot * a.heads * 2;
    attend_chunk<D, 4>(a, rk, c0, smem, scale, [&](int part, float (&oc)[NTP][4], const float (&mc)[2], const float (&zc)[2]) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int h = h0 + g + 8 * i;
        if (h >= a.heads) continue;
#pragma unroll
        for (int n = 0; n < NTP; ++n)
          *reinterpret_cast<float2*>(po + h * D + dim0 + 8 * (part * NTP + n)) = make_float2(oc[n][2 * i], oc[n][2 * i + 1]);
        if (part == 0 && threadIdx.x < 32 && tq == 0) {
          pml[h * 2] = mc[i];
          pml[h * 2 + 1] = zc[i];
        }
      }
    });
    kernels::cuda::pdl_trigger();
    return;
  }
  float orun[kParts * NTP][4], mrun[2] = {-INFINITY, -INFINITY}, zrun[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < kParts * NTP; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) orun[n][i] = 0.0f;
#pragma unroll 1
  for (int c = 0; c < nch; ++c) {
    float al[2], be[2];
    attend_chunk<D, 4>(a, rk, c, smem, scale, [&](int part, float (&oc)[NTP][4], const float (&mc)[2], const float (&zc)[2]) {
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
template <int D>
__global__ void __launch_bounds__(512) fold_kernel(AttnArgs a, int nchunks) {
  __shared__ float s_m[kFoldGroup], s_z[kFoldGroup], s_alpha[kFoldGroup], s_beta[kFoldGroup];
  __shared__ float s_mrun, s_zrun;
  kernels::cuda::pdl_wait();
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, H = a.heads, tid = threadIdx.x, lane = tid & 31;
  if (t >= a.rows) return;
  const RowKeys rk = row_keys(a, t);
  int nch = (rk.nk + kChunk - 1) / kChunk;
  nch = nch < nchunks ? nch : nchunks;
  const int64_t slot0 = t * nchunks;
  const float* __restrict__ po = a.partial + slot0 * H * D + static_cast<int64_t>(h) * D + tid;
  const float* __restrict__ pml = a.partial + a.partial_slots * H * D + slot0 * H * 2 + h * 2;
  const int64_t ostride = static_cast<int64_t>(H) * D;
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
#pragma unroll 16
    for (int i = 0; i < ng; ++i) o = fold(o, po[(c0 + i) * ostride], s_alpha[i], s_beta[i]);
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
  if (!split && a.rows_kernel && attn::launch_rows_kernel(a, s, scale)) return;
  switch (a.hd) {
    case 128: launch<128>(a, s, nchunks, tiles, scale, split); break;
    case 256: launch<256>(a, s, nchunks, tiles, scale, split); break;
    default: launch<512>(a, s, nchunks, tiles, scale, split); break;
  }
}

std::vector<kernels::cuda::SmemBound> attention_smem_bounds() {
  // One 64-key chunk, the 16 heads' queries, p planes and the row's key pointers: fixed by the head
  // dim, whatever the context (longer contexts walk more chunks, split over blocks or folded in one).
  return {{"mqa_kernel", Layout<512>::kBytes, "head dim 512 (the largest supported), any context length",
           "one chunk of " + std::to_string(kChunk) + " keys in shared memory: independent of the context"},
          {"rows_kernel", static_cast<int64_t>(attn::rows_kernel_smem(512)), "head dim 512, 32 heads per block",
           "two key tiles and two rows' queries; launched only where a block may have that much (else the "
           "folding blocks of mqa_kernel run, with the same bits)",
           static_cast<int64_t>(attn::rows_kernel_smem(512))}};
}

}  // namespace tandem::cuda_model
