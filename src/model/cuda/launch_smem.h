// The dynamic shared memory each launcher of model_kernels.cu asks for, one function per launcher:
// the launchers call them, and smem_bounds.cpp evaluates them at the largest supported shape for
// the kernel-limits check (tests/cuda_limits). Plain C++, shared by nvcc and the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::cuda_model {

// indexer_kernel: the row's queries [heads, dim] and head weights [heads].
inline size_t indexer_smem(int heads, int dim) { return sizeof(float) * (static_cast<size_t>(heads) * dim + heads); }
// attention_kernel, draft_attention_kernel: each key's (position, record) word and score, and q.
inline size_t attn_smem(int max_keys, int hd) {
  return static_cast<size_t>(max_keys) * (sizeof(uint64_t) + sizeof(float)) + sizeof(float) * hd;
}
// moe_up_kernel: the token's quantized input [dim]; moe_down_kernel: the pair's activation [inter].
inline size_t moe_up_smem(int64_t dim) { return sizeof(float) * static_cast<size_t>(dim); }
inline size_t moe_down_smem(int64_t inter) { return sizeof(float) * static_cast<size_t>(inter); }

}  // namespace tandem::cuda_model
