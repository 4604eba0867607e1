// The CSA lightning indexer on the device (the CPU: kernels::cpu::indexer_score over the keys copied
// out of the pool, in DsV4Model::Impl::attention_target): scores of every row against the paged FP4
// index keys of its sequence, and the bf16 scaling of the indexer head weights.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/kv_record.h"
#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

// scores[t][e] = bf16(sum_h bf16(relu(bf16(q[t][h] . key_e)) * w[t][h])) for e < (pos_t+1)/4, -inf
// for visible <= e < n_cols (kernels::IndexerScoreParams' bf16 numerics); visible[t] = (pos_t+1)/4.
// key_e = the FP4 key record of entry e of the row's sequence (pool block of position 4e).
struct IndexerArgs {
  const float* q = nullptr;          // [rows, heads, dim] (after RoPE, Hadamard, FP4 round trip)
  const float* w = nullptr;          // [rows, heads] bf16-scaled head weights
  StepMeta m;
  int64_t rows = 0;                  // <= 65535 (grid.y)
  int heads = 64;
  int dim = 128;                     // <= 256
  const uint8_t* pool = nullptr;     // [num_blocks, block_bytes]
  int64_t block_bytes = 0;
  int64_t pool_idx = 0;              // byte offset of the layer's keys in a block: [bs/4, key.bytes]
  IndexKeyLayout key;
  float* scores = nullptr;           // [rows, n_cols]
  int64_t n_cols = 0;
  int32_t* visible = nullptr;        // [rows] out
};
void indexer_scores_paged(const IndexerArgs& a, cudaStream_t s);

// x[i] = bf16(x[i] * scale)   (the indexer head weights times 128^-0.5 * heads^-0.5)
struct ScaleRoundArgs {
  float* x = nullptr;                // [n]
  int64_t n = 0;
  float scale = 1.0f;
};
void scale_round(const ScaleRoundArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
