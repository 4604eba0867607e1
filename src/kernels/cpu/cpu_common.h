// Helpers shared by the CPU op implementations: leading-dimension defaults, per-thread scratch
// (grown once, then reused: no allocation on the warm path) and small math routines.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>

#include "common/check.h"
#include "common/numeric.h"

namespace tandem::kernels::cpu {

inline int64_t ld_or(int64_t ld, int64_t dflt) { return ld > 0 ? ld : dflt; }

// Per-thread scratch buffer of at least n floats; grows monotonically.
inline float* thread_scratch(size_t n, int slot = 0) {
  // Slots: 0 gemm panels (every thread), 1 an op's own buffers, 2 hc mixes, 3 per-head temporaries,
  // 4 gemm's quantized copy of x (calling thread).
  thread_local std::vector<float> buf[5];
  std::vector<float>& b = buf[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// Threads to use for a loop of `work` units where each unit costs about `unit_cost` flops.
// Process-wide thread count for CPU ops (cpu::set_num_threads; 0 = OpenMP default). Every parallel
// region in the CPU ops passes num_threads(threads_for(...)), so the setting applies whichever
// thread calls the op (omp_set_num_threads alone would only affect the calling thread).
int configured_threads();

inline int threads_for(int64_t work, double unit_cost) {
  if (omp_in_parallel()) return 1;  // called from inside another op's parallel loop: stay serial
  int t = configured_threads();
  double total = static_cast<double>(work) * unit_cost;
  if (total < 5e5) return 1;  // a parallel region costs more than this on a busy machine
  if (work < t) t = static_cast<int>(work > 0 ? work : 1);
  return t;
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// 16-lane vectors (GCC vector extensions; lowered to whatever the translation unit's ISA has).
// Only used inside always-inline helpers, so the vector ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float vf16 __attribute__((vector_size(64)));
typedef uint32_t vu16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

__attribute__((always_inline)) inline vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline void store16(float* p, const vf16& v) { std::memcpy(p, &v, sizeof v); }

// Lane-wise num::round_bf16 (round to nearest even, NaN kept quiet), branch-free.
__attribute__((always_inline)) inline vf16 round_bf16_v(const vf16& x) {
  const vu16 u = (vu16)x;
  const vu16 r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const vu16 q = (u | 0x00400000u) & 0xffff0000u;
  const vu16 nan = (vu16)((u & 0x7fffffffu) > 0x7f800000u);
  return (vf16)((q & nan) | (r & ~nan));
}

}  // namespace tandem::kernels::cpu
