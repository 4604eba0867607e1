// DeviceBuffer's counted allocation and the device queries used at start-up.
#include "kernels/cuda/cuda_util.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "common/check.h"

namespace tandem::kernels::cuda {

namespace {
std::atomic<int64_t> g_alloc_count{0};
std::atomic<int64_t> g_alloc_bytes{0};
}  // namespace

AllocStats alloc_stats() { return {g_alloc_count.load(), g_alloc_bytes.load()}; }

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&p, bytes));
  g_alloc_count.fetch_add(1);
  g_alloc_bytes.fetch_add(static_cast<int64_t>(bytes));
  return p;
}

void device_free(void* p) { TANDEM_CUDA_CHECK(cudaFree(p)); }

size_t dynamic_smem_room(const void* kernel) {
  int dev = 0, optin = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&dev));
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes fa{};
  TANDEM_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  return static_cast<size_t>(optin) - fa.sharedSizeBytes;
}

void allow_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  const size_t room = dynamic_smem_room(kernel);
  TANDEM_CHECK_MSG(bytes <= room, "a kernel needs more shared memory than the device has");
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(room)));
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

const char* device_description(int dev) {
  static thread_local std::string s;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    cudaGetLastError();
    s = "unknown device " + std::to_string(dev);
    return s.c_str();
  }
  s = std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
      std::to_string(p.multiProcessorCount) + " SMs, " +
      std::to_string(static_cast<long long>(p.totalGlobalMem >> 30)) + " GiB)";
  return s.c_str();
}

bool binary_supports_device(int dev) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // TANDEM_CUDA_ARCHS lists what was compiled ("90a,100a,120,121"); the arch-specific targets
  // (90a, 100a) run only on exactly that major.minor.
  const std::string archs = TANDEM_CUDA_ARCHS;
  const std::string want = std::to_string(p.major) + std::to_string(p.minor);
  size_t pos = 0;
  while (pos <= archs.size()) {
    size_t end = archs.find(',', pos);
    if (end == std::string::npos) end = archs.size();
    std::string a = archs.substr(pos, end - pos);
    if (!a.empty() && a.back() == 'a') a.pop_back();
    if (a == want) return true;
    pos = end + 1;
  }
  return false;
}

double graph_launch_us(cudaGraphExec_t graph, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1) {
  TANDEM_CUDA_CHECK(cudaEventRecord(e0, stream));
  TANDEM_CUDA_CHECK(cudaGraphLaunch(graph, stream));
  TANDEM_CUDA_CHECK(cudaEventRecord(e1, stream));
  TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return ms * 1000.0;
}

}  // namespace tandem::kernels::cuda
