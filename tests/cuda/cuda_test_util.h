// The device side of the kernel test harness (tests/kernels/kernel_test_util.h and bit_compare.h
// are the shared part: random inputs, poisoning, comparators): the GPU requirement (a test skips
// only where no usable GPU is visible; tools/run-gpu-tests.sh fails a GPU run with any skip), the
// stream the op tests launch on, and device upload / download / poisoning.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/numeric.h"
#include "kernels/bit_compare.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/kernel_test_util.h"
#include "kernels/ops.h"
#include "cuda/require_gpu.h"

namespace tandem::kernels::cuda_testing {

using namespace ::tandem::kernels::testing;  // NOLINT: the shared harness
using cuda::DeviceBuffer;

// The op tests launch on the legacy default stream, passed explicitly like any other stream (every
// launcher takes its stream); tests that capture graphs create their own.
inline constexpr cudaStream_t kStream = nullptr;

inline void sync() {
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
DeviceBuffer<T> to_dev(const std::vector<T>& h) {
  DeviceBuffer<T> d(h.size());
  if (!h.empty()) TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
void upload(DeviceBuffer<T>& d, const std::vector<T>& h) {
  TANDEM_CHECK(d.size() >= h.size());
  if (!h.empty()) TANDEM_CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<T> to_host(const DeviceBuffer<T>& d) {
  sync();
  std::vector<T> h(d.size());
  if (!h.empty()) TANDEM_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}
// A device buffer of n elements filled with `byte` (0xff: every float is NaN, every int -1).
template <typename T>
DeviceBuffer<T> poisoned(size_t n, int byte = 0xff) {
  DeviceBuffer<T> d(n);
  if (n) TANDEM_CUDA_CHECK(cudaMemset(d.get(), byte, n * sizeof(T)));
  return d;
}
template <typename T>
void poison(DeviceBuffer<T>& d, int byte = 0xff) {
  if (d.size()) TANDEM_CUDA_CHECK(cudaMemset(d.get(), byte, d.bytes()));
}

// Median microseconds of launch() on kStream over `reps` runs after one warm-up: the op tests'
// model-shape cases double as perf cases (printed as "[cuda perf] ...", never asserted; the
// benchmarks own speed). launch() must be idempotent.
template <typename F>
double median_us(F&& launch, int reps = 20) {
  cudaEvent_t e0, e1;
  TANDEM_CUDA_CHECK(cudaEventCreate(&e0));
  TANDEM_CUDA_CHECK(cudaEventCreate(&e1));
  launch();
  sync();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    TANDEM_CUDA_CHECK(cudaEventRecord(e0, kStream));
    launch();
    TANDEM_CUDA_CHECK(cudaEventRecord(e1, kStream));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.0);
  }
  TANDEM_CUDA_CHECK(cudaEventDestroy(e0));
  TANDEM_CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace tandem::kernels::cuda_testing
