// The error bounds of the tensor-core GEMMs (kernels/cuda/gemm_tc.h) and their check against a
// float64 reference, shared by the GEMM and grouped-expert tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/numeric.h"

namespace tandem::kernels::cuda_testing {

// Block-scaled FP8: |y - y64| <= (2^-10 + gamma_{K/128+1}) * S, S = sum |x_i w_i| (see gemm_tc.h).
inline double fp8_tc_bound(int64_t k, double S) {
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(k / 128 + 1);
  return (std::ldexp(1.0, -10) + n * u / (1 - n * u)) * S;
}

// bf16 x bf16 -> fp32 on the tensor cores: each k16 step aligned to its largest term and truncated
// to 24 bits (at most 2^-19 of the step's sum of |products| for 16 terms) plus the accumulator's
// truncation per step (2^-23 of the running |sum| <= S): |y - y64| <= (k/16 * (2^-19 + 2^-23) + 2^-23) * S
// (+ the fp32 add of an accumulated y0: gamma_1 of its magnitude, inside S).
inline double bf16_tc_bound(int64_t k, double S) {
  const double steps = static_cast<double>((k + 15) / 16);
  return (steps * (std::ldexp(1.0, -19) + std::ldexp(1.0, -23)) + std::ldexp(1.0, -22)) * S;
}

// Round to nearest even at bf16 precision (8 significant bits) from a double, exactly (no double
// rounding through fp32): the bf16 value a kernel's rounding of the real number x gives.
inline double bf16_rne(double x) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);                               // x = f * 2^e, 0.5 <= |f| < 1
  const double t = std::ldexp(x, 8 - e);           // 128 <= |t| < 256: 8 significant bits above the point
  return std::ldexp(std::nearbyint(t), e - 8);     // nearbyint: ties to even (default rounding mode)
}

// Before rounding: |got - y64| <= B. Rounded to bf16: got is a bf16 value that rounding some y with
// |y - y64| <= B gives, i.e. (rounding is monotone) bf16(y64 - B) <= got <= bf16(y64 + B); when B
// is below half a bf16 step that is round(y64) or, near a midpoint, its neighbour.
inline ::testing::AssertionResult within_bound(const std::vector<float>& got, const std::vector<double>& y64,
                                               const std::vector<double>& B, bool rounded, double* worst_ratio) {
  size_t bad = 0, first = got.size();
  *worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = y64[i];
    const double err = std::fabs(g - w);
    *worst_ratio = std::max(*worst_ratio, B[i] > 0 ? err / B[i] : (err > 0 ? 1e30 : 0.0));
    bool ok;
    if (!rounded) {
      ok = err <= B[i];
    } else {
      ok = got[i] == num::round_bf16(got[i]) && bf16_rne(w - B[i]) <= g && g <= bf16_rne(w + B[i]);
    }
    if (!ok) {
      if (first == got.size()) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " outside the bound; first at " << first
                                       << ": got " << got[first] << " y64 " << y64[first] << " bound " << B[first]
                                       << (rounded ? " (bf16 candidates " : "")
                                       << (rounded ? std::to_string(bf16_rne(y64[first] - B[first])) : std::string())
                                       << (rounded ? " .. " : "")
                                       << (rounded ? std::to_string(bf16_rne(y64[first] + B[first])) + ")" : std::string());
}

}  // namespace tandem::kernels::cuda_testing
