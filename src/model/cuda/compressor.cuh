// The pool slot of a compressed entry's record (compressor.h's store_entries), shared by
// store_entries_kernel (compressor.cu) and the store in norm_rope's key rows (norm_rope.cu): one
// copy of the address arithmetic.
#pragma once

#include <cstdint>

#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

// Row t's entry at position pos (a multiple of ratio): pool[block_tables[seq][pos / bs]] + pool_off +
// ((pos % bs) / ratio) * rec_bytes.
__device__ __forceinline__ uint8_t* entry_slot(const StepMeta& m, int64_t t, int64_t pos, int ratio, uint8_t* pool,
                                               int64_t block_bytes, int64_t pool_off, int64_t rec_bytes) {
  const int seq = m.row_seq[t];
  const int32_t blk = m.block_tables[static_cast<int64_t>(seq) * m.max_blocks + pos / m.block_size];
  const int64_t in_blk = (pos % m.block_size) / ratio;
  return pool + static_cast<int64_t>(blk) * block_bytes + pool_off + in_blk * rec_bytes;
}

}  // namespace tandem::cuda_model
