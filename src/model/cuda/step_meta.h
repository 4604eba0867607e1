// The device view of one step that the runner's kernels read, and the byte offsets of one layer's
// slot rings and pool entries. Every per-sequence quantity (start position, slot, block table) is
// read from these device step buffers, so a step's launches depend on host values only through
// row counts and stay graph-capturable.
#pragma once

#include <cstdint>

namespace tandem::cuda_model {

// Device view of one step (all arrays device memory, sized for the largest step at start-up).
struct StepMeta {
  const int32_t* tokens = nullptr;      // [rows]
  const int64_t* positions = nullptr;   // [rows] absolute position of each row
  const int32_t* row_seq = nullptr;     // [rows] index of the row's sequence in the step
  const int64_t* seq_start = nullptr;   // [seqs] start_pos (first new position)
  const int32_t* seq_row0 = nullptr;    // [seqs] first row of the sequence
  const int32_t* seq_len = nullptr;     // [seqs] new tokens of the sequence
  const int32_t* seq_slot = nullptr;    // [seqs] slot id
  const int32_t* block_tables = nullptr;  // [seqs, max_blocks] pool block ids
  int max_blocks = 0;
  int block_size = 256;
};

// Device slot state layout: byte offsets of one layer's rings inside a slot's state.
struct LayerState {
  int64_t win_off = 0;     // window ring of KV records [win_ring, rec.bytes]
  int64_t comp_off = -1;   // compressor rows ring, fp32 [comp_ring, 2*comp_chans]
  int64_t icomp_off = -1;  // indexer compressor rows ring
  int64_t pool_main = -1;  // byte offset inside a pool block of the layer's entries [bs/ratio, rec.bytes]
  int64_t pool_idx = -1;   // indexer keys [bs/4, key.bytes]
};

}  // namespace tandem::cuda_model
