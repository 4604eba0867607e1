// The slot-state layer both models share (the CPU oracle DsV4Model and the device CudaModel):
// which options and configs a state layout accepts, each slot's length and how far it may roll
// back, and the snapshot format of export/import_slot_state: [length int64][target state][draft
// context windows]. A model keeps the bytes where it computes (host arrays, device buffers) and
// copies them through the spans these functions hand it, so the rules live here once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/status.h"
#include "io/model_config.h"
#include "model/model.h"

namespace tandem::model {

// The options a state layout is planned for (slots, pool, block size, step size, rollback, KV
// dtype); with model::validate_config (weights.h: the config shapes) what state_sizes checks.
Status validate_state_options(const ModelOptions& options);

// One slot's snapshot: [length int64][state_bytes of target state][draft_bytes of DSpark context].
struct SnapshotFormat {
  size_t state_bytes = 0;
  size_t draft_bytes = 0;  // 0 without a draft
  size_t bytes() const { return sizeof(int64_t) + state_bytes + draft_bytes; }
};

// Where a model copies one slot's bytes from or to, inside a snapshot buffer.
struct SnapshotOut {
  std::span<uint8_t> state, draft;
};
struct SnapshotIn {
  int64_t length = 0;
  std::span<const uint8_t> state, draft;
};

// `lengths` holds the engine's slots (a model may keep more, e.g. a padding slot, after them).
Status check_slot(std::span<const int64_t> lengths, int slot, const char* what);
int64_t slot_length(std::span<const int64_t> lengths, int slot);  // CHECKs the slot
// Forgets positions >= new_length (at most max_rollback of them).
Status rollback_slot(std::span<int64_t> lengths, int64_t max_rollback, int slot, int64_t new_length);
// Checks the slot and the buffer, writes the length; the model fills the returned parts.
Result<SnapshotOut> begin_export(std::span<const int64_t> lengths, const SnapshotFormat& format, int slot,
                                 std::span<uint8_t> out);
// Checks the slot, the buffer and the length; the model copies the returned parts in, then sets the length.
Result<SnapshotIn> read_snapshot(std::span<const int64_t> lengths, const SnapshotFormat& format, int slot,
                                 std::span<const uint8_t> in);

}  // namespace tandem::model
