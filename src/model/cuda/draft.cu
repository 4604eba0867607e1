// DSpark kernels (draft.h).
#include "model/cuda/draft.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sampling_device.cuh"
#include "kernels/sampling.h"
#include "model/cuda/model_device.cuh"

namespace tandem::cuda_model {

using kernels::cuda::add_rn;
using kernels::cuda::ceil_div;
using kernels::cuda::mul_rn;

namespace {

__global__ void taps_kernel(TapsMeanArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t t = blockIdx.x;
  if (t >= a.rows || a.dst_row[t] < 0) return;
  for (int64_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < a.hc; ++k) acc += a.h[(t * a.hc + k) * a.dim + d];
    a.taps[static_cast<int64_t>(a.dst_row[t]) * a.td + a.col_off + d] = num::round_bf16(acc / static_cast<float>(a.hc));
  }
}

__global__ void block_positions_kernel(BlockPositionsArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.count) a.positions[i] = a.base[i / a.per] + i % a.per;
}

__global__ void iota_positions_kernel(IotaPositionsArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.count) a.positions[i] = a.start + i;
}

__global__ void draft_ids_kernel(DraftBlockIdsArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.B * a.K) a.ids[i] = (i % a.K == 0) ? a.anchor[i / a.K] : a.noise;
}

__global__ void markov_gather_kernel(MarkovGatherArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t b = blockIdx.x;
  if (b >= a.B) return;
  for (int64_t d = threadIdx.x; d < a.rank; d += blockDim.x) a.e[b * a.rank + d] = w_at(a.w1, a.prev[b], d);
}

// The Markov step over (chunk, request) CTAs of kThreads (markov_step in draft.h). A request's
// per-call scratch record (Rec, at its stride in MarkovStepArgs::scratch): each chunk's argmax key
// and, for a sampled request, the chunk's largest z / T and its mass sum relative to that value;
// the finishing CTA's mx and total for the probs launch; the arrival counter.
constexpr int kThreads = 256;
constexpr int kPerThread = static_cast<int>(kMarkovChunk / kThreads);
constexpr int kMaxChunks = 256;  // vocabularies up to 1,048,576 ids
constexpr int kConfMax = 8192;  // dim + rank of the confidence (its products in shared memory)

struct Rec {
  uint64_t* key;   // [C]
  double* cmax;    // [C] z_max / T of the chunk (sampled requests)
  double* csum;    // [C] sum of exp(z / T - cmax) over the chunk, positive masses only
  double* stat;    // [2] mx, total (the finishing CTA's, read by markov_probs_kernel)
  int64_t* amax;   // [1] argmax
  int32_t* cnt;    // [1] arrivals of this call, zero between calls
};
__host__ __device__ inline int64_t chunks_of(int64_t V) { return (V + kMarkovChunk - 1) / kMarkovChunk; }
__host__ __device__ inline int64_t rec_stride(int64_t V) { return (chunks_of(V) * 24 + 32 + 15) / 16 * 16; }
__device__ inline Rec rec_of(uint8_t* scratch, int64_t V, int64_t b) {
  const int64_t C = chunks_of(V);
  uint8_t* p = scratch + b * rec_stride(V);
  Rec r;
  r.key = reinterpret_cast<uint64_t*>(p);
  r.cmax = reinterpret_cast<double*>(p + 8 * C);
  r.csum = reinterpret_cast<double*>(p + 16 * C);
  r.stat = reinterpret_cast<double*>(p + 24 * C);
  r.amax = reinterpret_cast<int64_t*>(p + 24 * C + 16);
  r.cnt = reinterpret_cast<int32_t*>(p + 24 * C + 24);
  return r;
}

