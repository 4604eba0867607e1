// The error bound of the block-scaled FP8 tensor-core GEMMs (kernels/cuda/gemm_tc.h) and its check
// against a float64 reference, shared by the GEMM and grouped-expert tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/numeric.h"

namespace tandem::kernels::cuda_testing {

// |y - y64| <= (2^-10 + gamma_{K/128+1}) * S, S = sum |x_i w_i| (see gemm_tc.h).
inline double fp8_tc_bound(int64_t k, double S) {
  const double u = std::ldexp(1.0, -24), n = static_cast<double>(k / 128 + 1);
  return (std::ldexp(1.0, -10) + n * u / (1 - n * u)) * S;
}

// |got - y64| <= B before rounding; rounded: got == bf16(y64), or its neighbour when y64 lies within B
// of the midpoint between them.
inline ::testing::AssertionResult within_bound(const std::vector<float>& got, const std::vector<double>& y64,
                                        const std::vector<double>& B, bool rounded, double* worst_ratio) {
  size_t bad = 0, first = got.size();
  *worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = y64[i];
    bool ok;
    if (!rounded) {
      const double err = std::fabs(g - w);
      *worst_ratio = std::max(*worst_ratio, B[i] > 0 ? err / B[i] : (err > 0 ? 1e30 : 0.0));
      ok = err <= B[i];
    } else {
      const float want = num::round_bf16(static_cast<float>(w));
      ok = g == want;
      if (!ok) {
        // The other candidate must be adjacent and y64 within B of the midpoint between them.
        const double mid = 0.5 * (static_cast<double>(want) + g);
        const double ulp = std::ldexp(1.0, std::ilogb(std::fabs(want) > 0 ? want : 1e-30) - 7);
        ok = std::fabs(g - want) <= ulp * 1.0000001 && std::fabs(w - mid) <= B[i] &&
             g == num::round_bf16(static_cast<float>(g));
      }
    }
    if (!ok) {
      if (first == got.size()) first = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " outside the bound; first at " << first
                                       << ": got " << got[first] << " y64 " << y64[first] << " bound " << B[first];
}

}  // namespace tandem::kernels::cuda_testing
