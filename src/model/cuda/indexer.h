// The CSA lightning indexer on the device (the CPU: kernels::cpu::indexer_score over the keys copied
// out of the pool, then kernels::cpu::topk, in DsV4Model::Impl::attention_target): scores of every
// row against the paged FP4 index keys of its sequence on the tensor cores (indexer.cu), the bf16
// scaling of the indexer head weights, and the row's top-k entries as a multi-block selection
// (indexer_topk.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/kv_record.h"
#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

// scores[t][e] = bf16(sum_h bf16(relu(bf16(q[t][h] . key_e)) * w[t][h])), heads summed in ascending
// order in fp32 (kernels::IndexerScoreParams' bf16 numerics), stored as bf16 bits, for e <
// visible[t] = (pos_t+1)/4; -inf for visible <= e < n_cols. key_e = the FP4 key record of entry e of
// the row's sequence (pool block of position 4e). The dots run on bf16 tensor cores: queries and
// keys are FP4 values (e2m1 x power-of-two block scales, exact in bf16), so a dot equals the CPU's
// whenever the CPU's is exact (block scales within 9 binades of each other); heads, dim: see
// indexer_supports.
// Consecutive rows of one sequence (prefill chunks) share the decoded key tiles of a block.
// With `hist` the kernel also counts, per row, the visible scores by the top byte of their order key
// (indexer_topk.h), the first pass of the top-k selection.
struct IndexerArgs {
  const float* q = nullptr;          // [rows, heads, dim] (after RoPE, Hadamard, FP4 round trip)
  const float* w = nullptr;          // [rows, heads] bf16-scaled head weights (w_scale == 0), or the
                                     // unscaled ones, which the kernel scales as scale_round(w_scale)
                                     // does (the same bits, one launch fewer)
  float w_scale = 0.0f;
  StepMeta m;
  int64_t rows = 0;                  // <= 65535 (grid.y)
  int heads = 64;                    // 1..64
  int dim = 128;                     // 64 or 128
  const uint8_t* pool = nullptr;     // [num_blocks, block_bytes]
  int64_t block_bytes = 0;
  int64_t pool_idx = 0;              // byte offset of the layer's keys in a block: [bs/4, key.bytes]
  IndexKeyLayout key;
  uint16_t* scores = nullptr;        // [rows, lds] bf16 bits
  int64_t n_cols = 0;
  int64_t lds = 0;                   // row stride of scores (>= n_cols, a multiple of 8)
  int32_t* visible = nullptr;        // [rows] out
  uint32_t* hist = nullptr;          // optional [rows, 256], zero before: top-byte counts added
  int sm_count = 0;                  // multiprocessors (0: the current device's)
  int rows_per_block = 0;            // rows of one sequence sharing a block's key tiles (0: by the step's
                                     // size), clamped to 1..min(8, 128 / heads); changes no result, only
                                     // how often keys are decoded
  bool group_kernel = true;          // rows_per_block > 1 on the row-group kernel (false: the one-row
                                     // kernel's spans of at most 4 rows, its former shape: the same
                                     // bits, kept for the tests and bench-kernels' comparison)
};
void indexer_scores_paged(const IndexerArgs& a, cudaStream_t s);
bool indexer_supports(int heads, int dim);

// x[i] = bf16(x[i] * scale)   (the indexer head weights times 128^-0.5 * heads^-0.5)
struct ScaleRoundArgs {
  float* x = nullptr;                // [n]
  int64_t n = 0;
  float scale = 1.0f;
};
void scale_round(const ScaleRoundArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
