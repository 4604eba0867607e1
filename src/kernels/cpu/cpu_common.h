// Helpers shared by the CPU op implementations: leading-dimension defaults, per-thread scratch
// (grown once, then reused: no allocation on the warm path) and small math routines.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/check.h"
#include "common/numeric.h"

namespace tandem::kernels::cpu {

inline int64_t ld_or(int64_t ld, int64_t dflt) { return ld > 0 ? ld : dflt; }

// Per-thread scratch buffer of at least n floats; grows monotonically.
inline float* thread_scratch(size_t n, int slot = 0) {
  thread_local std::vector<float> buf[4];
  std::vector<float>& b = buf[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// Threads to use for a loop of `work` units where each unit costs about `unit_cost` flops.
inline int threads_for(int64_t work, double unit_cost) {
  int t = omp_get_max_threads();
  double total = static_cast<double>(work) * unit_cost;
  if (total < 2e5) return 1;
  if (work < t) t = static_cast<int>(work > 0 ? work : 1);
  return t;
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace tandem::kernels::cpu
