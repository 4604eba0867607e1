// Host-side CUDA plumbing shared by the kernels and the device runner: checked calls (every CUDA
// call's status is checked; a failure is a programmer or device fault and aborts with file:line and
// the CUDA message), and DeviceBuffer, the one way device memory is taken, with a process-wide
// allocation counter so tests can prove that nothing allocates after start-up.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#define TANDEM_CUDA_CHECK(call)                                                                   \
  do {                                                                                            \
    const cudaError_t tandem_cuda_err_ = (call);                                                  \
    if (tandem_cuda_err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s (%s)\n", __FILE__, __LINE__,                 \
                   cudaGetErrorName(tandem_cuda_err_), cudaGetErrorString(tandem_cuda_err_), #call); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

// After a kernel launch: launch-configuration errors surface here (execution errors at the next
// synchronizing call, which is checked too).
#define TANDEM_CUDA_LAUNCH_CHECK() TANDEM_CUDA_CHECK(cudaGetLastError())

namespace tandem::kernels::cuda {

// Counts every device allocation made through DeviceBuffer (and device_alloc).
struct AllocStats {
  int64_t count = 0;
  int64_t bytes = 0;
};
AllocStats alloc_stats();
void* device_alloc(size_t bytes);  // cudaMalloc, counted; aborts on failure (sized at start-up)
void device_free(void* p);

// Owning device array of T (uninitialised).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { reset(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  void reset(size_t n) {
    release();
    if (n) p_ = static_cast<T*>(device_alloc(n * sizeof(T)));
    n_ = n;
  }
  void release() {
    if (p_) device_free(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Per-device scratch for ops that need a private buffer (gemm's quantized copy of x with
// quantize_x_block, the mHC split-K partials). A slot grows (counted allocation, after a device
// synchronize) only outside stream capture; a captured call that needs more than the eager warm-up
// reserved is a programmer error (CHECK). A slot is used by one op at a time in stream order, so
// the ops of one device must run on one stream. reserve_scratch lets a runner size a slot at
// start-up; scratch_bytes reports the current size.
enum class ScratchSlot : int { kGemmX = 0, kHc = 1, kCount = 2 };
void* scratch(ScratchSlot slot, size_t bytes, cudaStream_t s);
void reserve_scratch(ScratchSlot slot, size_t bytes);
size_t scratch_bytes(ScratchSlot slot);

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device: above the
// default 48 KiB it raises the kernel's limit to what the device allows beside its static shared
// memory (CHECKs that `bytes` fits). Called by the launcher before every such launch (cheap, no
// synchronization, legal inside stream capture), so nothing is remembered per process or device.
void allow_dynamic_smem(const void* kernel, size_t bytes);
// The dynamic shared memory `kernel` can have on the current device: the per-block opt-in limit less
// the kernel's static shared memory (what allow_dynamic_smem raises the limit to).
size_t dynamic_smem_room(const void* kernel);

// Number of CUDA devices visible (0 when there is no driver or no GPU; never aborts).
int device_count();
// "NVIDIA H200 (sm_90, 132 SMs, 141 GB)" for device `dev`.
const char* device_description(int dev);
// True when this binary carries machine code for device `dev`'s architecture.
bool binary_supports_device(int dev);

// Microseconds of one launch of `graph` on `stream`, between two events the caller created
// (waits for it: benchmarks and measurements only).
double graph_launch_us(cudaGraphExec_t graph, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1);

}  // namespace tandem::kernels::cuda
