// Routed experts on the device, per (token, expert) pair: every routed expert of a layer lives in
// one array (W1/W3 rows [e*inter, (e+1)*inter), W2 rows [e*dim, (e+1)*dim)), so one launch covers
// every pair of the step; the combine sums a token's pairs in ascending expert id, the CPU's
// accumulation order (the CPU: DsV4Model::Impl::moe, src/model/forward.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::cuda_model {

// gact[i] = bf16(silu(min(g, limit)) * clamp(u, +-limit) * weights[i]), g = bf16(xq[i/topk] . W1_e row),
// u = bf16(xq[i/topk] . W3_e row), e = expert_ids[i] (limit <= 0: no clamp).
struct MoePairsUpArgs {
  const float* xq = nullptr;         // [pairs/topk, dim] (act_quant'ed when the weights are FP8/FP4)
  const int32_t* expert_ids = nullptr;  // [pairs]
  const float* weights = nullptr;    // [pairs] routing weights
  int64_t pairs = 0;
  int topk = 6;
  kernels::WeightRef w1_all;         // [E*inter, dim]
  kernels::WeightRef w3_all;         // [E*inter, dim]
  int64_t inter = 0;
  int64_t dim = 0;
  float limit = 10.0f;
  float* gact = nullptr;             // [pairs, inter]
};
void moe_pairs_up(const MoePairsUpArgs& a, cudaStream_t s);

// out[i] = bf16(gq[i] . W2_e rows)   [pairs, dim]
struct MoePairsDownArgs {
  const float* gq = nullptr;         // [pairs, inter]
  const int32_t* expert_ids = nullptr;  // [pairs]
  int64_t pairs = 0;
  kernels::WeightRef w2_all;         // [E*dim, inter]
  int64_t inter = 0;
  int64_t dim = 0;
  float* out = nullptr;              // [pairs, dim]
};
void moe_pairs_down(const MoePairsDownArgs& a, cudaStream_t s);

// y[t] = bf16(sum over the token's pairs in ascending expert id of pair_out[pair] + shared[t])
struct MoeCombineArgs {
  const float* pair_out = nullptr;   // [tokens*topk, dim]
  const int32_t* expert_ids = nullptr;  // [tokens, topk], distinct per token
  const float* shared = nullptr;     // [tokens, dim] shared expert output
  int64_t tokens = 0;
  int topk = 6;                      // <= 16
  int64_t dim = 0;
  float* y = nullptr;                // [tokens, dim]
};
void moe_combine(const MoeCombineArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
