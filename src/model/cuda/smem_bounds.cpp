// The model kernels' shared-memory bounds (smem_bounds.h).
#include "model/cuda/smem_bounds.h"

#include "io/model_config.h"

namespace tandem::cuda_model {

int attention_max_keys(const ModelConfig& c, int ratio, bool csa, int64_t end_bound) {
  return c.sliding_window + static_cast<int>(csa ? c.index_topk : (ratio ? end_bound / ratio : 0));
}

std::vector<kernels::cuda::SmemBound> dynamic_smem_bounds(const ModelConfig& c) {
  std::vector<kernels::cuda::SmemBound> out = attention_smem_bounds();
  if (c.has_dspark()) out.push_back(draft_attention_smem_bound(c.sliding_window, c.dspark_block_size, c.head_dim));
  for (auto& b : indexer_smem_bounds()) out.push_back(std::move(b));
  out.push_back(norm_rope_smem_bound());
  out.push_back(moe_up_smem_bound(c.hidden_size));
  out.push_back(moe_down_smem_bound(c.moe_intermediate_size));
  out.push_back(expert_smem_bound());
  out.push_back(gate_route_smem_bound(c.n_routed_experts));
  for (auto* more : {moe_prefill_smem_bounds, moe_prefill_ws_smem_bounds})
    for (auto& b : more()) out.push_back(std::move(b));
  return out;
}

}  // namespace tandem::cuda_model
