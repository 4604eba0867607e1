// Shared-memory facts of the model's kernels that depend on the config: the attention's key-list
// bound (used by the forward at every step) and each launcher's largest dynamic shared memory
// request at the config's largest shape (checked by tests/cuda_limits against each GPU target).
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "kernels/cuda/smem_bounds.h"

namespace tandem::cuda_model {

// Keys one attention row can see, which bounds the key list attention_kernel keeps in shared
// memory: the window plus, on a compressed layer, the indexer's top-k (CSA: ratio 4 with an
// indexer) or every entry visible in `end_bound` tokens of context (HCA).
int attention_max_keys(const ModelConfig& c, int ratio, bool csa, int64_t end_bound);

// Dynamic shared memory each launcher of model_kernels.cu asks for at the largest shape of `c`
// (max_position_embeddings tokens of context, every layer kind, the draft), computed by the
// launchers' own functions (launch_smem.h).
std::vector<kernels::cuda::SmemBound> dynamic_smem_bounds(const ModelConfig& c);

}  // namespace tandem::cuda_model
