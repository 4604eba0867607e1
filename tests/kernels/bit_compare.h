// Bit-level comparators, shared by the CPU op tests and the CUDA tests: exact equality (floats bit
// for bit, integers, bytes of encoded records), "correctly rounded" for values with a defined
// rounding (bf16, e4m3, e2m1: representable in the stored type and within half an ulp of a
// higher-precision reference, widened only by a stated fp32 error of the arithmetic before the
// rounding), and `within` for fp32 values with a stated error bound. They take plain host arrays
// and know nothing of the code under test. Every failure names the first offending element (index,
// got, want, error in ulps), the worst one and the count.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/numeric_core.h"

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

// ---- stated error bounds of fp32 arithmetic (for `within` and correctly_rounded's abs_slack) ----
// u = 2^-24, the unit roundoff of fp32. A sum (or FMA chain) whose every term passes through at most
// d roundings is within gamma(d) * sum |terms| of the exact sum (Higham, Accuracy and Stability of
// Numerical Algorithms, 2nd ed., 3.1); tests state the depths of the code under test's trees.
constexpr double kU = 1.0 / 16777216.0;
inline double gamma_n(double d) { return d * kU / (1.0 - d * kU); }
// Relative error of one fp32 expf (CUDA's expf: 2 ulp; glibc's: < 1 ulp): 2 ulp of 2^-23 each.
constexpr double kExpRel = 4.0 * kU;

// Exponent of the lowest set bit of a nonzero finite double.
inline int lsb_exp(double v) {
  uint64_t b;
  std::memcpy(&b, &v, 8);
  const int be = static_cast<int>((b >> 52) & 0x7ff);
  uint64_t m = b & ((uint64_t{1} << 52) - 1);
  if (be) m |= uint64_t{1} << 52;
  return (be ? be : 1) - 1075 + __builtin_ctzll(m);
}

// Bound of an fp32 sum of n terms (each exact in double: products of few-bit values) through a
// summation tree in which a term passes at most `depth` roundings: 0 when every partial sum in any
// order is an fp32 value (all terms are multiples of 2^L and sum |terms| < 2^(L+24)), so the kernel
// and the CPU get the exact sum whatever their orders; else gamma(depth) * sum |terms|.
inline double sum_bound(const double* terms, int64_t n, double depth) {
  int lo = 1 << 20;
  double a = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (terms[i] == 0) continue;
    lo = std::min(lo, lsb_exp(terms[i]));
    a += std::fabs(terms[i]);
  }
  if (a == 0 || a < std::ldexp(1.0, lo + 24)) return 0.0;
  return gamma_n(depth) * a;
}

// The smallest and the largest bf16 value an fp32 result within [lo, hi] can round to (round to
// nearest even is monotone): equal, or neighbours when the interval straddles a rounding midpoint.
inline std::pair<float, float> bf16_range(double lo, double hi) {
  float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);
  if (static_cast<double>(flo) < lo) flo = std::nextafter(flo, INFINITY);
  if (static_cast<double>(fhi) > hi) fhi = std::nextafter(fhi, -INFINITY);
  if (flo > fhi) flo = fhi = static_cast<float>(0.5 * (lo + hi));
  return {num::round_bf16(flo), num::round_bf16(fhi)};
}
// got is a bf16 value within half a bf16 ulp of y, plus `slack` (the fp32 error before the rounding).
inline bool bf16_near(float got, double y, double slack) {
  if (!representable(got, Stored::kBf16)) return false;
  return std::fabs(static_cast<double>(got) - y) <= 0.5 * ulp_of(y, Stored::kBf16) + slack;
}

// Distance of two floats in fp32 ulps (steps of the ordered bit patterns; +0 and -0 are 0 apart).
inline double f32_ulps(float a, float b) {
  auto ordered = [](float x) {
    int32_t i;
    std::memcpy(&i, &x, 4);
    return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
  };
  return static_cast<double>(std::llabs(ordered(a) - ordered(b)));
}

// got[i] == want[i] bit for bit (any NaN matches any NaN; -0 != +0). Reports the first and the
// worst element with their distance in fp32 ulps.
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
    const double d = std::isnan(got[i]) || std::isnan(want[i]) ? INFINITY : f32_ulps(got[i], want[i]);
    if (!(d <= worst)) {
      worst = d;
      worst_i = i;
    }
  }
  if (nbad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << nbad << " of " << n << " elements differ; first at " << first << " (got "
                                       << got[first] << " want " << want[first] << ", "
                                       << f32_ulps(got[first], want[first]) << " ulps); worst at " << worst_i
                                       << " (got " << got[worst_i] << " want " << want[worst_i] << ", " << worst
                                       << " ulps)";
}
inline ::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size mismatch: " << got.size() << " vs " << want.size();
  return bits_equal(got.data(), want.data(), got.size());
}