// Grid (chunks, B). Every CTA: z = base + bias over its ids, their argmax key (the first maximum,
// NaN first, as torch.argmax), and for a sampled request the chunk's mass sum relative to its own
// largest z / T (so no CTA waits for the row's maximum). The last CTA of the request: the row's
// argmax from the keys; greedy: the token; sampled: mx = z[argmax] / T (the one-block kernel's),
// the chunk weights csum * exp(cmax - mx) added in chunk order (total), the chunk holding the
// target u * total, then the inverse-CDF walk inside it with the masses exp(z / T - mx) in id order
// (a target past that chunk's recomputed mass, by rounding, takes its last positive id); no
// chunk (a zero or NaN total) gives V - 1, as the one-block kernel did.
__global__ void __launch_bounds__(kThreads) markov_step_kernel(MarkovStepArgs a) {
  kernels::cuda::pdl_enter();
  __shared__ float s_conf[8];
  __shared__ kernels::cuda::BlockReduceScratch s_scr;
  __shared__ int s_last;
  const int64_t c = blockIdx.x, b = blockIdx.y, C = gridDim.x;
  const int64_t row = b * a.K + a.i;
  const float* base = a.base + row * a.V;
  const float* bias = a.bias + b * a.V;
  float* z = a.logits + row * a.V;
  const double T = a.temperature ? a.temperature[b] : 0.0;
  const bool sampled = !is_greedy(T);
  const Rec r = rec_of(a.scratch, a.V, b);
  const int64_t v0 = c * kMarkovChunk, n = a.V - v0 < kMarkovChunk ? a.V - v0 : kMarkovChunk;

  float zl[kPerThread];
  unsigned long long best = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    zl[j] = 0.0f;
    if (v < n) {
      zl[j] = base[v0 + v] + bias[v0 + v];
      z[v0 + v] = zl[j];
      const unsigned long long k = kernels::cuda::select_key(zl[j], static_cast<uint32_t>(v0 + v));
      best = k > best ? k : best;
    }
  }
  // confidence: dot([y, e], conf_w) in model::dot's order (the CPU draft's): lane j of 8 sums the
  // elements i = j mod 8 in order, products and sums rounded one at a time, then pairwise. Eight
  // serial chains of (dim + rank) / 8 adds: the last chunk's CTA (the one with the fewest ids)
  // runs them beside the other chunks, not the finishing CTA after them.
  // The products are formed by the whole CTA into shared memory, eight loads in flight per thread
  // (the eight chains reading global memory one element at a time took 70 us at dim + rank =
  // 4,352), then the chains add them.
  const bool conf_cta = c == C - 1;
  if (conf_cta) {
    __shared__ float s_prod[kConfMax];
    const int nd = static_cast<int>(a.dim + a.rank);  // <= kConfMax (markov_step checks)
    constexpr int kU = 8;
    for (int d0 = threadIdx.x; d0 < nd; d0 += kU * kThreads) {
      float f[kU], w[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int g = d0 + u * kThreads;
        f[u] = g < nd ? (g < a.dim ? a.y[row * a.dim + g] : a.e[b * a.rank + (g - a.dim)]) : 0.0f;
        w[u] = g < nd ? a.conf_w[g] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int g = d0 + u * kThreads;
        if (g < nd) s_prod[g] = mul_rn(f[u], w[u]);
      }
    }
    __syncthreads();
    if (threadIdx.x < 8) {
      float acc = 0.0f;
#pragma unroll 8
      for (int d = threadIdx.x; d < nd; d += 8) acc = add_rn(acc, s_prod[d]);
      s_conf[threadIdx.x] = acc;
    }
  }
  const uint64_t key = kernels::cuda::block_argmax_key(best, s_scr);  // its __syncthreads: s_conf
  if (conf_cta && threadIdx.x == 0) {
    const float* rc = s_conf;
    a.conf[b * a.K + a.i] =
        add_rn(add_rn(add_rn(rc[0], rc[1]), add_rn(rc[2], rc[3])), add_rn(add_rn(rc[4], rc[5]), add_rn(rc[6], rc[7])));
  }
  if (sampled) {
    const int64_t am = kernels::cuda::select_key_index(key) - v0;
    const double cm = static_cast<double>(base[v0 + am] + bias[v0 + am]) / T;
    double part = 0.0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      if (v < n) {
        const double m = exp(static_cast<double>(zl[j]) / T - cm);
        if (m > 0) part += m;
      }
    }
    const double sum = kernels::cuda::block_sum_f64(part, s_scr);
    if (threadIdx.x == 0) {
      r.cmax[c] = cm;
      r.csum[c] = sum;
    }
  }
  if (threadIdx.x == 0) r.key[c] = key;
  // Arrival: this CTA's record stores before its ticket; the last CTA reads every record from L2.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(r.cnt, 1) == static_cast<int>(C) - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  unsigned long long kb = 0;
  for (int64_t q = threadIdx.x; q < C; q += kThreads) {
    const unsigned long long k = __ldcg(reinterpret_cast<const unsigned long long*>(r.key) + q);
    kb = k > kb ? k : kb;
  }
  const int64_t argmax = kernels::cuda::select_key_index(kernels::cuda::block_argmax_key(kb, s_scr));
  int64_t token = argmax;
  if (sampled) {
    __shared__ double s_wt[kMaxChunks];  // the chunks' weights
    __shared__ double s_w[2];            // the found chunk's mass before it, and the target
    __shared__ int64_t s_chunk;
    const double mx = static_cast<double>(base[argmax] + bias[argmax]) / T;
    for (int64_t q = threadIdx.x; q < C; q += kThreads) s_wt[q] = __ldcg(r.csum + q) * exp(__ldcg(r.cmax + q) - mx);
    __syncthreads();
    if (threadIdx.x == 0) {
      // Chunk weights in chunk order: the total, then the chunk holding the target.
      double total = 0.0;
      for (int64_t q = 0; q < C; ++q) total += s_wt[q];
      const double target = rng_uniform(a.seed[b], a.pos[b] + 1 + a.i, RngStream::kDraft) * total;
      int64_t found = -1;
      double before = 0.0;
      for (int64_t q = 0; q < C; ++q) {
        const double w = s_wt[q];
        if (w > 0 && target < before + w) {
          found = q;
          break;
        }
        if (w > 0) before += w;
      }
      s_chunk = found;
      s_w[0] = before;
      s_w[1] = target;
      r.stat[0] = mx;
      r.stat[1] = total;
    }
    __syncthreads();
    const int64_t q = s_chunk;
    if (q < 0) {
      token = a.V - 1;
    } else {
      const int64_t w0 = q * kMarkovChunk, wn = a.V - w0 < kMarkovChunk ? a.V - w0 : kMarkovChunk;
      auto mass = [&](int64_t v) { return exp(static_cast<double>(base[w0 + v] + bias[w0 + v]) / T - mx); };
      const kernels::cuda::ChunkScan cs = kernels::cuda::block_chunk_scan(wn, mass, s_scr);
      const int64_t t = kernels::cuda::block_chunk_find(cs, mass, s_w[1] - s_w[0], s_scr);
      token = w0 + (t >= 0 ? t : cs.last_positive);
    }
  }
  if (threadIdx.x == 0) {
    a.tokens[b * a.K + a.i] = static_cast<int32_t>(token);
    a.prev[b] = static_cast<int32_t>(token);
    *r.amax = argmax;
    *r.cnt = 0;
  }
  // The next position's e (markov_gather's row of the token just drawn): every CTA of this call has
  // read e (the confidence's) before it arrived.
  if (a.e_next && a.i + 1 < a.K)
    for (int64_t k = threadIdx.x; k < a.rank; k += kThreads) a.e_next[b * a.rank + k] = w_at(a.w1, token, k);
}

