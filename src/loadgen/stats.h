// Order statistics for the benchmark's summaries (median, percentiles, spread over repeats).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::loadgen {

// Linear interpolation between closest ranks; q in [0, 1]. NaN for an empty sample.
double quantile(std::vector<double> v, double q);
inline double median(const std::vector<double>& v) { return quantile(v, 0.5); }

// {"n", "median", "min", "max", "spread_pct" = (max - min) / median * 100} or null when empty.
nlohmann::json spread(const std::vector<double>& v);
// {"n", "median", "p90", "p99", "min", "max"} or null when empty.
nlohmann::json distribution(const std::vector<double>& v);

}  // namespace tandem::loadgen
