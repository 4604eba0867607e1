// One slot's state leaving and entering its place on the device: export/import_slot_state through
// host buffers (tests, tools) and the prefix-cache snapshot pool kept on the device (allocate /
// save / load, device-to-device copies on the model's stream), in the format of model/slot_state.h.
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_util.h"
#include "model/cuda/cuda_impl.h"
#include "model/slot_state.h"

namespace tandem {

namespace {
model::SnapshotFormat snapshot_format(const cuda_model::DeviceLayout& l) {
  return {static_cast<size_t>(l.slot_bytes), static_cast<size_t>(l.draft_slot_bytes)};
}
// The engine's slots' lengths (the padding slot of graph steps follows them).
std::span<const int64_t> engine_slots(const CudaModel::Impl& m) {
  return {m.slot_len.data(), static_cast<size_t>(m.opt.max_slots)};
}
}  // namespace

Status CudaModel::export_slot_state(int slot, std::span<uint8_t> out) const {
  const Impl& m = *impl_;
  TANDEM_ASSIGN_OR_RETURN(model::SnapshotOut parts, model::begin_export(engine_slots(m), snapshot_format(m.lay), slot, out));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(parts.state.data(), m.slot_state.get() + slot * m.lay.slot_bytes,
                                    parts.state.size(), cudaMemcpyDeviceToHost, m.stream));
  if (!parts.draft.empty())
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(parts.draft.data(), m.draft_ctx.get() + slot * m.lay.draft_slot_bytes,
                                      parts.draft.size(), cudaMemcpyDeviceToHost, m.stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  return Status();
}

Status CudaModel::import_slot_state(int slot, std::span<const uint8_t> in) {
  Impl& m = *impl_;
  TANDEM_ASSIGN_OR_RETURN(model::SnapshotIn parts, model::read_snapshot(engine_slots(m), snapshot_format(m.lay), slot, in));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.slot_state.get() + slot * m.lay.slot_bytes, parts.state.data(),
                                    parts.state.size(), cudaMemcpyHostToDevice, m.stream));
  if (!parts.draft.empty())
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.draft_ctx.get() + slot * m.lay.draft_slot_bytes, parts.draft.data(),
                                      parts.draft.size(), cudaMemcpyHostToDevice, m.stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.slot_len[slot] = parts.length;
  return Status();
}

size_t CudaModel::snapshot_device_bytes() const {
  return static_cast<size_t>(impl_->lay.slot_bytes + impl_->lay.draft_slot_bytes);
}

int CudaModel::num_snapshots() const { return static_cast<int>(impl_->snap_len.size()); }

Status CudaModel::allocate_snapshots(int count) {
  Impl& m = *impl_;
  if (count < 0) return invalid_argument("allocate_snapshots: count {} < 0", count);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // no copy may still use the old pool
  m.snapshots.release();
  m.snap_len.clear();
  if (count == 0) return Status();
  const size_t each = snapshot_device_bytes();
  const size_t want = each * static_cast<size_t>(count);
  // A discrete GPU's free memory bounds the pool; on an integrated one (unified memory) the driver's
  // free leaves out the page cache the kernel would reclaim, and the memory plan has checked the
  // host's MemAvailable instead.
  size_t free_b = 0, total_b = 0;
  int dev = 0, integrated = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, dev));
  TANDEM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (!integrated && want > free_b)
    return make_error(StatusCode::kResourceExhausted,
                      "prefix-cache snapshots: {} x {} bytes = {:.1f} MiB on the device, {:.1f} MiB free", count, each,
                      want / 1048576.0, free_b / 1048576.0);
  m.snapshots.reset(want);  // 0 bytes (a config without rings): only the lengths are kept
  m.snap_len.assign(static_cast<size_t>(count), -1);
  return Status();
}

namespace {
Status check_snapshot_index(const CudaModel::Impl& m, int slot, int index, const char* what) {
  TANDEM_RETURN_IF_ERROR(model::check_slot(engine_slots(m), slot, what));
  if (index < 0 || static_cast<size_t>(index) >= m.snap_len.size())
    return invalid_argument("{}: snapshot {} outside the {} on the device", what, index, m.snap_len.size());
  return Status();
}
}  // namespace

Status CudaModel::save_snapshot(int slot, int index) {
  Impl& m = *impl_;
  TANDEM_RETURN_IF_ERROR(check_snapshot_index(m, slot, index, "save_snapshot"));
  uint8_t* dst = m.snapshots.get() + static_cast<size_t>(index) * snapshot_device_bytes();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, m.slot_state.get() + slot * m.lay.slot_bytes,
                                    static_cast<size_t>(m.lay.slot_bytes), cudaMemcpyDeviceToDevice, m.stream));
  if (m.lay.draft_slot_bytes)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst + m.lay.slot_bytes, m.draft_ctx.get() + slot * m.lay.draft_slot_bytes,
                                      static_cast<size_t>(m.lay.draft_slot_bytes), cudaMemcpyDeviceToDevice,
                                      m.stream));
  m.snap_len[index] = m.slot_len[slot];
  return Status();
}

Status CudaModel::load_snapshot(int slot, int index) {
  Impl& m = *impl_;
  TANDEM_RETURN_IF_ERROR(check_snapshot_index(m, slot, index, "load_snapshot"));
  if (m.snap_len[index] < 0) return invalid_argument("load_snapshot: snapshot {} was never saved", index);
  const uint8_t* src = m.snapshots.get() + static_cast<size_t>(index) * snapshot_device_bytes();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.slot_state.get() + slot * m.lay.slot_bytes, src,
                                    static_cast<size_t>(m.lay.slot_bytes), cudaMemcpyDeviceToDevice, m.stream));
  if (m.lay.draft_slot_bytes)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.draft_ctx.get() + slot * m.lay.draft_slot_bytes, src + m.lay.slot_bytes,
                                      static_cast<size_t>(m.lay.draft_slot_bytes), cudaMemcpyDeviceToDevice,
                                      m.stream));
  m.slot_len[slot] = m.snap_len[index];
  return Status();
}

}  // namespace tandem
