// Order statistics of the serving benchmark.
#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::loadgen {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

nlohmann::json spread(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  const double med = median(v);
  const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  nlohmann::json j = {{"n", v.size()}, {"median", med}, {"min", *mn}, {"max", *mx}};
  j["spread_pct"] = med > 0 ? (*mx - *mn) / med * 100.0 : 0.0;
  return j;
}

nlohmann::json distribution(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  return {{"n", v.size()},      {"median", quantile(v, 0.5)}, {"p90", quantile(v, 0.9)},
          {"p99", quantile(v, 0.99)}, {"min", *mn},                {"max", *mx}};
}

}  // namespace tandem::loadgen
