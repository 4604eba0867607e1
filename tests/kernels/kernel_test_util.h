// The one test harness of the kernel tests, shared by the CPU op tests (tests/kernels) and the CUDA
// tests (tests/cuda, which add the device side in cuda_test_util.h): seeded random inputs (never
// zeros), poisoned outputs, and the tolerance comparator for fp32 results without a defined
// rounding. The bit-level comparators are in bit_compare.h.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/numeric.h"
#include "kernels/ops.h"

namespace tandem::kernels::testing {

// Normal(0, stddev) values, rounded to bf16 when asked; an exact zero (never drawn in practice)
// becomes stddev / 2, so no input is zero.
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

// Counter-based random bits for large tensors and index lists: splitmix64.
inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1) without zeros.
inline float fast_uniform(uint64_t seed, uint64_t i) {
  const uint64_t r = mix64(seed * 0x1000003ull + i);
  float x = static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)) / static_cast<float>(1 << 23);
  if (x == 0.0f) x = 0.5f;
  return x;
}

// n values k / denom with k a nonzero integer in [-kmax, kmax]: few-bit inputs whose dot products
// are exact in fp32 in any summation order (sum_bound checks it), so sums the code under test and
// the CPU order differently still agree bit for bit.
inline std::vector<float> grid_values(size_t n, uint64_t seed, int kmax, float denom) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    int k = static_cast<int>(mix64(seed * 1000003 + i) % (2 * kmax + 1)) - kmax;
    if (k == 0) k = 1;
    v[i] = static_cast<float>(k) / denom;
  }
  return v;
}

// n elements filled with `byte` (0xff: every float is NaN, every int -1): an output element the
// code under test forgets to write fails the comparison.
template <typename T>
std::vector<T> poisoned_host(size_t n, int byte = 0xff) {
  std::vector<T> h(n);
  if (n) std::memset(h.data(), byte, n * sizeof(T));
  return h;
}

// Summation depth of one output of the CPU gemm (kernels/cpu/gemm_tile.inc): L vector lanes (the
// ISA's: 16, 8 or 4) each summing k/L products in order (FMA, or a product and an add), then the
// lanes summed in order and the scalar tail. For bounds of the form gamma(depth) * sum |x w|.
inline double cpu_gemm_depth(int64_t k) {
  const std::string isa = cpu::gemm_isa_name();
  const double lanes = isa == "avx512" ? 16 : isa == "avx2" ? 8 : 4;
  return static_cast<double>(k) / lanes + lanes + 2;
}

inline double bf16d(double x) { return num::round_bf16(static_cast<float>(x)); }

// got[i] vs want[i]: |got - want| <= atol + rtol * (scale ? scale[i] : |want|); NaN/inf must sit at
// the same positions (inf with the same sign); cosine similarity over the finite elements >=
// min_cosine. For fp32 results whose error has no tighter statement; reports the first and the
// worst element.
template <typename W>
::testing::AssertionResult close(const float* got, const W* want, size_t n, double atol, double rtol,
                                 const double* scale = nullptr, double min_cosine = 0.0) {
  double worst = -1.0;
  size_t wi = 0, nbad = 0, first = n;
  double dot = 0, ng = 0, nw = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = static_cast<double>(want[i]);
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
    if (err > tol && nbad++ == 0) first = i;
    dot += g * w;
    ng += g * g;
    nw += w * w;
  }
  const double cosv = (ng > 0 && nw > 0) ? dot / std::sqrt(ng * nw) : 1.0;
  std::ostringstream os;
  if (worst >= 0)
    os << "worst element " << wi << ": got " << got[wi] << " want " << static_cast<double>(want[wi]) << " (err/tol "
       << worst << "), cosine " << cosv;
  if (nbad > 0)
    return ::testing::AssertionFailure() << nbad << " of " << n << " elements out of tolerance; first " << first
                                         << ": got " << got[first] << " want " << static_cast<double>(want[first])
                                         << "; " << os.str();
  if (cosv < min_cosine) return ::testing::AssertionFailure() << "cosine too low; " << os.str();
  return ::testing::AssertionSuccess() << os.str();
}

template <typename W>
::testing::AssertionResult close(const std::vector<float>& got, const std::vector<W>& want, double atol, double rtol,
                                 const std::vector<double>* scale = nullptr, double min_cosine = 0.0) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  if (scale && scale->size() != want.size()) return ::testing::AssertionFailure() << "scale size mismatch";
  return close(got.data(), want.data(), got.size(), atol, rtol, scale ? scale->data() : nullptr, min_cosine);
}

}  // namespace tandem::kernels::testing
