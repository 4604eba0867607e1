// Shared helpers for the CUDA op tests (tests/cuda): GPU presence checks (every test skips with a
// reason when there is no usable GPU), device upload/download, output poisoning (NaN bytes, so an
// unwritten element fails the comparison), seeded random inputs (never all zeros) and comparators
// that check NaN/inf positions, abs+rel tolerance and cosine similarity and report the worst element
// (the style of tests/kernels/kernel_test_util.h, copied here so the two can evolve separately).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/numeric.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/ops.h"

namespace tandem::kernels::cuda_testing {

using cuda::DeviceBuffer;

// Why the CUDA tests cannot run here, or nullptr when they can.
inline const char* no_gpu_reason() {
  static std::string why;
  if (cuda::device_count() == 0) return "no CUDA device visible (the CUDA op tests run on a GPU machine: make test-gpu)";
  if (!cuda::binary_supports_device(0)) {
    why = std::string("this binary has no code for ") + cuda::device_description(0) + " (built for sm_" +
          TANDEM_CUDA_ARCHS + ")";
    return why.c_str();
  }
  return nullptr;
}

#define TANDEM_REQUIRE_GPU()                                                                 \
  do {                                                                                       \
    if (const char* tandem_why_ = ::tandem::kernels::cuda_testing::no_gpu_reason()) {        \
      GTEST_SKIP() << tandem_why_;                                                           \
    }                                                                                        \
  } while (0)

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
// Host poisoning with the same pattern (for the CPU side of outputs that are partly written).
template <typename T>
std::vector<T> poisoned_host(size_t n, int byte = 0xff) {
  std::vector<T> h(n);
  if (n) std::memset(h.data(), byte, n * sizeof(T));
  return h;
}

// ---- random inputs (never all zeros) ----
inline std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.0f, bool bf16 = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = nd(rng);
    if (bf16) x = num::round_bf16(x);
    if (x == 0.0f) x = stddev * 0.5f;
  }
  return v;
}
inline std::vector<float> randu(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ud(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = ud(rng);
  return v;
}
// Fast counter-based random bits for large tensors (the LM head): splitmix64.
inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1) without zeros, rounded to bf16 bits when bf16.
inline float fast_uniform(uint64_t seed, uint64_t i) {
  const uint64_t r = mix64(seed * 0x1000003ull + i);
  float x = static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)) / static_cast<float>(1 << 23);
  if (x == 0.0f) x = 0.5f;
  return x;
}

// ---- comparators ----
// got[i] vs want[i]: |got - want| <= atol + rtol * (scale ? scale[i] : |want|); NaN/inf must sit at the
// same positions (inf with the same sign); cosine similarity over the finite elements >= min_cosine.
inline ::testing::AssertionResult close(const float* got, const float* want, size_t n, double atol, double rtol,
                                        const double* scale = nullptr, double min_cosine = 0.9999) {
  double worst = -1.0;
  size_t wi = 0, nbad = 0;
  double dot = 0, ng = 0, nw = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g))
        return ::testing::AssertionFailure() << "NaN position mismatch at " << i << ": got " << g << " want " << w;
      continue;
    }
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) return ::testing::AssertionFailure() << "inf mismatch at " << i << ": got " << g << " want " << w;
      continue;
    }
    const double err = std::fabs(g - w);
    const double tol = atol + rtol * (scale ? scale[i] : std::fabs(w));
    const double ratio = tol > 0 ? err / tol : (err > 0 ? 1e30 : 0.0);
    if (ratio > worst) {
      worst = ratio;
      wi = i;
    }
    if (err > tol) ++nbad;
    dot += g * w;
    ng += g * g;
    nw += w * w;
  }
  const double cosv = (ng > 0 && nw > 0) ? dot / std::sqrt(ng * nw) : 1.0;
  std::ostringstream os;
  if (worst >= 0)
    os << "worst element " << wi << ": got " << got[wi] << " want " << want[wi] << " (err/tol " << worst
       << "), cosine " << cosv;
  if (nbad > 0) return ::testing::AssertionFailure() << nbad << " of " << n << " elements out of tolerance; " << os.str();
  if (cosv < min_cosine) return ::testing::AssertionFailure() << "cosine too low; " << os.str();
  return ::testing::AssertionSuccess() << os.str();
}
inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, double atol,
                                        double rtol, const std::vector<double>* scale = nullptr,
                                        double min_cosine = 0.9999) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  if (scale && scale->size() != want.size()) return ::testing::AssertionFailure() << "scale size mismatch";
  return close(got.data(), want.data(), got.size(), atol, rtol, scale ? scale->data() : nullptr, min_cosine);
}

// Bit-exact equality (any NaN equals any NaN; -0 != +0).
inline ::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t nbad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (num::f32_bits(got[i]) != num::f32_bits(want[i])) {
      if (nbad++ == 0) first = i;
    }
  }
  if (nbad)
    return ::testing::AssertionFailure() << nbad << " of " << got.size() << " elements differ; first at " << first
                                         << ": got " << got[first] << " want " << want[first];
  return ::testing::AssertionSuccess();
}
template <typename T>
::testing::AssertionResult same_values(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  size_t nbad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && nbad++ == 0) first = i;
  if (nbad)
    return ::testing::AssertionFailure() << nbad << " of " << got.size() << " elements differ; first at " << first
                                         << ": got " << +got[first] << " want " << +want[first];
  return ::testing::AssertionSuccess();
}

}  // namespace tandem::kernels::cuda_testing
