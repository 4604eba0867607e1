// The model kernels' shared-memory bounds (smem_bounds.h).
#include "model/cuda/smem_bounds.h"

#include <fmt/format.h>

#include "model/cuda/launch_smem.h"

namespace tandem::cuda_model {

int attention_max_keys(const ModelConfig& c, int ratio, bool csa, int64_t end_bound) {
  return c.sliding_window + static_cast<int>(csa ? c.index_topk : (ratio ? end_bound / ratio : 0));
}

std::vector<kernels::cuda::SmemBound> dynamic_smem_bounds(const ModelConfig& c) {
  std::vector<kernels::cuda::SmemBound> out;
  const int64_t ctx = c.max_position_embeddings;
  out.push_back({"indexer_kernel", static_cast<int64_t>(indexer_smem(c.index_n_heads, c.index_head_dim)),
                 fmt::format("{} indexer heads x dim {}", c.index_n_heads, c.index_head_dim), ""});
  // The largest key list over the layer kinds present (weights.cpp binds an indexer exactly on the
  // ratio-4 layers).
  int worst_ratio = 0, worst_keys = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int r = c.compress_ratio(l);
    const int keys = attention_max_keys(c, r, r == 4, ctx);
    if (keys > worst_keys) worst_keys = keys, worst_ratio = r;
  }
  const char* kind = worst_ratio == 0 ? "sliding-window" : worst_ratio == 4 ? "CSA" : "HCA";
  const std::string beyond = worst_ratio == 4   ? fmt::format(" + top-{}", c.index_topk)
                             : worst_ratio != 0 ? fmt::format(" + {}/{} entries", ctx, worst_ratio)
                                                : "";
  out.push_back({"attention_kernel", static_cast<int64_t>(attn_smem(worst_keys, c.head_dim)),
                 fmt::format("{} layer (ratio {}) at {} tokens: {} keys (window {}{}), head dim {}", kind, worst_ratio,
                             ctx, worst_keys, c.sliding_window, beyond, c.head_dim),
                 "the kernel keeps its key list in shared memory (12 bytes per key), which grows with the "
                 "context on HCA layers: until decode attention streams its keys (split-K), contexts this long "
                 "cannot run on GPUs with 99 KB per block (sm_120, GB10's sm_121)"});
  if (c.has_dspark())
    out.push_back({"draft_attention_kernel",
                   static_cast<int64_t>(attn_smem(c.sliding_window + c.dspark_block_size, c.head_dim)),
                   fmt::format("window {} + {} block rows, head dim {}", c.sliding_window, c.dspark_block_size,
                               c.head_dim),
                   ""});
  out.push_back({"moe_up_kernel", static_cast<int64_t>(moe_up_smem(c.hidden_size)),
                 fmt::format("hidden size {}", c.hidden_size), ""});
  out.push_back({"moe_down_kernel", static_cast<int64_t>(moe_down_smem(c.moe_intermediate_size)),
                 fmt::format("expert intermediate size {}", c.moe_intermediate_size), ""});
  return out;
}

}  // namespace tandem::cuda_model