// Integer (or byte) arrays equal element for element; reports the count and the first difference.
// record > 0 names the first difference as (record, offset) for arrays of fixed-size records.
template <typename T>
::testing::AssertionResult same_values(const std::vector<T>& got, const std::vector<T>& want, size_t record = 0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size mismatch: " << got.size() << " vs " << want.size();
  size_t nbad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && nbad++ == 0) first = i;
  if (nbad == 0) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure();
  r << nbad << " of " << got.size() << " elements differ; first at " << first;
  if (record > 0) r << " (record " << first / record << ", offset " << first % record << ")";
  return r << ": got " << +got[first] << " want " << +want[first];
}

// |got[i] - want[i]| <= bound[i] for fp32 results of arithmetic without a defined final rounding
// (want: a float64 reference; bound: a stated error bound of the code's fp32 arithmetic); NaN/inf
// positions must match. Reports the first violation and the largest error relative to its bound.
inline ::testing::AssertionResult within(const float* got, const double* want, const double* bound, size_t n) {
  size_t nbad = 0, first = n, worst_i = 0;
  double worst = -1;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(g) || std::isnan(w)) {
      if (std::isnan(g) != std::isnan(w))
        return ::testing::AssertionFailure() << "NaN position mismatch at " << i << ": got " << g << " want " << w;
      continue;
    }
    if (std::isinf(g) || std::isinf(w)) {
      if (g != w) return ::testing::AssertionFailure() << "inf mismatch at " << i << ": got " << g << " want " << w;
      continue;
    }
    const double err = std::fabs(g - w);
    const double r = bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0.0);
    if (r > worst) {
      worst = r;
      worst_i = i;
    }
    if (err > bound[i] && nbad++ == 0) first = i;
  }
  std::ostringstream os;
  os << "worst " << worst_i << ": got " << got[worst_i] << " want " << want[worst_i] << " (err/bound " << worst
     << ", " << f32_ulps(got[worst_i], static_cast<float>(want[worst_i])) << " ulps)";
  if (nbad == 0) return ::testing::AssertionSuccess() << os.str();
  return ::testing::AssertionFailure() << nbad << " of " << n << " elements beyond their bound; first " << first
                                       << ": got " << got[first] << " want " << want[first] << " err "
                                       << std::fabs(got[first] - want[first]) << " bound " << bound[first] << " ("
                                       << f32_ulps(got[first], static_cast<float>(want[first])) << " ulps); "
                                       << os.str();
}
inline ::testing::AssertionResult within(const std::vector<float>& got, const std::vector<double>& want,
                                         const std::vector<double>& bound) {
  if (got.size() != want.size() || bound.size() != want.size())
    return ::testing::AssertionFailure() << "size mismatch: " << got.size() << " / " << want.size() << " / "
                                         << bound.size();
  return within(got.data(), want.data(), bound.data(), got.size());
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
  size_t nbad = 0, nrep = 0, worst_i = 0, first_off = n;
  double worst = -1, first_err = 0, first_tol = 0;
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
    if (err_ulps > tol_ulps && nbad++ == 0) {
      first_off = i;
      first_err = err_ulps;
      first_tol = tol_ulps;
    }
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
                                         << " allowed); first " << first_off << ": got " << got[first_off] << " want "
                                         << want[first_off] << " (" << first_err << " ulps of the stored type, limit "
                                         << first_tol << "); worst " << os.str() << " (" << worst
                                         << " ulp past the limit)";
  return ::testing::AssertionSuccess() << nbad << " of " << n << " elements more than half an ulp off";
}

inline ::testing::AssertionResult correctly_rounded(const std::vector<float>& got, const std::vector<double>& want,
                                                    Stored t, double slack_ulps = 0.0,
                                                    const std::vector<double>* abs_slack = nullptr) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  return correctly_rounded(got.data(), want.data(), got.size(), t, slack_ulps, abs_slack ? abs_slack->data() : nullptr);
}

}  // namespace tandem::kernels::testing
