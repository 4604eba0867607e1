// Bit-level comparators for ops whose reference defines a rounding (bf16, e4m3, e2m1): exact
// equality, and "correctly rounded" (the stored value is representable in its type and lies within
// half an ulp of a higher-precision reference). They take plain host arrays and know nothing of the
// op under test, so the same checks serve the CPU ops now and the CUDA ops (copied back) later.
// Every failure names the worst element, its error in ulps of the stored type, and the count.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <vector>

namespace tandem::kernels::testing {

enum class Stored { kBf16, kE4m3, kE2m1 };

// Significand bits after the leading one and the smallest normal exponent of each stored type.
struct StoredFormat {
  int mant_bits;
  int min_exp;
};
inline StoredFormat format_of(Stored t) {
  switch (t) {
    case Stored::kBf16: return {7, -126};
    case Stored::kE4m3: return {3, -6};
    case Stored::kE2m1: return {1, 0};
  }
  return {7, -126};
}

// Spacing of the stored type's values around |x| (x in the type's normal or subnormal range, before
// any block scale; pass x / scale for scaled types).
inline double ulp_of(double x, Stored t) {
  const StoredFormat f = format_of(t);
  const double a = std::fabs(x);
  int e = a > 0 ? std::ilogb(a) : f.min_exp;
  if (e < f.min_exp) e = f.min_exp;
  return std::ldexp(1.0, e - f.mant_bits);
}

// True when x has no significand bits beyond the stored type's (range is not checked).
inline bool representable(double x, Stored t) {
  if (!std::isfinite(x) || x == 0) return true;
  const double u = ulp_of(x, t);
  return std::nearbyint(x / u) * u == x;
}

inline bool same_special(double g, double w, std::string* why) {
  if (std::isnan(w) != std::isnan(g)) {
    *why = "NaN position mismatch";
    return false;
  }
  if ((std::isinf(w) || std::isinf(g)) && g != w) {
    *why = "inf mismatch";
    return false;
  }
  return true;
}

// got[i] == want[i] bit for bit (any NaN matches any NaN). Reports the first and the worst element.
inline ::testing::AssertionResult bits_equal(const float* got, const float* want, size_t n) {
  size_t nbad = 0, worst_i = 0, first = n;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a == b) continue;
    if (first == n) first = i;
    ++nbad;
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!(d <= worst)) {
      worst = d;
      worst_i = i;
    }
  }
  if (nbad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << nbad << " of " << n << " elements differ; first at " << first << " (got "
                                       << got[first] << " want " << want[first] << "); worst at " << worst_i << " (got "
                                       << got[worst_i] << " want " << want[worst_i] << ")";
}

// Each got[i] (optionally divided by scale[i], the block scale of a quantized type) is representable
// in `t` and within (0.5 + slack_ulps) ulp of want[i] (an exact or float64 reference of the value
// before the rounding). `abs_slack[i]` (optional) widens element i by an absolute amount: the fp32
// error of the op's own arithmetic before its rounding, where it can straddle a rounding midpoint.
// A dropped rounding fails `representable`; truncation, the wrong tie rule or a rounding at another
// step puts elements near a whole ulp away. `allowed_off` elements may be more than half an ulp off
// (never unrepresentable): for ops with inner roundings (bf16 probabilities) where an fp32 value that
// straddles an inner midpoint moves the output by a fraction of an ulp (rare: ~2^-15 per inner value).
inline ::testing::AssertionResult correctly_rounded(const float* got, const double* want, size_t n, Stored t,
                                                    double slack_ulps = 0.0, const double* abs_slack = nullptr,
                                                    const double* scale = nullptr, size_t allowed_off = 0) {
  size_t nbad = 0, nrep = 0, worst_i = 0;
  double worst = -1;
  for (size_t i = 0; i < n; ++i) {
    std::string why;
    if (!same_special(got[i], want[i], &why))
      return ::testing::AssertionFailure() << why << " at " << i << ": got " << got[i] << " want " << want[i];
    if (!std::isfinite(want[i])) continue;
    const double s = scale ? scale[i] : 1.0;
    const double g = got[i] / s, w = want[i] / s;
    if (!representable(g, t)) {
      if (nrep == 0) worst_i = i;
      ++nrep;
      continue;
    }
    const double u = ulp_of(w, t);
    const double err_ulps = std::fabs(g - w) / u;
    const double tol_ulps = 0.5 + slack_ulps + (abs_slack ? abs_slack[i] / s / u : 0.0);
    if (err_ulps > tol_ulps) ++nbad;
    if (nrep == 0 && err_ulps - tol_ulps > worst) {
      worst = err_ulps - tol_ulps;
      worst_i = i;
    }
  }
  std::ostringstream os;
  os << "element " << worst_i << ": got " << got[worst_i] << " want " << want[worst_i];
  if (nrep > 0)
    return ::testing::AssertionFailure() << nrep << " of " << n << " elements not representable in the stored type; "
                                         << "first " << os.str();
  if (nbad > allowed_off)
    return ::testing::AssertionFailure() << nbad << " of " << n << " elements more than half an ulp off (" << allowed_off
                                         << " allowed); worst "
                                         << os.str() << " (" << worst << " ulp past the limit)";
  return ::testing::AssertionSuccess() << nbad << " of " << n << " elements more than half an ulp off";
}

inline ::testing::AssertionResult correctly_rounded(const std::vector<float>& got, const std::vector<double>& want,
                                                    Stored t, double slack_ulps = 0.0,
                                                    const std::vector<double>* abs_slack = nullptr) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  return correctly_rounded(got.data(), want.data(), got.size(), t, slack_ulps, abs_slack ? abs_slack->data() : nullptr);
}

}  // namespace tandem::kernels::testing
