// DSpark kernels (draft.h).
#include "model/cuda/draft.h"

#include <cuda_runtime.h>

#include "kernels/cuda/device.cuh"
#include "kernels/cuda/sampling_device.cuh"
#include "kernels/sampling.h"
#include "model/cuda/model_device.cuh"

namespace tandem::cuda_model {

using kernels::cuda::add_rn;
using kernels::cuda::ceil_div;
using kernels::cuda::mul_rn;

namespace {

__global__ void taps_kernel(TapsMeanArgs a) {
  const int64_t t = blockIdx.x;
  if (t >= a.rows || a.dst_row[t] < 0) return;
  for (int64_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < a.hc; ++k) acc += a.h[(t * a.hc + k) * a.dim + d];
    a.taps[static_cast<int64_t>(a.dst_row[t]) * a.td + a.col_off + d] = num::round_bf16(acc / static_cast<float>(a.hc));
  }
}

__global__ void block_positions_kernel(BlockPositionsArgs a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.count) a.positions[i] = a.base[i / a.per] + i % a.per;
}

__global__ void iota_positions_kernel(IotaPositionsArgs a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.count) a.positions[i] = a.start + i;
}

__global__ void draft_ids_kernel(DraftBlockIdsArgs a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.B * a.K) a.ids[i] = (i % a.K == 0) ? a.anchor[i / a.K] : a.noise;
}

__global__ void markov_gather_kernel(MarkovGatherArgs a) {
  const int64_t b = blockIdx.x;
  if (b >= a.B) return;
  for (int64_t d = threadIdx.x; d < a.rank; d += blockDim.x) a.e[b * a.rank + d] = w_at(a.w1, a.prev[b], d);
}

// One block per request. The greedy token is the first maximum (NaN first, as torch.argmax); a
// sampled token is an inverse-CDF draw over softmax(z / T) in id order with the uniform
// rng_uniform(seed, position of the drafted token, kDraft), the key the CPU draft uses.
__global__ void markov_step_kernel(MarkovStepArgs a) {
  __shared__ float s_conf[8];
  __shared__ kernels::cuda::BlockReduceScratch s_scr;
  const int64_t b = blockIdx.x;
  if (b >= a.B) return;
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
  // confidence: dot([y, e], conf_w) in model::dot's order (the CPU draft's): lane j of 8 sums the
  // elements i = j mod 8 in order, products and sums rounded one at a time, then pairwise.
  if (threadIdx.x < 8) {
    float acc = 0.0f;
    for (int64_t d = threadIdx.x; d < a.dim + a.rank; d += 8) {
      const float f = d < a.dim ? a.y[row * a.dim + d] : a.e[b * a.rank + (d - a.dim)];
      acc = add_rn(acc, mul_rn(f, a.conf_w[d]));
    }
    s_conf[threadIdx.x] = acc;
  }
  __syncthreads();
  const int argmax = static_cast<int>(kernels::cuda::select_key_index(kernels::cuda::block_argmax_key(best, s_scr)));
  const double T = a.temperature ? a.temperature[b] : 0.0;
  int token = argmax;
  if (!is_greedy(T)) {
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
    const float* r = s_conf;
    a.tokens[b * a.K + a.i] = token;
    a.prev[b] = token;
    a.conf[b * a.K + a.i] = add_rn(add_rn(add_rn(r[0], r[1]), add_rn(r[2], r[3])), add_rn(add_rn(r[4], r[5]), add_rn(r[6], r[7])));
  }
}

}  // namespace

void taps_mean(const TapsMeanArgs& a, cudaStream_t s) {
  if (a.rows == 0) return;
  taps_kernel<<<static_cast<unsigned>(a.rows), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void block_positions(const BlockPositionsArgs& a, cudaStream_t s) {
  if (a.count == 0) return;
  block_positions_kernel<<<ceil_div(a.count, 256), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void iota_positions(const IotaPositionsArgs& a, cudaStream_t s) {
  if (a.count == 0) return;
  iota_positions_kernel<<<ceil_div(a.count, 256), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void draft_block_ids(const DraftBlockIdsArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  draft_ids_kernel<<<ceil_div(a.B * a.K, 256), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void markov_gather(const MarkovGatherArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  markov_gather_kernel<<<static_cast<unsigned>(a.B), 128, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void markov_step(const MarkovStepArgs& a, cudaStream_t s) {
  if (a.B == 0) return;
  markov_step_kernel<<<static_cast<unsigned>(a.B), 512, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

}  // namespace tandem::cuda_model
