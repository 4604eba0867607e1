// Shared helpers for the kernel tests: seeded random inputs (never all zeros) and a comparator that
// checks NaN/inf positions, abs+rel tolerance and cosine similarity, reporting the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/numeric.h"

namespace tandem::kernels::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float stddev = 1.0f, bool bf16 = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = nd(rng);
    if (bf16) x = num::round_bf16(x);
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

// got[i] vs want[i]: |got - want| <= atol + rtol * |want| (or <= atol + rtol * scale[i] when a
// per-element magnitude is given); NaN/inf must sit at the same positions with the same sign.
inline ::testing::AssertionResult close(const float* got, const double* want, size_t n, double atol, double rtol,
                                        const double* scale = nullptr, double min_cosine = 0.0) {
  double worst = -1.0;
  size_t wi = 0;
  size_t nbad = 0;
  double dot = 0, ng = 0, nw = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) {
        return ::testing::AssertionFailure() << "NaN position mismatch at " << i << ": got " << g << " want " << w;
      }
      continue;
    }
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) return ::testing::AssertionFailure() << "inf mismatch at " << i << ": got " << g << " want " << w;
      continue;
    }
    const double err = std::fabs(g - w);
    const double tol = atol + rtol * (scale ? scale[i] : std::fabs(w));
    const double ratio = err / tol;
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

inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<double>& want, double atol,
                                        double rtol, const std::vector<double>* scale = nullptr) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  return close(got.data(), want.data(), got.size(), atol, rtol, scale ? scale->data() : nullptr);
}

inline double bf16d(double x) { return num::round_bf16(static_cast<float>(x)); }

}  // namespace tandem::kernels::testing
