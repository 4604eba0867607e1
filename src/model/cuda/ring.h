// Writes into a slot's rings (the window ring of KV records, the compressor row rings, the DSpark
// context rings): a ring of R rows holds position p at row p % R (the CPU: the commits at the end
// of DsV4Model::Impl::attention_target and project_draft_context).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/cuda/step_meta.h"

namespace tandem::cuda_model {

// After the layer's attention: rows t of a sequence with t >= len - ring go to ring row pos_t % ring
// of the sequence's slot (bytes_per_row bytes each, from src[t]).
struct RingCommitArgs {
  const uint8_t* src = nullptr;      // [rows, bytes_per_row]
  int64_t bytes_per_row = 0;
  StepMeta m;
  int64_t rows = 0;
  uint8_t* slot_state = nullptr;     // [max_slots, slot_bytes]
  int64_t slot_bytes = 0;
  int64_t ring_off = 0;              // byte offset of the ring in a slot
  int ring = 0;
};
void ring_commit(const RingCommitArgs& a, cudaStream_t s);
// Up to kMaxRingCommits commits of one step (the layer's window, compressor and indexer
// compressor rings) in one launch; the same bytes as one ring_commit each. Rows are copied in the
// widest word (16, 8, 4 or 1 bytes) that the row size, the ring offset, the slot size and both
// base addresses allow.
constexpr int kMaxRingCommits = 4;
void ring_commit_batch(const RingCommitArgs* rings, int count, cudaStream_t s);

// Rows [first, n) of src (positions pos0 + t) to ring_base row (pos0 + t) % ring.
struct RingWriteArgs {
  const uint8_t* src = nullptr;      // [n, bytes_per_row]
  int64_t bytes_per_row = 0;
  int64_t first = 0;
  int64_t n = 0;
  int64_t pos0 = 0;
  uint8_t* ring_base = nullptr;      // [ring, bytes_per_row]
  int ring = 0;
};
void ring_write(const RingWriteArgs& a, cudaStream_t s);

}  // namespace tandem::cuda_model
