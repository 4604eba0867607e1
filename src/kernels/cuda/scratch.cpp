// The per-device op scratch (cuda_util.h): one growable buffer per (device, slot), grown only
// outside stream capture so that nothing allocates on a captured (decode) path.
#include <cuda_runtime.h>

#include <mutex>

#include "common/check.h"
#include "kernels/cuda/cuda_util.h"

namespace tandem::kernels::cuda {
namespace {
constexpr int kMaxDevices = 64;
constexpr int kSlots = static_cast<int>(ScratchSlot::kCount);
std::mutex g_mu;
// Leaked on purpose: freeing device memory from a static destructor races the CUDA runtime's own
// teardown at exit.
using Slots = DeviceBuffer<unsigned char>[kMaxDevices][kSlots];
Slots& g_buf = *new Slots[1];

DeviceBuffer<unsigned char>& slot_buf(ScratchSlot slot) {
  int dev = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CHECK(dev >= 0 && dev < kMaxDevices);
  return g_buf[dev][static_cast<int>(slot)];
}

void grow(DeviceBuffer<unsigned char>& b, size_t bytes) {
  // Earlier work may still use the old buffer: wait for it before freeing.
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const size_t rounded = (bytes + (1u << 20) - 1) & ~static_cast<size_t>((1u << 20) - 1);  // whole MiB
  b.reset(rounded);
}
}  // namespace

void* scratch(ScratchSlot slot, size_t bytes, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceBuffer<unsigned char>& b = slot_buf(slot);
  if (b.size() < bytes) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    TANDEM_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
    TANDEM_CHECK_MSG(st == cudaStreamCaptureStatusNone,
                     "op scratch too small inside a CUDA graph capture: run the largest shape eagerly "
                     "(or reserve_scratch) before capturing");
    grow(b, bytes);
  }
  return b.get();
}

void reserve_scratch(ScratchSlot slot, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceBuffer<unsigned char>& b = slot_buf(slot);
  if (b.size() < bytes) grow(b, bytes);
}

size_t scratch_bytes(ScratchSlot slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  return slot_buf(slot).size();
}

}  // namespace tandem::kernels::cuda
