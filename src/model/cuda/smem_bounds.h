// Shared-memory facts of the model's kernels (tests/cuda_limits checks them against each GPU
// target): each launcher's largest dynamic shared memory request, reported by a function next to
// the launcher, and the set of them at a config's largest shape. Also the attention's key-list
// bound, which the forward passes at every step. Light enough for nvcc (ModelConfig only declared).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/smem_bounds.h"

namespace tandem {
struct ModelConfig;
}

namespace tandem::cuda_model {

// Keys one attention row can see: the window plus, on a compressed layer, the indexer's top-k
// (CSA: ratio 4 with an indexer) or every entry visible in `end_bound` tokens of context (HCA).
// It sets how many 64-key chunks attention walks (split over blocks or folded in one), not its
// shared memory, which is one chunk's whatever the context.
int attention_max_keys(const ModelConfig& c, int ratio, bool csa, int64_t end_bound);

// Dynamic shared memory each model launcher asks for at the largest shape of `c`
// (max_position_embeddings tokens of context, every layer kind, the draft).
std::vector<kernels::cuda::SmemBound> dynamic_smem_bounds(const ModelConfig& c);

// One per launcher, defined next to it.
std::vector<kernels::cuda::SmemBound> attention_smem_bounds();     // attention.cu (any context)
kernels::cuda::SmemBound draft_attention_smem_bound(int window, int block, int hd);  // attention_draft.cu
std::vector<kernels::cuda::SmemBound> indexer_smem_bounds();       // indexer.cu (largest head dim)
kernels::cuda::SmemBound norm_rope_smem_bound();                   // norm_rope.cu (the launcher's cap)
kernels::cuda::SmemBound moe_up_smem_bound(int64_t dim);            // moe.cu
kernels::cuda::SmemBound moe_down_smem_bound(int64_t inter);        // moe.cu
kernels::cuda::SmemBound expert_smem_bound();                       // moe_decode.cu
kernels::cuda::SmemBound gate_route_smem_bound(int n_experts);      // moe_decode_route.cu
std::vector<kernels::cuda::SmemBound> moe_prefill_smem_bounds();    // moe_prefill.cu
std::vector<kernels::cuda::SmemBound> moe_prefill_ws_smem_bounds(); // moe_prefill_ws.cu

}  // namespace tandem::cuda_model
