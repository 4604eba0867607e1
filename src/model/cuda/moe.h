// Routed experts on the device, per (token, expert) pair: the routed experts of a layer this rank
// holds live in one array (local expert l = e - expert_begin: W1/W3 rows [l*inter, (l+1)*inter),
// W2 rows [l*dim, (l+1)*dim)), so one launch covers every pair of the step; the combine sums a
// token's pairs in ascending expert id, the CPU's accumulation order (the CPU: DsV4Model::Impl::moe,
// src/model/forward.cpp). Under tensor parallelism a rank holds experts [expert_begin, expert_begin
// + expert_count): pairs routed elsewhere get zero rows and add nothing to the combine, whose
// routed-only form (shared == null) leaves the fp32 partial sum for the all-reduce; the shared
// expert is then added as the CPU does after its all-reduce, by the forward's hc_post as it loads
// the sum (HcPostParams::f_add, f_round) with moe_add_shared's arithmetic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::cuda_model {

// gact[i] = bf16(silu(min(g, limit)) * clamp(u, +-limit) * weights[i]), g = bf16(xq[i/topk] . W1_e row),
// u = bf16(xq[i/topk] . W3_e row), e = expert_ids[i] (limit <= 0: no clamp); gact[i] = 0 for an
// expert this rank does not hold.
struct MoePairsUpArgs {
  const float* xq = nullptr;         // [pairs/topk, dim] (act_quant'ed when the weights are FP8/FP4)
  const int32_t* expert_ids = nullptr;  // [pairs]
  const float* weights = nullptr;    // [pairs] routing weights
  int64_t pairs = 0;
  int topk = 6;
  kernels::WeightRef w1_all;         // [expert_count*inter, dim] the held experts
  kernels::WeightRef w3_all;         // [expert_count*inter, dim]
  int64_t inter = 0;
  int64_t dim = 0;
  float limit = 10.0f;
  float* gact = nullptr;             // [pairs, inter]
  int expert_begin = 0;              // held experts [expert_begin, expert_begin + expert_count)
  int expert_count = -1;             // -1: every expert id (one rank)
};
void moe_pairs_up(const MoePairsUpArgs& a, cudaStream_t s);

// out[i] = bf16(gq[i] . W2_e rows)   [pairs, dim]; out[i] = 0 for an expert this rank does not hold.
struct MoePairsDownArgs {
  const float* gq = nullptr;         // [pairs, inter]
  const int32_t* expert_ids = nullptr;  // [pairs]
  int64_t pairs = 0;
  kernels::WeightRef w2_all;         // [expert_count*dim, inter] the held experts
  int64_t inter = 0;
  int64_t dim = 0;
  float* out = nullptr;              // [pairs, dim]
  int expert_begin = 0;              // held experts, as MoePairsUpArgs
  int expert_count = -1;
};
void moe_pairs_down(const MoePairsDownArgs& a, cudaStream_t s);

// y[t] = bf16(sum over the token's held pairs in ascending expert id of pair_out[pair] + shared[t]);
// shared == null: y[t] = that sum in fp32, unrounded (a rank's partial sum before the all-reduce).
struct MoeCombineArgs {
  const float* pair_out = nullptr;   // [tokens*topk, dim]
  const int32_t* expert_ids = nullptr;  // [tokens, topk], distinct per token
  const float* shared = nullptr;     // [tokens, dim] shared expert output, or null (routed only)
  int64_t tokens = 0;
  int topk = 6;                      // <= 16
  int64_t dim = 0;
  float* y = nullptr;                // [tokens, dim]
  int expert_begin = 0;              // held experts, as MoePairsUpArgs
  int expert_count = -1;
};
void moe_combine(const MoeCombineArgs& a, cudaStream_t s);

// y[i] = bf16(y[i] + shared[i]): the all-reduced routed sum plus the shared expert (the CPU's
// round_bf16(moe_y + shared) after its all-reduce). The forward does not launch it (hc_post applies
// it as it loads y); the reference that hc_post's load epilogue is tested against.
struct MoeAddSharedArgs {
  float* y = nullptr;                // [n] fp32 routed sum, in place
  const float* shared = nullptr;     // [n] shared expert output (bf16 values)
  int64_t n = 0;
};
void moe_add_shared(const MoeAddSharedArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