// q = softmax(z / T) (mass(v) / total with the finishing CTA's mx and total), or one-hot at the
// argmax for a greedy request. Grid (chunks, B).
__global__ void __launch_bounds__(kThreads) markov_probs_kernel(MarkovStepArgs a) {
  kernels::cuda::pdl_enter();
  const int64_t c = blockIdx.x, b = blockIdx.y;
  const int64_t row = b * a.K + a.i;
  const double T = a.temperature ? a.temperature[b] : 0.0;
  const Rec r = rec_of(a.scratch, a.V, b);
  const float* z = a.logits + row * a.V;
  float* q = a.probs + row * a.V;
  const int64_t v0 = c * kMarkovChunk, v1 = a.V - v0 < kMarkovChunk ? a.V : v0 + kMarkovChunk;
  if (!is_greedy(T)) {
    const double mx = r.stat[0], total = r.stat[1];
    for (int64_t v = v0 + threadIdx.x; v < v1; v += kThreads)
      q[v] = static_cast<float>(exp(static_cast<double>(z[v]) / T - mx) / total);
  } else {
    const int64_t am = *r.amax;
    for (int64_t v = v0 + threadIdx.x; v < v1; v += kThreads) q[v] = v == am ? 1.0f : 0.0f;
  }
}

}  // namespace

void taps_mean(const TapsMeanArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  kernels::cuda::launch_pdl(taps_kernel, static_cast<unsigned>(a.rows), 256, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void block_positions(const BlockPositionsArgs& a, cudaStream_t s) {
  if (a.count == 0) return;
  kernels::cuda::launch_pdl(block_positions_kernel, ceil_div(a.count, 256), 256, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void iota_positions(const IotaPositionsArgs& a, cudaStream_t s) {
  if (a.count == 0) return;
  kernels::cuda::launch_pdl(iota_positions_kernel, ceil_div(a.count, 256), 256, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void draft_block_ids(const DraftBlockIdsArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  kernels::cuda::launch_pdl(draft_ids_kernel, ceil_div(a.B * a.K, 256), 256, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void markov_gather(const MarkovGatherArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  kernels::cuda::launch_pdl(markov_gather_kernel, static_cast<unsigned>(a.B), 128, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

size_t markov_scratch_bytes(int64_t B, int64_t V) {
  return static_cast<size_t>(std::max<int64_t>(B, 1) * rec_stride(V));
}

void markov_step(const MarkovStepArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  TANDEM_CHECK_MSG(a.scratch != nullptr, "markov_step: no scratch");
  TANDEM_CHECK_MSG(a.B <= 65535, "markov_step: more requests than a grid dimension holds");
  TANDEM_CHECK_MSG(chunks_of(a.V) <= kMaxChunks, "markov_step: vocabulary larger than the chunk table");
  TANDEM_CHECK_MSG(a.dim + a.rank <= kConfMax, "markov_step: dim + rank larger than the confidence buffer");
  const dim3 grid(static_cast<unsigned>(chunks_of(a.V)), static_cast<unsigned>(a.B));
  kernels::cuda::launch_pdl(markov_step_kernel, grid, kThreads, 0, s, a);
  TANDEM_CUDA_LAUNCH_CHECK();
  if (a.probs) {
    kernels::cuda::launch_pdl(markov_probs_kernel, grid, kThreads, 0, s, a);
    TANDEM_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace tandem::cuda_model
