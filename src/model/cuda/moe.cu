// Routed-expert kernels (moe.h). Up/down: one block per pair (grid.x, which allows more than
// 65535 pairs), 8 warps, each warp a weight row at a time with the pair's input in shared memory;
// a pair routed to another rank's expert writes its zero rows and returns before any barrier.
#include "model/cuda/moe.h"

#include <cuda_runtime.h>

#include "common/check.h"
#include "kernels/cuda/device.cuh"
#include "model/cuda/model_device.cuh"
#include "model/cuda/smem_bounds.h"

namespace tandem::cuda_model {

using kernels::cuda::ceil_div;

namespace {

__device__ __forceinline__ bool held(int64_t e, int begin, int count) {
  return count < 0 || (e >= begin && e < static_cast<int64_t>(begin) + count);
}

// Block: one pair, 8 warps; each warp computes output columns n = warp, warp + 8, ...
__global__ void moe_up_kernel(MoePairsUpArgs a) {
  extern __shared__ float sx[];
  const int64_t i = blockIdx.x;  // pairs can exceed gridDim.y's 65535
  if (i >= a.pairs) return;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * nw * 4;
  const int64_t ge = a.expert_ids[i];
  if (!held(ge, a.expert_begin, a.expert_count)) {  // another rank's expert: the whole block returns
    for (int64_t n = n0 + threadIdx.x; n < n0 + nw * 4 && n < a.inter; n += blockDim.x) a.gact[i * a.inter + n] = 0.0f;
    return;
  }
  const int64_t t = i / a.topk;
  for (int64_t k = threadIdx.x; k < a.dim; k += blockDim.x) sx[k] = a.xq[t * a.dim + k];
  __syncthreads();
  const int64_t e = a.expert_count < 0 ? ge : ge - a.expert_begin;
  for (int64_t n = n0 + warp; n < n0 + nw * 4 && n < a.inter; n += nw) {
    const float g = warp_row_dot(a.w1_all, e * a.inter + n, sx, a.dim);
    const float u = warp_row_dot(a.w3_all, e * a.inter + n, sx, a.dim);
    if ((threadIdx.x & 31) == 0) {
      // bf16 outputs of the two linears (round_out), then the clamped SwiGLU times the route weight.
      float gg = num::round_bf16(g), uu = num::round_bf16(u);
      if (a.limit > 0.0f) {
        uu = fminf(fmaxf(uu, -a.limit), a.limit);
        gg = fminf(gg, a.limit);
      }
      const float silu = gg / (1.0f + expf(-gg));
      a.gact[i * a.inter + n] = num::round_bf16(silu * uu * a.weights[i]);
    }
  }
}

__global__ void moe_down_kernel(MoePairsDownArgs a) {
  extern __shared__ float sx[];
  const int64_t i = blockIdx.x;
  if (i >= a.pairs) return;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * nw * 4;
  const int64_t ge = a.expert_ids[i];
  if (!held(ge, a.expert_begin, a.expert_count)) {  // another rank's expert: the whole block returns
    for (int64_t n = n0 + threadIdx.x; n < n0 + nw * 4 && n < a.dim; n += blockDim.x) a.out[i * a.dim + n] = 0.0f;
    return;
  }
  for (int64_t k = threadIdx.x; k < a.inter; k += blockDim.x) sx[k] = a.gq[i * a.inter + k];
  __syncthreads();
  const int64_t e = a.expert_count < 0 ? ge : ge - a.expert_begin;
  for (int64_t n = n0 + warp; n < n0 + nw * 4 && n < a.dim; n += nw) {
    const float y = warp_row_dot(a.w2_all, e * a.dim + n, sx, a.inter);
    if ((threadIdx.x & 31) == 0) a.out[i * a.dim + n] = num::round_bf16(y);
  }
}

__global__ void moe_combine_kernel(MoeCombineArgs a) {
  const int64_t t = blockIdx.x;
  if (t >= a.tokens) return;
  const int topk = a.topk;
  const int32_t* eids = a.expert_ids;
  int order[16];
  for (int k = 0; k < topk; ++k) order[k] = k;
  // ascending expert id (insertion sort; ids are distinct within a token)
  for (int i = 1; i < topk; ++i) {
    const int v = order[i];
    int b = i - 1;
    while (b >= 0 && eids[t * topk + order[b]] > eids[t * topk + v]) {
      order[b + 1] = order[b];
      --b;
    }
    order[b + 1] = v;
  }
  for (int64_t d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < topk; ++k)
      if (held(eids[t * topk + order[k]], a.expert_begin, a.expert_count))
        acc += a.pair_out[(t * topk + order[k]) * a.dim + d];
    a.y[t * a.dim + d] = a.shared ? num::round_bf16(acc + a.shared[t * a.dim + d]) : acc;
  }
}

__global__ void moe_add_shared_kernel(MoeAddSharedArgs a) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < a.n) a.y[i] = num::round_bf16(a.y[i] + a.shared[i]);
}

// moe_up_kernel: the token's quantized input [dim]; moe_down_kernel: the pair's activation [inter].
size_t up_smem(int64_t dim) { return sizeof(float) * static_cast<size_t>(dim); }
size_t down_smem(int64_t inter) { return sizeof(float) * static_cast<size_t>(inter); }

}  // namespace

void moe_pairs_up(const MoePairsUpArgs& a, cudaStream_t s) {
  if (a.pairs == 0) return;
  const int threads = 256, per_block = (threads / 32) * 4;
  const size_t smem = up_smem(a.dim);
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(moe_up_kernel), smem);
  dim3 grid(static_cast<unsigned>(a.pairs), ceil_div(a.inter, per_block));
  moe_up_kernel<<<grid, threads, smem, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void moe_pairs_down(const MoePairsDownArgs& a, cudaStream_t s) {
  if (a.pairs == 0) return;
  const int threads = 256, per_block = (threads / 32) * 4;
  const size_t smem = down_smem(a.inter);
  kernels::cuda::allow_dynamic_smem(reinterpret_cast<const void*>(moe_down_kernel), smem);
  dim3 grid(static_cast<unsigned>(a.pairs), ceil_div(a.dim, per_block));
  moe_down_kernel<<<grid, threads, smem, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void moe_combine(const MoeCombineArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  TANDEM_CHECK(a.topk <= 16);
  moe_combine_kernel<<<static_cast<unsigned>(a.tokens), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

void moe_add_shared(const MoeAddSharedArgs& a, cudaStream_t s) {
  if (a.n == 0) return;
  moe_add_shared_kernel<<<ceil_div(a.n, 256), 256, 0, s>>>(a);
  TANDEM_CUDA_LAUNCH_CHECK();
}

kernels::cuda::SmemBound moe_up_smem_bound(int64_t dim) {
  return {"moe_up_kernel", static_cast<int64_t>(up_smem(dim)), "hidden size " + std::to_string(dim), ""};
}
kernels::cuda::SmemBound moe_down_smem_bound(int64_t inter) {
  return {"moe_down_kernel", static_cast<int64_t>(down_smem(inter)),
          "expert intermediate size " + std::to_string(inter), ""};
}

}  // namespace tandem::cuda_model
