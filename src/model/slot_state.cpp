// The slot-state rules both models share: see slot_state.h.
#include "model/slot_state.h"

#include <cstring>

#include "common/check.h"
#include "model/weights.h"

namespace tandem::model {

Status validate_state_options(const ModelOptions& opt) {
  if (opt.max_slots <= 0) return invalid_argument("model options: max_slots must be > 0");
  if (opt.block_size <= 0 || opt.block_size % 128)
    return invalid_argument("model options: block_size {} must be a positive multiple of 128", opt.block_size);
  if (opt.num_blocks <= 0) return invalid_argument("model options: num_blocks must be > 0");
  if (opt.max_tokens_per_step <= 0) return invalid_argument("model options: max_tokens_per_step must be > 0");
  if (opt.max_rollback < 0) return invalid_argument("model options: max_rollback must be >= 0");
  if (opt.kv_dtype != KvDtype::kFp8 && opt.kv_dtype != KvDtype::kBf16 && opt.kv_dtype != KvDtype::kNvfp4)
    return invalid_argument("model options: unknown kv_dtype {}", static_cast<int>(opt.kv_dtype));
  return Status();
}

Status check_slot(std::span<const int64_t> lengths, int slot, const char* what) {
  if (slot < 0 || static_cast<size_t>(slot) >= lengths.size())
    return invalid_argument("{}: slot {} out of range", what, slot);
  return Status();
}

int64_t slot_length(std::span<const int64_t> lengths, int slot) {
  TANDEM_CHECK(slot >= 0 && static_cast<size_t>(slot) < lengths.size());
  return lengths[slot];
}

Status rollback_slot(std::span<int64_t> lengths, int64_t max_rollback, int slot, int64_t new_length) {
  TANDEM_RETURN_IF_ERROR(check_slot(lengths, slot, "rollback"));
  const int64_t len = lengths[slot];
  if (new_length > len || new_length < 0 || len - new_length > max_rollback)
    return invalid_argument("rollback: slot {} length {} cannot roll back to {} (max_rollback {})", slot, len,
                            new_length, max_rollback);
  lengths[slot] = new_length;
  return Status();
}

Result<SnapshotOut> begin_export(std::span<const int64_t> lengths, const SnapshotFormat& format, int slot,
                                 std::span<uint8_t> out) {
  TANDEM_RETURN_IF_ERROR(check_slot(lengths, slot, "export_slot_state"));
  if (out.size() != format.bytes())
    return invalid_argument("export_slot_state: buffer has {} bytes, {} needed", out.size(), format.bytes());
  std::memcpy(out.data(), &lengths[slot], sizeof(int64_t));
  SnapshotOut parts;
  parts.state = out.subspan(sizeof(int64_t), format.state_bytes);
  parts.draft = out.subspan(sizeof(int64_t) + format.state_bytes, format.draft_bytes);
  return parts;
}

Result<SnapshotIn> read_snapshot(std::span<const int64_t> lengths, const SnapshotFormat& format, int slot,
                                 std::span<const uint8_t> in) {
  TANDEM_RETURN_IF_ERROR(check_slot(lengths, slot, "import_slot_state"));
  if (in.size() != format.bytes())
    return invalid_argument("import_slot_state: buffer has {} bytes, {} expected", in.size(), format.bytes());
  SnapshotIn parts;
  std::memcpy(&parts.length, in.data(), sizeof(int64_t));
  if (parts.length < 0) return invalid_argument("import_slot_state: negative length {}", parts.length);
  parts.state = in.subspan(sizeof(int64_t), format.state_bytes);
  parts.draft = in.subspan(sizeof(int64_t) + format.state_bytes, format.draft_bytes);
  return parts;
}

}  // namespace tandem::model
